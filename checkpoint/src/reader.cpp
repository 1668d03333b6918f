// load_checkpoint: every rank reads the manifest, checks it against its model,
// then reads only the byte ranges its (new) shard owns, verifies them and
// commits. Phases, each agreed by every rank (kshard/mesh/agree.hpp):
//  A. directory, manifest (format, version, model shape), data files present
//     with the sizes the manifest records (every rank checks every file, so a
//     missing or truncated file is found whichever rank would read it);
//  B. reads + crc32 checks into host staging buffers;
//  C. commit: staging -> master / moments (deep_copy), low-precision copies
//     re-derived, step count set. Nothing is changed before C, so a failed
//     load leaves model and optimizer as they were.

#include <chrono>
#include <cstring>
#include <cstdio>
#include <map>
#include <memory>
#include <system_error>

#include "kshard/mesh/agree.hpp"
#include "file_io.hpp"
#include "kshard/checkpoint/checkpoint.hpp"
#include "kshard/checkpoint/manifest.hpp"
#include "kshard/numeric/convert.hpp"
#include "model_state.hpp"
#include "reshard.hpp"
#include "save_dir.hpp"

namespace kshard {
namespace fs = std::filesystem;
using nlohmann::json;

namespace detail {
namespace {

std::string hex(std::uint32_t v) {
  char b[16];
  std::snprintf(b, sizeof b, "0x%08x", v);
  return b;
}

/// Phase A: the checkpoint directory and its manifest.
Manifest open_checkpoint(const fs::path& dir) {
  std::error_code ec;
  const auto st = fs::status(dir, ec);
  if (!fs::exists(st))
    throw Error("checkpoint directory '" + dir.string() + "' does not exist" +
                    (ec && ec != std::errc::no_such_file_or_directory ? " (" + ec.message() + ")" : ""),
                "a step-N directory written by save_checkpoint");
  if (!fs::is_directory(st))
    throw Error("checkpoint path '" + dir.string() + "' is not a directory",
                "a step-N directory written by save_checkpoint");
  const fs::path mf = dir / "manifest.json";
  if (!fs::exists(mf, ec))
    throw Error("'" + mf.string() + "' is missing: '" + dir.string() +
                    "' is not a complete checkpoint (an interrupted save, or not a checkpoint)",
                "a checkpoint whose manifest was written (the last step of a save)");
  return read_manifest(mf);
}

/// The manifest describes this model (units, kinds, names, shapes).
void check_model(const Manifest& m, const std::string& source, FsdpModel& model) {
  const std::string expected = "a checkpoint of a model with the same layers";
  auto bad = [&](const std::string& what) {
    throw Error("checkpoint manifest '" + source + "' is of another model: " + what, expected);
  };
  if (m.units.size() != model.num_units())
    bad(std::to_string(m.units.size()) + " units in the checkpoint, " +
        std::to_string(model.num_units()) + " in the model");
  for (std::size_t u = 0; u < m.units.size(); ++u) {
    const SavedUnit& su = m.units[u];
    const ShardedGroup& g = model.group(u);
    const ParamIndex& idx = g.index();
    if (su.name != g.name() || su.kind != model.layer_kind(u))
      bad("unit " + std::to_string(u) + " is '" + su.name + "' (" + su.kind +
          ") in the checkpoint, '" + g.name() + "' (" + model.layer_kind(u) + ") in the model");
    if (su.params.size() != idx.size())
      bad("unit '" + su.name + "' has " + std::to_string(su.params.size()) +
          " parameters in the checkpoint, " + std::to_string(idx.size()) + " in the model");
    for (std::size_t i = 0; i < idx.size(); ++i) {
      const SavedParam& sp = su.params[i];
      const ParamEntry& e = idx.entry(i);
      if (sp.name != e.name || sp.shape != e.shape)
        bad("parameter " + std::to_string(i) + " of '" + su.name + "' is '" + sp.name + "' " +
            shape_text(sp.shape) + " in the checkpoint, '" + e.name + "' " + shape_text(e.shape) +
            " in the model");
    }
  }
}

/// Every data file is there with its recorded size.
void check_files(const Manifest& m, const fs::path& dir) {
  for (const SavedFile& f : m.files) {
    const fs::path p = dir / f.name;
    std::error_code ec;
    const auto size = fs::file_size(p, ec);
    if (ec)
      throw Error("checkpoint data file '" + p.string() + "' " +
                      (ec == std::errc::no_such_file_or_directory ? std::string("is missing")
                                                                  : "cannot be read: " + ec.message()),
                  "every file the manifest lists");
    if (std::int64_t(size) != f.bytes)
      throw Error("checkpoint data file '" + p.string() + "' is " + std::to_string(size) +
                      " bytes but the manifest records " + std::to_string(f.bytes) +
                      (std::int64_t(size) < f.bytes ? " (truncated)" : ""),
                  "the file as it was saved");
  }
}

/// Host staging of one unit: master (f32) and moments in the optimizer's dtype.
struct Staging {
  std::vector<float> master;
  std::vector<float> m32, v32;
  std::vector<bfloat16_t> m16, v16;
};

/// Converts `n` elements of dtype `from` (f32 or bf16) at src into dst.
void convert(const char* src, DType from, float* dst, std::int64_t n) {
  if (from == DType::f32) {
    std::memcpy(dst, src, std::size_t(n) * 4);
    return;
  }
  for (std::int64_t k = 0; k < n; ++k) {
    bfloat16_t b;
    std::memcpy(&b.bits, src + 2 * k, 2);
    dst[k] = to_float(b);
  }
}
void convert(const char* src, DType from, bfloat16_t* dst, std::int64_t n) {
  for (std::int64_t k = 0; k < n; ++k) {
    if (from == DType::bf16) {
      std::memcpy(&dst[k].bits, src + 2 * k, 2);
    } else {
      float x;
      std::memcpy(&x, src + 4 * k, 4);
      dst[k] = from_float<bfloat16_t>(x);  // f32 moments into a bf16 optimizer: RNE
    }
  }
}

class Reader {
 public:
  Reader(const fs::path& dir, const Manifest& m) : dir_(dir), m_(m) {}

  /// Reads [begin, begin + count) of tensor t of parameter (unit u, param i)
  /// into dst, verifying each crc block read.
  template <class Dst>
  void read(const SavedUnit& su, const SavedParam& sp, const SavedTensor& t, std::int64_t begin,
            std::int64_t count, Dst* dst) {
    const std::int64_t es = std::int64_t(dtype_size(t.dtype));
    for (const ReadOp& op : plan_reads(t.pieces, begin, count, es, m_.crc_block_bytes)) {
      File& f = file(op.file);
      // Same dtype and exactly the wanted bytes (a load on the saving layout):
      // read straight into the staging buffer, no bounce copy.
      const bool direct = t.dtype == dtype_of<Dst>::value && op.skip_bytes == 0 &&
                          op.bytes == op.count * es;
      char* data = direct ? reinterpret_cast<char*>(dst + op.dst_begin) : nullptr;
      if (!direct) {
        buf_.resize(std::size_t(op.bytes));
        data = buf_.data();
      }
      f.pread_all(data, std::size_t(op.bytes), op.file_offset);
      bytes_ += std::uint64_t(op.bytes);
      for (std::int64_t b = 0; b * m_.crc_block_bytes < op.bytes; ++b) {
        const std::int64_t lo = b * m_.crc_block_bytes;
        const std::int64_t n = std::min(m_.crc_block_bytes, op.bytes - lo);
        const std::uint32_t got = crc32_of(data + lo, std::size_t(n));
        const std::uint32_t want = op.piece->crc32.at(std::size_t(op.first_block + b));
        if (got != want)
          throw Error("checkpoint data file '" + f.path().string() + "' is corrupt: bytes [" +
                          std::to_string(op.file_offset + lo) + ", " +
                          std::to_string(op.file_offset + lo + n) + ") of '" + su.name + "." +
                          sp.name + "' (" + t.kind + ") have crc32 " + hex(got) +
                          " but the manifest records " + hex(want),
                      "the bytes as they were saved");
      }
      if (!direct) convert(buf_.data() + op.skip_bytes, t.dtype, dst + op.dst_begin, op.count);
    }
  }
  std::uint64_t bytes() const noexcept { return bytes_; }

 private:
  File& file(int i) {
    auto it = files_.find(i);
    if (it == files_.end())
      it = files_.emplace(i, File::open_read(dir_ / m_.files.at(std::size_t(i)).name)).first;
    return it->second;
  }
  fs::path dir_;
  const Manifest& m_;
  std::map<int, File> files_;
  std::vector<char> buf_;
  std::uint64_t bytes_ = 0;
};

LoadInfo load(const fs::path& dir, FsdpModel& model, FusedAdam* opt) {
  const auto t0 = std::chrono::steady_clock::now();
  const Communicator& world = model.mesh().world();
  Manifest m;
  const std::string source = (dir / "manifest.json").string();

  // Phase A.
  run_agreed(world, [&] {
    m = open_checkpoint(dir);
    check_model(m, source, model);
    if (opt) {
      if (!m.has_optimizer)
        throw Error("checkpoint '" + dir.string() + "' holds no optimizer state (" + source +
                        ": \"optimizer\": null)",
                    "a checkpoint saved with its FusedAdam, or load_checkpoint without one");
      check_optimizer_matches(model, *opt);
    }
    check_files(m, dir);
  });

  // Phase B.
  const DType target = opt ? opt->options().moment_dtype : DType::f32;
  std::vector<Staging> staging(model.num_units());
  Reader reader(dir, m);
  run_agreed(world, [&] {
    for (std::size_t u = 0; u < model.num_units(); ++u) {
      const ShardedGroup& g = model.group(u);
      const ParamIndex& idx = g.index();
      const std::size_t shard = std::size_t(idx.shard_numel());
      const std::int64_t first = idx.shard_range(g.shard_rank()).first;
      Staging& s = staging[u];
      s.master.assign(shard, 0.f);  // padding stays zero, as in a fresh model
      if (opt && target == DType::bf16) {
        s.m16.assign(shard, bfloat16_t{0});
        s.v16.assign(shard, bfloat16_t{0});
      } else if (opt) {
        s.m32.assign(shard, 0.f);
        s.v32.assign(shard, 0.f);
      }
      const SavedUnit& su = m.units[u];
      for (std::size_t i = 0; i < idx.size(); ++i) {
        const SavedParam& sp = su.params[i];
        for (const auto& pc : idx.pieces_in_shard(i, g.shard_rank())) {
          const std::size_t at = std::size_t(pc.flat_begin - first);
          reader.read(su, sp, *sp.tensor("master"), pc.param_begin, pc.count, s.master.data() + at);
          if (!opt) continue;
          const SavedTensor& tm = *sp.tensor("exp_avg");
          const SavedTensor& tv = *sp.tensor("exp_avg_sq");
          if (target == DType::bf16) {
            reader.read(su, sp, tm, pc.param_begin, pc.count, s.m16.data() + at);
            reader.read(su, sp, tv, pc.param_begin, pc.count, s.v16.data() + at);
          } else {
            reader.read(su, sp, tm, pc.param_begin, pc.count, s.m32.data() + at);
            reader.read(su, sp, tv, pc.param_begin, pc.count, s.v32.data() + at);
          }
        }
      }
    }
  });

  // Phase C.
  auto put = [](auto& host_vec, const auto& dev) {
    using T = typename std::decay_t<decltype(host_vec)>::value_type;
    Kokkos::View<const T*, Kokkos::HostSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>> h(
        host_vec.data(), host_vec.size());
    Kokkos::deep_copy(dev, h);
  };
  for (std::size_t u = 0; u < model.num_units(); ++u) {
    ShardedGroup& g = model.group(u);
    put(staging[u].master, g.master());
    g.refresh_low_precision();
    if (opt) {
      const AdamGroupState& st = opt->state(int(u));
      if (target == DType::bf16) {
        put(staging[u].m16, st.exp_avg_bf16);
        put(staging[u].v16, st.exp_avg_sq_bf16);
      } else {
        put(staging[u].m32, st.exp_avg);
        put(staging[u].v32, st.exp_avg_sq);
      }
    }
  }
  if (opt) opt->set_step_count(m.optimizer_step);
  // Delayed fp8 scaling resumes from the saved histories when they fit this
  // model (same recipe and history length); otherwise it starts fresh, as
  // after any recipe change (LoadInfo::recipe_changed says so).
  if (!m.fp8_state.empty() && model.fp8_state().size() == m.fp8_state.size())
    model.set_fp8_state(m.fp8_state);
  Kokkos::fence();

  LoadInfo info;
  info.path = dir;
  info.step = m.step;
  info.user_state = m.user_state;
  info.saved_recipe = m.recipe;
  info.recipe_changed = m.recipe != model.recipe().describe();
  info.saved_mesh = m.mesh;
  info.saved_world_size = m.world_size;
  info.resharded = m.mesh != model.mesh().shape() || m.world_size != world.size();
  info.optimizer_loaded = opt != nullptr;
  info.saved_moment_dtype = m.has_optimizer ? dtype_name(m.moment_dtype) : "";
  info.moments_converted = opt && m.moment_dtype != target;
  info.bytes_read = reader.bytes();
  info.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return info;
}

}  // namespace
}  // namespace detail

LoadInfo load_checkpoint(const fs::path& path, FsdpModel& model, FusedAdam& optimizer) {
  return detail::load(path, model, &optimizer);
}

LoadInfo load_checkpoint(const fs::path& path, FsdpModel& model) {
  return detail::load(path, model, nullptr);
}

std::optional<LoadInfo> load_latest_checkpoint(const fs::path& save_dir, FsdpModel& model,
                                               FusedAdam& optimizer) {
  const Communicator& world = model.mesh().world();
  const auto latest = latest_checkpoint(save_dir);
  // -1: none. Ranks that see different checkpoints (a file system that is not
  // shared, or one still catching up) must not load different steps.
  std::int64_t step = -1;
  if (latest) step = detail::step_of(*latest).value_or(-1);
  agree_same(world, "loading the latest checkpoint in '" + save_dir.string() + "'",
             {{"the latest step (-1: none)", step}},
             "one save directory that every rank sees alike");
  if (step < 0) return std::nullopt;
  return detail::load(*latest, model, &optimizer);
}

}  // namespace kshard
