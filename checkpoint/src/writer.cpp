// The three stages of a save (save_stages.hpp) and save_checkpoint, which
// runs them in a row on the calling thread.
//
//  1. begin_save: arguments are the same on every rank (step), the optimizer
//     matches the model; rank 0 creates <save_dir>/.tmp-step-N (removing a
//     leftover). Agreed (kshard/mesh/agree.hpp).
//  2. write_local_file: writers (under HSDP: the ranks of replica 0 only, so
//     no byte is written twice) write shard-<rank>.bin, fsync it and
//     describe its pieces.
//  3. finish_save: the outcome of 2 is agreed; the descriptions go to rank
//     0, which writes manifest.json, fsyncs it and the directory, renames
//     .tmp-step-N to step-N, fsyncs the save directory and prunes old
//     checkpoints. Agreed.
// A failure in 2 or 3 removes the temporary directory (best effort); a rank
// that dies leaves it behind, never a step-N directory.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "kshard/mesh/agree.hpp"
#include "file_io.hpp"
#include "kshard/checkpoint/checkpoint.hpp"
#include "kshard/checkpoint/manifest.hpp"
#include "model_state.hpp"
#include "save_dir.hpp"
#include "save_stages.hpp"

namespace kshard {
namespace fs = std::filesystem;
using nlohmann::json;

namespace detail {
namespace {

using Clock = std::chrono::steady_clock;

double since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

/// KSHARD_CHECKPOINT_TEST_FAULT (see TestFault) for this rank and step.
TestFault injected_fault(int rank, std::int64_t step) {
  const char* s = std::getenv("KSHARD_CHECKPOINT_TEST_FAULT");
  if (!s) return TestFault::none;
  const std::string v = s;
  const auto a = v.find(':'), b = v.find(':', a == std::string::npos ? a : a + 1);
  if (a == std::string::npos || b == std::string::npos) return TestFault::none;
  if (std::atoi(v.substr(a + 1, b - a - 1).c_str()) != rank ||
      std::atoll(v.substr(b + 1).c_str()) != step)
    return TestFault::none;
  const std::string kind = v.substr(0, a);
  return kind == "exit"     ? TestFault::exit
         : kind == "enospc" ? TestFault::enospc
         : kind == "slow"   ? TestFault::slow
                            : TestFault::none;
}

std::string file_name(int rank) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "shard-%05d.bin", rank);
  return buf;
}

std::vector<Planned> plan(FsdpModel& model, bool with_optimizer, DType moment_dtype) {
  std::vector<Planned> out;
  std::int64_t offset = 0;
  const int kinds = with_optimizer ? 3 : 1;
  for (std::size_t u = 0; u < model.num_units(); ++u) {
    const ShardedGroup& g = model.group(u);
    const ParamIndex& idx = g.index();
    const std::int64_t first = idx.shard_range(g.shard_rank()).first;
    for (int k = 0; k < kinds; ++k) {
      const std::int64_t es = std::int64_t(dtype_size(k == 0 ? DType::f32 : moment_dtype));
      for (std::size_t i = 0; i < idx.size(); ++i)
        for (const auto& pc : idx.pieces_in_shard(i, g.shard_rank())) {
          Planned p;
          p.unit = u;
          p.param = i;
          p.kind = k;
          p.start = pc.param_begin;
          p.count = pc.count;
          p.shard_elem = pc.flat_begin - first;
          p.offset = offset;
          p.bytes = pc.count * es;
          offset += p.bytes;
          out.push_back(p);
        }
    }
  }
  return out;
}

/// Rank 0, stage 1: the manifest without files and pieces, as of now (the
/// optimizer's step count and the user state are those of the snapshot).
Manifest manifest_head(std::int64_t step, FsdpModel& model, const FusedAdam* opt,
                       const json& user_state, const SaveOptions& o) {
  Manifest m;
  m.step = step;
  m.recipe = model.recipe().describe();
  m.mesh = model.mesh().shape();
  m.mesh_dims = model.mesh().dim_names();
  m.world_size = model.mesh().world().size();
  m.crc_block_bytes = o.crc_block_bytes;
  m.has_optimizer = opt != nullptr;
  m.optimizer_step = opt ? opt->step_count() : 0;
  m.moment_dtype = opt ? opt->options().moment_dtype : DType::f32;
  m.user_state = user_state;
  m.fp8_state = model.fp8_state();
  const int kinds = opt ? 3 : 1;
  for (std::size_t u = 0; u < model.num_units(); ++u) {
    const ShardedGroup& g = model.group(u);
    SavedUnit su;
    su.name = g.name();
    su.kind = model.layer_kind(u);
    for (const auto& e : g.index().entries()) {
      SavedParam sp;
      sp.name = e.name;
      sp.shape = e.shape;
      sp.numel = e.numel;
      for (int k = 0; k < kinds; ++k)
        sp.tensors.push_back(SavedTensor{kTensorKinds[k], k == 0 ? DType::f32 : m.moment_dtype, {}});
      su.params.push_back(std::move(sp));
    }
    m.units.push_back(std::move(su));
  }
  return m;
}

/// Rank 0, stage 3: the manifest head completed with every writer's description.
Manifest build_manifest(Manifest m, const std::vector<json>& descs) {
  for (const json& d : descs) {
    if (d.is_null()) continue;  // not a writer
    const int file = int(m.files.size());
    m.files.push_back(SavedFile{d.at("name").get<std::string>(), d.at("bytes").get<std::int64_t>()});
    for (const json& p : d.at("pieces")) {
      SavedPiece pc;
      pc.start = p.at(3).get<std::int64_t>();
      pc.count = p.at(4).get<std::int64_t>();
      pc.file = file;
      pc.offset = p.at(5).get<std::int64_t>();
      pc.crc32 = p.at(6).get<std::vector<std::uint32_t>>();
      m.units.at(p.at(0).get<std::size_t>())
          .params.at(p.at(1).get<std::size_t>())
          .tensors.at(p.at(2).get<std::size_t>())
          .pieces.push_back(std::move(pc));
    }
  }
  for (auto& u : m.units)
    for (auto& p : u.params)
      for (auto& t : p.tensors)
        std::sort(t.pieces.begin(), t.pieces.end(),
                  [](const SavedPiece& a, const SavedPiece& b) { return a.start < b.start; });
  return m;
}

/// Every rank's description (JSON text) to rank 0.
std::vector<json> gather_descriptions(const Communicator& comm, const json& mine) {
  const std::vector<std::string> texts =
      host_gather(comm, mine.is_null() ? std::string() : mine.dump(), 0);
  std::vector<json> out;
  for (const std::string& t : texts) out.push_back(t.empty() ? json() : json::parse(t));
  return out;
}

/// Rank 0, stage 3: manifest, fsyncs, rename, prune.
void commit(const SaveJob& job, const Manifest& m) {
  const SaveOptions& o = job.options;
  const json j = m.to_json();
  // Self-check: what load will accept (coverage, offsets, checksum counts).
  Manifest::from_json(j, (job.tmp / "manifest.json").string());
  write_text_file(job.tmp / "manifest.json", j.dump(1), o.fsync);
  if (o.fsync) fsync_directory(job.tmp);
  std::error_code ec;
  const fs::path old = job.save_dir / (".old-" + job.final_path.filename().string());
  if (fs::exists(job.final_path, ec)) {
    // Re-saving a step: move the old one aside first (rename cannot replace a
    // non-empty directory); for that moment only the older steps are complete.
    fs::remove_all(old, ec);
    fs::rename(job.final_path, old);
  }
  fs::rename(job.tmp, job.final_path);
  if (o.fsync) fsync_directory(job.save_dir);
  prune(job.save_dir, o.keep_last);
}

/// agree_ok(), removing the temporary directory (rank 0) when some rank failed.
void agree_or_clean_up(const SaveJob& job, const std::optional<Error>& err) {
  try {
    agree_ok(job.world, err);
  } catch (...) {
    std::error_code ec;
    if (job.rank == 0) fs::remove_all(job.tmp, ec);
    throw;
  }
}

}  // namespace

bool writes_data(const DeviceMesh& mesh) { return mesh.ndim() == 1 || mesh.coord(0) == 0; }

SaveJob begin_save(const fs::path& save_dir, std::int64_t step, FsdpModel& model,
                   const FusedAdam* opt, const json& user_state, const SaveOptions& o) {
  const DeviceMesh& mesh = model.mesh();
  SaveJob job;
  job.world = mesh.world();
  job.rank = job.world.rank();
  job.writer = writes_data(mesh);
  job.save_dir = save_dir;
  job.step = step;
  job.options = o;
  job.with_optimizer = opt != nullptr;
  job.final_path = checkpoint_path(save_dir, step);
  job.tmp = temporary_path(save_dir, step);
  job.fault = injected_fault(job.rank, step);

  const std::string differs = disagreement(job.world, {{"the step to save", step}});
  run_agreed(job.world, [&] {
    if (!differs.empty())
      throw Error("save_checkpoint: ranks disagree on " + differs, "the same step on every rank");
    if (step < 0) throw Error("save_checkpoint of step " + std::to_string(step), "a step >= 0");
    if (o.crc_block_bytes < 1 || o.keep_last < 0)
      throw Error("SaveOptions crc_block_bytes " + std::to_string(o.crc_block_bytes) +
                      ", keep_last " + std::to_string(o.keep_last),
                  "crc_block_bytes >= 1 and keep_last >= 0");
    if (opt) check_optimizer_matches(model, *opt);
    if (job.writer)
      job.pieces = plan(model, opt != nullptr, opt ? opt->options().moment_dtype : DType::f32);
    if (job.rank == 0) {
      job.manifest = manifest_head(step, model, opt, user_state, o);
      std::error_code ec;
      fs::create_directories(save_dir, ec);
      if (!fs::is_directory(save_dir))
        throw Error("cannot create the save directory '" + save_dir.string() + "'" +
                        (ec ? ": " + ec.message() : std::string(": a file is in the way")),
                    "a writable directory");
      fs::remove_all(job.tmp);  // a leftover of an interrupted save of this step
      fs::create_directory(job.tmp);
    }
  });
  return job;
}

LocalWrite write_local_file(const SaveJob& job, HostShards& shards) {
  const auto t0 = Clock::now();
  LocalWrite out;
  if (!job.writer) return out;
  const SaveOptions& o = job.options;
  std::int64_t total = 0;
  for (const auto& p : job.pieces) total += p.bytes;

  const std::string name = file_name(job.rank);
  File f = File::create(job.tmp / name);
  json desc_pieces = json::array();
  std::int64_t written = 0;
  bool fault_done = false;
  for (const Planned& p : job.pieces) {
    if (job.fault != TestFault::none && !fault_done && written > 0 && 2 * written >= total) {
      fault_done = true;
      if (job.fault == TestFault::exit) ::_exit(3);
      if (job.fault == TestFault::enospc)
        throw Error("cannot write '" + f.path().string() + "': " + errno_text(ENOSPC) +
                        " (injected by KSHARD_CHECKPOINT_TEST_FAULT) after " +
                        std::to_string(written) + " of " + std::to_string(total) + " bytes",
                    "a writable file system with free space");
      std::this_thread::sleep_for(std::chrono::seconds(1));  // slow
    }
    const std::int64_t es = p.bytes / std::max<std::int64_t>(p.count, 1);
    const char* src = shards.tensor(p.unit, p.kind) + p.shard_elem * es;
    json crcs = json::array();
    for (std::int64_t b = 0; b < p.bytes; b += o.crc_block_bytes)
      crcs.push_back(crc32_of(src + b, std::size_t(std::min(o.crc_block_bytes, p.bytes - b))));
    f.write_all(src, std::size_t(p.bytes));
    written += p.bytes;
    desc_pieces.push_back({p.unit, p.param, p.kind, p.start, p.count, p.offset, std::move(crcs)});
  }
  if (o.fsync) f.sync();
  f.close();
  out.bytes = std::uint64_t(written);
  out.description = json{{"name", name}, {"bytes", written}, {"pieces", std::move(desc_pieces)}};
  out.seconds = since(t0);
  return out;
}

SaveInfo finish_save(const SaveJob& job, const std::optional<Error>& local_error,
                     const LocalWrite& local) {
  agree_or_clean_up(job, local_error);
  const std::vector<json> descs = gather_descriptions(job.world, local.description);
  agree_or_clean_up(job, run_local([&] {
    if (job.rank == 0) commit(job, build_manifest(job.manifest, descs));
  }));
  SaveInfo info;
  info.path = job.final_path;
  info.step = job.step;
  info.bytes_written = local.bytes;
  info.write_seconds = local.seconds;
  std::vector<std::int64_t> total = {std::int64_t(local.bytes)};
  host_all_reduce(job.world, total, ReduceOp::sum);
  info.total_bytes = std::uint64_t(total[0]);
  return info;
}

namespace {

SaveInfo save(const fs::path& save_dir, std::int64_t step, FsdpModel& model, const FusedAdam* opt,
              const json& user_state, const SaveOptions& o) {
  const auto t0 = Clock::now();
  const SaveJob job = begin_save(save_dir, step, model, opt, user_state, o);
  // Stage 2 reads the live shards, one unit's host copies at a time (device
  // builds: bounded host memory; host builds: no copy at all).
  LiveShards live(model, opt);
  LocalWrite local;
  const std::optional<Error> err = run_local([&] {
    Kokkos::fence();  // the optimizer's update kernels may still run
    local = write_local_file(job, live);
  });
  SaveInfo info = finish_save(job, err, local);
  info.seconds = since(t0);
  info.blocked_seconds = info.seconds;
  return info;
}

}  // namespace
}  // namespace detail

SaveInfo save_checkpoint(const fs::path& save_dir, std::int64_t step, FsdpModel& model,
                         const FusedAdam& optimizer, const json& user_state,
                         const SaveOptions& options) {
  return detail::save(save_dir, step, model, &optimizer, user_state, options);
}

SaveInfo save_checkpoint(const fs::path& save_dir, std::int64_t step, FsdpModel& model,
                         const json& user_state, const SaveOptions& options) {
  return detail::save(save_dir, step, model, nullptr, user_state, options);
}

}  // namespace kshard
