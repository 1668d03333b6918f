// AsyncSaver on this launch's mesh (1-D and HSDP, where only replica 0
// writes): the checkpoint holds the state of the moment start() returned
// although training goes on while it is written, and its files are byte for
// byte those of save_checkpoint; a failed background write is a kshard::Error
// on every rank (from poll() and from wait()) that names the rank and the
// file, leaves no step-N and no temporary directory, and the previous
// checkpoint still loads; the destructor only waits, it commits nothing.
// The faults come from KSHARD_CHECKPOINT_TEST_FAULT, set here around a save
// (it is read when the save starts, never by the writer thread).
#include <kshard/testing/harness.hpp>

#include <cstdlib>
#include <thread>

#include <boost/test/data/monomorphic.hpp>
#include <boost/test/data/test_case.hpp>

#include "ckpt_test_util.hpp"
#include "fault_scope.hpp"
#include "kshard/checkpoint/async_save.hpp"
#include "kshard/checkpoint/manifest.hpp"

namespace kt = kshard::testing;
namespace bdata = boost::unit_test::data;
using namespace ckpt_test;

namespace {

fs::path async_dir(const std::string& what) {
  return launch_dir(kt::world_size(), what);
}


/// Every file of checkpoint directory a is in b with the same bytes, and no more.
bool same_files(const fs::path& a, const fs::path& b, std::string& why) {
  std::size_t n = 0;
  for (const auto& e : fs::directory_iterator(a)) {
    ++n;
    const fs::path other = b / e.path().filename();
    if (!fs::exists(other) || file_bytes(e.path()) != file_bytes(other)) {
      why = e.path().filename().string() + " differs between " + a.string() + " and " + b.string();
      return false;
    }
  }
  if (n != std::size_t(std::distance(fs::directory_iterator(b), fs::directory_iterator()))) {
    why = "the file counts of " + a.string() + " and " + b.string() + " differ";
    return false;
  }
  return true;
}

/// The highest world rank that writes a data file (under HSDP only the
/// ranks of replica 0 write).
int last_writer(const kshard::DeviceMesh& mesh) {
  std::vector<std::int64_t> r = {mesh.ndim() == 1 || mesh.coord(0) == 0 ? mesh.world().rank() : -1};
  kshard::host_all_reduce(mesh.world(), r, kshard::ReduceOp::max);
  return int(r[0]);
}

}  // namespace

KSHARD_TEST_SUITE(async_save)

// Save at step 2 both ways; the asynchronous one is kept pending (a slow
// write on one rank) while two more steps change every tensor. The two
// checkpoints have the same bytes, and the asynchronous one loads as the
// state at step 2.
BOOST_DATA_TEST_CASE(snapshot_is_the_state_at_start, bdata::make({"fp32", "bf16"}), recipe) {
  const auto mesh = make_mesh(kt::world(), launch_mesh(kt::world_size()));
  const fs::path dir = async_dir(std::string("async-") + recipe);
  fresh_dir(dir, kt::world());
  Trainer a(mesh, recipe, 5);
  a.train_step();
  a.train_step();
  const FullState at2 = full_state(a);
  const auto sync = kshard::save_checkpoint(dir / "sync", 2, *a.model, *a.opt, a.user_state());
  kshard::AsyncSaver saver;
  // bf16: the snapshot's memory reserved ahead (the first save then only
  // copies into it); fp32: allocated by the save itself. Same files.
  if (std::string(recipe) == "bf16") saver.reserve(*a.model, *a.opt);
  {
    FaultScope slow("slow:" + std::to_string(last_writer(mesh)) + ":2");
    saver.start(dir / "async", 2, *a.model, *a.opt, a.user_state());
  }
  KSHARD_CHECK_ALL(saver.pending());
  // The writer sleeps a second halfway: these polls find it still writing.
  std::optional<kshard::SaveInfo> early;
  for (int s = 0; s < 2; ++s) {
    early = saver.poll();
    a.train_step();
  }
  KSHARD_CHECK_ALL(!early.has_value() && saver.pending());
  KSHARD_CHECK_ALL(!fs::exists(kshard::checkpoint_path(dir / "async", 2)));
  const auto info = saver.wait();
  KSHARD_REQUIRE_ALL(info.has_value());
  KSHARD_CHECK_ALL(!saver.pending() && !saver.wait().has_value() && !saver.poll().has_value());
  KSHARD_CHECK_ALL(info->step == 2 && info->path == kshard::checkpoint_path(dir / "async", 2));
  KSHARD_CHECK_ALL(info->total_bytes == sync.total_bytes && info->bytes_written == sync.bytes_written);
  // The writer's second of sleep is in its write time, not in the blocked time.
  const bool slow_rank = kt::world_rank() == last_writer(mesh);
  KSHARD_CHECK_ALL(!slow_rank || info->write_seconds >= 1.0);
  KSHARD_CHECK_ALL(info->seconds >= info->blocked_seconds && info->blocked_seconds >= 0);

  std::string why;
  KSHARD_CHECK_ALL_MSG(same_files(sync.path, info->path, why), why);
  Trainer b(mesh, recipe, 77);
  const kshard::LoadInfo li = kshard::load_checkpoint(info->path, *b.model, *b.opt);
  KSHARD_CHECK_ALL_MSG(same_state(full_state(b), at2, why), recipe << ": " << why);
  KSHARD_CHECK_ALL(li.step == 2 && li.user_state["data_step"] == 2);
}

// One rank's write fails (disk full, injected halfway): every rank throws a
// kshard::Error naming that rank and its file, from poll() while training
// and from wait(); nothing of the failed save remains and step 1 still loads.
BOOST_AUTO_TEST_CASE(failed_write_is_an_error_on_every_rank) {
  const auto mesh = make_mesh(kt::world(), launch_mesh(kt::world_size()));
  const fs::path dir = async_dir("async-fail");
  fresh_dir(dir, kt::world());
  Trainer a(mesh, "fp32", 6);
  a.train_step();
  kshard::save_checkpoint(dir, 1, *a.model, *a.opt, a.user_state());
  const FullState at1 = full_state(a);
  const int bad = last_writer(mesh);
  char name[32];
  std::snprintf(name, sizeof name, "shard-%05d.bin", bad);
  kshard::AsyncSaver saver;
  for (const bool by_poll : {true, false}) {
    const std::int64_t step = by_poll ? 2 : 3;
    a.train_step();
    {
      FaultScope disk_full("enospc:" + std::to_string(bad) + ":" + std::to_string(step));
      saver.start(dir, step, *a.model, *a.opt, a.user_state());
    }
    std::string what;
    int error_rank = -1, polls = 0;
    try {
      if (by_poll) {
        // Every rank polls alike; the write fails within a few milliseconds.
        for (; polls < 2000; ++polls) {
          if (saver.poll()) break;
          std::this_thread::sleep_for(std::chrono::milliseconds(5));
        }
      } else {
        saver.wait();
      }
    } catch (const kshard::Error& e) {
      what = e.what();
      error_rank = e.rank();
    }
    const std::string how = by_poll ? "poll" : "wait";
    KSHARD_CHECK_ALL_MSG(!what.empty(), how << ": no error (" << polls << " polls)");
    KSHARD_CHECK_ALL_MSG(what.find(name) != std::string::npos && what.find("injected") != std::string::npos,
                         how << ": '" << what << "' does not name " << name);
    KSHARD_CHECK_ALL_MSG(error_rank == bad, how << ": the error names rank " << error_rank);
    KSHARD_CHECK_ALL(!saver.pending());
    KSHARD_CHECK_ALL(!fs::exists(kshard::checkpoint_path(dir, step)));
    KSHARD_CHECK_ALL(!fs::exists(dir / (".tmp-" + kshard::checkpoint_path(dir, step).filename().string())));
    KSHARD_CHECK_ALL(kshard::latest_checkpoint(dir) == kshard::checkpoint_path(dir, 1));
  }
  Trainer b(mesh, "fp32", 66);
  const auto li = kshard::load_latest_checkpoint(dir, *b.model, *b.opt);
  std::string why;
  KSHARD_REQUIRE_ALL(li.has_value() && li->step == 1);
  KSHARD_CHECK_ALL_MSG(same_state(full_state(b), at1, why), why);
  // The saver is usable again after a failure.
  saver.start(dir, 4, *a.model, *a.opt, a.user_state());
  const auto ok = saver.wait();
  KSHARD_CHECK_ALL(ok.has_value() && kshard::latest_checkpoint(dir) == kshard::checkpoint_path(dir, 4));
}

// A saver destroyed with a save pending waits for the write but commits
// nothing (no MPI in a destructor): only the temporary directory remains,
// which the next save removes.
BOOST_AUTO_TEST_CASE(destructor_waits_and_commits_nothing) {
  const auto mesh = make_mesh(kt::world(), launch_mesh(kt::world_size()));
  const fs::path dir = async_dir("async-dtor");
  fresh_dir(dir, kt::world());
  Trainer a(mesh, "fp32", 7);
  a.train_step();
  {
    kshard::AsyncSaver saver;
    saver.start(dir, 1, *a.model, *a.opt, a.user_state());
  }
  const fs::path tmp = dir / ".tmp-step-0000000001";
  kt::world().barrier();  // every rank's writer has ended
  KSHARD_CHECK_ALL(fs::is_directory(tmp) && !fs::exists(tmp / "manifest.json"));
  KSHARD_CHECK_ALL(fs::exists(tmp / "shard-00000.bin"));
  KSHARD_CHECK_ALL(kshard::list_checkpoints(dir).empty());
  a.train_step();
  kshard::AsyncSaver saver;
  saver.start(dir, 2, *a.model, *a.opt, a.user_state());
  KSHARD_CHECK_ALL(saver.wait().has_value());
  KSHARD_CHECK_ALL(!fs::exists(tmp) && kshard::list_checkpoints(dir).size() == 1);
}

KSHARD_TEST_SUITE_END()
