// A rank killed during a save (two launches; the same for an asynchronous
// save, whose rank dies in its background writer while the main threads
// train on: crash_during_async_save / after_async_crash, own directory). crash_during_save runs with
// KSHARD_CHECKPOINT_TEST_FAULT=exit:1:2: it saves step 1, then rank 1 _exits
// halfway through its data file of step 2, so that launch fails (CTest
// expects it to). after_crash, the next launch, checks that the partial save
// left only a temporary directory that nothing takes for a checkpoint, that
// step 1 is the latest and loads exactly, and that the next save cleans up.
#include <kshard/testing/harness.hpp>

#include "ckpt_test_util.hpp"
#include "kshard/checkpoint/async_save.hpp"

namespace kt = kshard::testing;
using namespace ckpt_test;

namespace {
fs::path kill_dir() { return root() / "kill"; }
}  // namespace

KSHARD_TEST_SUITE(kill)

BOOST_AUTO_TEST_CASE(crash_during_save) {
  KSHARD_SKIP_IF(env("KSHARD_CHECKPOINT_TEST_FAULT").empty(),
                 "no KSHARD_CHECKPOINT_TEST_FAULT: run by checkpoint_kill_save");
  const auto mesh = make_mesh(kt::world(), {kt::world_size()});
  fresh_dir(kill_dir(), kt::world());
  Trainer a(mesh, "fp32", 31);
  a.train_step();
  kshard::save_checkpoint(kill_dir(), 1, *a.model, *a.opt, a.user_state());
  const FullState st = full_state(a);
  if (kt::world_rank() == 0) write_state(kill_dir().parent_path() / "kill-reference.bin", st);
  a.train_step();
  kshard::save_checkpoint(kill_dir(), 2, *a.model, *a.opt, a.user_state());  // rank 1 dies in here
  BOOST_FAIL("the save of step 2 returned: the injected crash did not happen");
}

BOOST_AUTO_TEST_CASE(after_crash) {
  KSHARD_SKIP_IF(env("KSHARD_CKPT_AFTER_KILL").empty(), "run by checkpoint_after_kill");
  const fs::path tmp = kill_dir() / ".tmp-step-0000000002";
  // The crash happened mid-write: a partial data file, no manifest, no step-2.
  KSHARD_REQUIRE_ALL(fs::is_directory(tmp));
  KSHARD_CHECK_ALL(fs::exists(tmp / "shard-00001.bin") && !fs::exists(tmp / "manifest.json"));
  KSHARD_CHECK_ALL(!fs::exists(kshard::checkpoint_path(kill_dir(), 2)));
  KSHARD_CHECK_ALL(kshard::list_checkpoints(kill_dir()).size() == 1);
  KSHARD_CHECK_ALL(kshard::latest_checkpoint(kill_dir()) == kshard::checkpoint_path(kill_dir(), 1));
  const auto mesh = make_mesh(kt::world(), {kt::world_size()});
  Trainer b(mesh, "fp32", 32);
  // The temporary directory itself is not a checkpoint.
  const std::string e = error_of([&] { kshard::load_checkpoint(tmp, *b.model, *b.opt); });
  KSHARD_CHECK_ALL_MSG(e.find("is not a complete checkpoint") != std::string::npos, "got: " << e);
  const auto li = kshard::load_latest_checkpoint(kill_dir(), *b.model, *b.opt);
  KSHARD_REQUIRE_ALL(li.has_value() && li->step == 1);
  std::string why;
  KSHARD_CHECK_ALL_MSG(same_state(full_state(b), read_state(kill_dir().parent_path() / "kill-reference.bin"), why),
                       why);
  b.restore(li->user_state);
  b.train_step();
  kshard::save_checkpoint(kill_dir(), 2, *b.model, *b.opt, b.user_state());
  KSHARD_CHECK_ALL(!fs::exists(tmp) && kshard::latest_checkpoint(kill_dir()) == kshard::checkpoint_path(kill_dir(), 2));
}

BOOST_AUTO_TEST_CASE(crash_during_async_save) {
  KSHARD_SKIP_IF(env("KSHARD_CHECKPOINT_TEST_FAULT").empty(),
                 "no KSHARD_CHECKPOINT_TEST_FAULT: run by checkpoint_kill_async_save");
  const auto mesh = make_mesh(kt::world(), {kt::world_size()});
  const fs::path dir = kill_dir().string() + "-async";
  fresh_dir(dir, kt::world());
  Trainer a(mesh, "fp32", 31);
  a.train_step();
  kshard::AsyncSaver saver;
  saver.start(dir, 1, *a.model, *a.opt, a.user_state());
  a.train_step();  // trains while step 1 is written
  const auto polled = saver.poll();
  const auto waited = saver.wait();
  KSHARD_REQUIRE_ALL(polled.has_value() != waited.has_value());
  KSHARD_REQUIRE_ALL(kshard::latest_checkpoint(dir) == kshard::checkpoint_path(dir, 1));
  a.train_step();
  saver.start(dir, 2, *a.model, *a.opt, a.user_state());  // rank 1's writer dies halfway
  for (int s = 0; s < 1000; ++s) {  // the main threads train on meanwhile
    a.train_step();
    saver.poll();
  }
  saver.wait();
  BOOST_FAIL("the async save of step 2 was committed: the injected crash did not happen");
}

BOOST_AUTO_TEST_CASE(after_async_crash) {
  KSHARD_SKIP_IF(env("KSHARD_CKPT_AFTER_KILL").empty(), "run by checkpoint_after_async_kill");
  const fs::path dir = kill_dir().string() + "-async";
  const fs::path tmp = dir / ".tmp-step-0000000002";
  KSHARD_REQUIRE_ALL(fs::is_directory(tmp));
  KSHARD_CHECK_ALL(fs::exists(tmp / "shard-00001.bin") && !fs::exists(tmp / "manifest.json"));
  KSHARD_CHECK_ALL(!fs::exists(kshard::checkpoint_path(dir, 2)));
  KSHARD_CHECK_ALL(kshard::list_checkpoints(dir).size() == 1);
  const auto mesh = make_mesh(kt::world(), {kt::world_size()});
  // Step 1 loads exactly: the state a fresh run has after one step.
  Trainer ref(mesh, "fp32", 31);
  ref.train_step();
  Trainer b(mesh, "fp32", 32);
  const auto li = kshard::load_latest_checkpoint(dir, *b.model, *b.opt);
  KSHARD_REQUIRE_ALL(li.has_value() && li->step == 1);
  std::string why;
  KSHARD_CHECK_ALL_MSG(same_state(full_state(b), full_state(ref), why), why);
}

KSHARD_TEST_SUITE_END()
