// Trainer checkpoints: TrainerState <-> JSON round trip and its rejections
// (each field by name), and Trainer::save / load / resume against the
// uninterrupted trainer: same state, bitwise the same next-step losses and
// parameters; bad trainer state in a checkpoint is an error on every rank
// and changes nothing; save_async writes what save writes and resumes alike,
// and its failed write is an error on every rank.
#include <kshard_test/gathers.hpp>
#include <kshard/testing/harness.hpp>

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>
#include <vector>
#include <thread>

#include <nlohmann/json.hpp>

#include <kshard/checkpoint/checkpoint.hpp>
#include <kshard/mesh/agree.hpp>
#include <kshard/train/trainer.hpp>
#include <kshard/train/trainer_state_json.hpp>

#include "train_test_util.hpp"
#include "../checkpoint/fault_scope.hpp"

namespace kt = kshard::testing;
namespace fs = std::filesystem;
using namespace train_test;
using ckpt_test::FaultScope;
using ckpt_test::file_bytes;
using nlohmann::json;

namespace {

kshard::TrainerState sample_state() {
  kshard::TrainerState s;
  s.step = 123456789012LL;
  s.optimizer_steps = 123456789000LL;
  s.loss_scale = 0.75f * 65536.f;
  s.loss_scale_good_steps = 17;
  s.consecutive_skipped = 2;
  // Values whose decimal forms are not exact: the JSON must round-trip bits.
  s.schedule = {kshard::LrScheduleKind::cosine, 1.0 / 3.0, 1e-5 / 7.0, 11, 1000003};
  s.data_seed = 0xfedcba9876543210ULL;  // above 2^63
  s.data_position = 987654321;
  return s;
}

/// The problem text of the kshard::Error that f throws ("" if none).
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const kshard::Error& e) {
    return e.problem();
  }
  return "";
}

/// A directory every rank of the world sees: named after rank 0's pid,
/// created empty by rank 0.
fs::path shared_dir(const std::string& tag) {
  const auto& world = kt::world();
  // Rank 0's pid everywhere: the others contribute 0 to a max.
  std::vector<std::int64_t> pid = {world.rank() == 0 ? std::int64_t(::getpid()) : 0};
  kshard::host_all_reduce(world, pid, kshard::ReduceOp::max);
  const fs::path p = fs::temp_directory_path() /
                     ("kshard_trainer_ckpt_" + std::to_string(pid[0]) + "_" + tag);
  if (world.rank() == 0) {
    fs::remove_all(p);
    fs::create_directories(p);
  }
  world.barrier();
  return p;
}

void remove_shared(const fs::path& p) {
  kt::world().barrier();
  if (kt::world().rank() == 0) fs::remove_all(p);
  kt::world().barrier();
}

kshard::TrainerOptions ckpt_options() {
  kshard::TrainerOptions o;
  o.batch = 2;
  o.seq = kSeq;
  o.accum = 2;
  o.clip = 1.0;
  o.adam.weight_decay = 0.1f;
  o.schedule = {kshard::LrScheduleKind::cosine, 3e-3, 3e-4, 2, 8};
  o.data_seed = 42;
  o.initial_loss_scale = 1024.f;
  o.loss_scale_growth_interval = 2;  // so fp16's scale changes within the run
  return o;
}

std::unique_ptr<kshard::Trainer> make_trainer(const kshard::DeviceMesh& mesh, const std::string& recipe,
                                              std::uint64_t seed, kshard::TrainerOptions o) {
  kshard::FsdpModel model(mesh, tiny_lm(), kshard::Recipe::parse(recipe));
  model.init_parameters(seed);
  return std::make_unique<kshard::Trainer>(std::move(model), o);
}

}  // namespace

KSHARD_TEST_SUITE(trainer_checkpoint)

BOOST_AUTO_TEST_CASE(state_json_round_trip) {
  const kshard::TrainerState s = sample_state();
  const json j = kshard::to_json(s);
  // Directly, and through text (what a manifest on disk is).
  const kshard::TrainerState back = kshard::trainer_state_from_json(j);
  const kshard::TrainerState text = kshard::trainer_state_from_json(json::parse(j.dump()));
  KSHARD_CHECK_ALL(back == s);
  KSHARD_CHECK_ALL(text == s);
  KSHARD_CHECK_ALL(j.at("format") == "kshard.trainer_state" && j.at("version") == 1 &&
                   j.at("schedule").at("kind") == "cosine");
  // Every kind, and the default state.
  bool kinds = true;
  for (auto k : {kshard::LrScheduleKind::constant, kshard::LrScheduleKind::linear}) {
    kshard::TrainerState t;
    t.schedule.kind = k;
    kinds = kinds && kshard::trainer_state_from_json(json::parse(kshard::to_json(t).dump())) == t;
  }
  KSHARD_CHECK_ALL(kinds);
}

BOOST_AUTO_TEST_CASE(state_json_rejects_missing_and_bad_fields) {
  const json good = kshard::to_json(sample_state());
  std::string why;
  auto expect = [&](const json& j, const std::string& needle, const std::string& what) {
    const std::string p = error_of([&] { kshard::trainer_state_from_json(j); });
    if (p.find(needle) == std::string::npos && why.empty())
      why = what + ": expected an error naming '" + needle + "', got '" + p + "'";
  };
  // Each field missing, top level and in the schedule.
  for (const char* f : {"format", "version", "step", "optimizer_steps", "loss_scale",
                        "loss_scale_good_steps", "consecutive_skipped", "data_seed",
                        "data_position", "schedule"}) {
    json j = good;
    j.erase(f);
    expect(j, std::string("'") + f + "'", std::string("without ") + f);
  }
  for (const char* f : {"kind", "lr", "min_lr", "warmup", "total_steps"}) {
    json j = good;
    j["schedule"].erase(f);
    expect(j, std::string("'schedule.") + f + "'", std::string("without schedule.") + f);
  }
  // Wrong types and values.
  auto with = [&](const std::string& key, const json& v) {
    json j = good;
    if (key.rfind("schedule.", 0) == 0)
      j["schedule"][key.substr(9)] = v;
    else
      j[key] = v;
    return j;
  };
  expect(with("step", "3"), "'step' is string", "step as a string");
  expect(with("step", 3.5), "'step' is number", "step as a double");
  expect(with("optimizer_steps", nullptr), "'optimizer_steps' is null", "null optimizer_steps");
  expect(with("loss_scale", "big"), "'loss_scale' is string", "loss_scale as a string");
  expect(with("loss_scale", 1e300), "'loss_scale' = ", "loss_scale beyond float");
  expect(with("loss_scale_good_steps", 1LL << 40), "'loss_scale_good_steps' = ", "int32 overflow");
  expect(with("consecutive_skipped", true), "'consecutive_skipped' is boolean", "bool");
  expect(with("data_seed", -1), "'data_seed' is number -1", "negative seed");
  expect(with("data_position", json::array()), "'data_position' is array", "array");
  expect(with("schedule", 5), "'schedule' is number", "schedule not an object");
  expect(with("schedule.kind", "step"), "'schedule.kind' is \"step\"", "unknown kind");
  expect(with("schedule.kind", 2), "'schedule.kind' is number", "kind as a number");
  expect(with("schedule.lr", "0.1"), "'schedule.lr' is string", "lr as a string");
  expect(with("schedule.total_steps", 1.5), "'schedule.total_steps' is number", "total_steps double");
  expect(with("format", "kshard-checkpoint"), "\"format\": \"kshard-checkpoint\"", "other format");
  expect(with("version", 2), "version 2", "future version");
  expect(json::array({1, 2}), "not an object", "an array");
  expect(json::object(), "'format'", "an empty object");
  KSHARD_CHECK_ALL_MSG(why.empty(), why);
  // The error says what was expected.
  json j = good;
  j.erase("step");
  std::string expected;
  try {
    kshard::trainer_state_from_json(j);
  } catch (const kshard::Error& e) {
    expected = e.expected();
  }
  KSHARD_CHECK_ALL(expected.find("kshard.trainer_state") != std::string::npos);
}

// K steps, save; a trainer built otherwise (another init, another schedule,
// another data seed) loads it: same state, and the next steps' losses and the
// final parameters are bitwise those of the uninterrupted trainer. fp16 too
// (the loss scaler's state travels in the JSON).
BOOST_AUTO_TEST_CASE(save_load_continues_bitwise) {
  const auto& world = kt::world();
  const kshard::DeviceMesh mesh(world, {world.size()});
  const VectorSource data(make_tokens(4000, 6));
  const fs::path dir = shared_dir("bitwise");
  std::string why;
  for (const std::string recipe : {"fp32", "fp16"}) {
    const kshard::TrainerOptions o = ckpt_options();
    auto straight = make_trainer(mesh, recipe, 3, o);
    std::vector<double> want;
    for (int s = 0; s < 6; ++s) want.push_back(straight->step(data).local_loss);

    auto first = make_trainer(mesh, recipe, 3, o);
    for (int s = 0; s < 3; ++s) first->step(data);
    const kshard::SaveInfo si = first->save(dir / recipe);
    const kshard::TrainerState saved = first->state();
    if (si.step != 3 || si.path != kshard::checkpoint_path(dir / recipe, 3))
      why = recipe + ": save returned step " + std::to_string(si.step) + " at " + si.path.string();

    kshard::TrainerOptions other = o;
    other.schedule = {kshard::LrScheduleKind::constant, 1.0, 0.0, 0, 1};
    other.data_seed = 7;
    auto second = make_trainer(mesh, recipe, 99, other);
    const kshard::LoadInfo li = second->load(si.path);
    if (!(second->state() == saved) && why.empty()) why = recipe + ": loaded state differs";
    if ((li.step != 3 || !li.optimizer_loaded) && why.empty()) why = recipe + ": LoadInfo";
    if (second->options().schedule != o.schedule && why.empty())
      why = recipe + ": the checkpoint's schedule was not taken";

    // resume() of the save directory picks the same checkpoint.
    auto third = make_trainer(mesh, recipe, 98, other);
    const auto ri = third->resume(dir / recipe);
    if ((!ri || ri->step != 3 || !(third->state() == saved)) && why.empty())
      why = recipe + ": resume did not restore step 3";

    for (int s = 3; s < 6; ++s) {
      const double a = second->step(data).local_loss, b = third->step(data).local_loss;
      if ((bits(a) != bits(want[std::size_t(s)]) || bits(b) != bits(want[std::size_t(s)])) &&
          why.empty()) {
        std::ostringstream m;
        m.precision(17);
        m << recipe << " step " << s + 1 << ": loaded " << a << ", resumed " << b
          << ", uninterrupted " << want[std::size_t(s)];
        why = m.str();
      }
    }
    const auto ps = kshard::test::gather_master_parameters(straight->model());
    if (!same_bits(ps, kshard::test::gather_master_parameters(second->model())) && why.empty())
      why = recipe + ": parameters after the loaded run differ";
    if (!(second->state() == straight->state()) && why.empty())
      why = recipe + ": final states differ";
  }
  KSHARD_CHECK_ALL_MSG(why.empty(), why);
  remove_shared(dir);
}

// resume() of an empty or missing directory changes nothing; keep_last prunes.
BOOST_AUTO_TEST_CASE(resume_empty_and_keep_last) {
  const auto& world = kt::world();
  const kshard::DeviceMesh mesh(world, {world.size()});
  const VectorSource data(make_tokens(4000, 7));
  const fs::path dir = shared_dir("keep");
  auto t = make_trainer(mesh, "fp32", 1, ckpt_options());
  const kshard::TrainerState before = t->state();
  KSHARD_CHECK_ALL(!t->resume(dir / "none").has_value() && t->state() == before);
  KSHARD_CHECK_ALL(!t->resume(dir).has_value() && t->state() == before);
  kshard::SaveOptions so;
  so.keep_last = 2;
  for (int s = 0; s < 3; ++s) {
    t->step(data);
    t->save(dir, so);
  }
  const auto all = kshard::list_checkpoints(dir);
  KSHARD_CHECK_ALL(all.size() == 2 && all.back() == kshard::checkpoint_path(dir, 3) &&
                   all.front() == kshard::checkpoint_path(dir, 2));
  auto u = make_trainer(mesh, "fp32", 2, ckpt_options());
  const auto ri = u->resume(dir);
  KSHARD_CHECK_ALL(ri.has_value() && ri->step == 3 && u->state() == t->state());
  remove_shared(dir);
}

// A checkpoint whose trainer state is missing a field or cannot be restored,
// a model-only checkpoint and a missing directory: a kshard::Error on every
// rank, and the trainer (state and parameters) is unchanged.
BOOST_AUTO_TEST_CASE(bad_trainer_state_is_an_error_everywhere) {
  const auto& world = kt::world();
  const kshard::DeviceMesh mesh(world, {world.size()});
  const VectorSource data(make_tokens(4000, 8));
  const fs::path dir = shared_dir("bad");
  auto src = make_trainer(mesh, "fp32", 4, ckpt_options());
  src->step(data);
  json no_position = kshard::to_json(src->state());
  no_position.erase("data_position");
  kshard::TrainerState unrestorable = src->state();
  unrestorable.optimizer_steps = unrestorable.step + 5;
  kshard::save_checkpoint(dir / "no_position", 1, src->model(), src->optimizer(), no_position);
  kshard::save_checkpoint(dir / "unrestorable", 1, src->model(), src->optimizer(),
                          kshard::to_json(unrestorable));
  kshard::TrainerState other_count = src->state();
  other_count.optimizer_steps = 0;  // restorable, but not the manifest's count
  kshard::save_checkpoint(dir / "other_count", 1, src->model(), src->optimizer(),
                          kshard::to_json(other_count));
  kshard::save_checkpoint(dir / "other_step", 2, src->model(), src->optimizer(),
                          kshard::to_json(src->state()));
  kshard::save_checkpoint(dir / "model_only", 1, src->model(), kshard::to_json(src->state()));

  auto t = make_trainer(mesh, "fp32", 5, ckpt_options());
  const kshard::TrainerState before = t->state();
  const auto params = kshard::test::gather_master_parameters(t->model());
  struct Case {
    fs::path path;
    const char* needle;
  };
  const Case cases[] = {
      {kshard::checkpoint_path(dir / "no_position", 1), "lacks the field 'data_position'"},
      {kshard::checkpoint_path(dir / "unrestorable", 1), "optimizer_steps 6 for step 1"},
      {kshard::checkpoint_path(dir / "other_step", 2), "its trainer state says step 1"},
      {kshard::checkpoint_path(dir / "other_count", 1), "says 0 optimizer steps, its manifest 1"},
      {kshard::checkpoint_path(dir / "model_only", 1), "holds no optimizer state"},
      {dir / "nothing" / "step-0000000001", "does not exist"}};
  for (const Case& c : cases) {
    std::string msg;
    try {
      t->load(c.path);
    } catch (const kshard::Error& e) {
      msg = e.what();
    }
    // Every rank threw; the rank that met the problem says what it was (the
    // others may name that rank instead, when only it saw the problem).
    KSHARD_CHECK_ALL_MSG(!msg.empty(), c.path.string() << ": no error");
    const bool named = msg.find(c.needle) != std::string::npos;
    KSHARD_CHECK_ALL_MSG(kt::any_rank(named), c.path.string() << ": '" << msg << "' lacks '"
                                                              << c.needle << "'");
    KSHARD_CHECK_ALL(t->state() == before);
  }
  KSHARD_CHECK_ALL(same_bits(params, kshard::test::gather_master_parameters(t->model())));
  remove_shared(dir);
}


// save_async at step 3 (its write kept pending for two steps by a slow
// writer on the last rank) and save at step 3 write the same bytes;
// resuming from the asynchronous checkpoint, from the synchronous one, and
// the uninterrupted run give bitwise the same next losses and parameters. A
// later save_async is committed by a step (StepReport::committed_save).
BOOST_AUTO_TEST_CASE(async_save_resumes_bitwise) {
  const auto& world = kt::world();
  const kshard::DeviceMesh mesh(world, {world.size()});
  const VectorSource data(make_tokens(4000, 9));
  const fs::path dir = shared_dir("async");
  std::string why;
  for (const std::string recipe : {"fp32", "fp16"}) {
    const kshard::TrainerOptions o = ckpt_options();
    auto straight = make_trainer(mesh, recipe, 3, o);
    std::vector<double> want;
    for (int s = 0; s < 6; ++s) want.push_back(straight->step(data).local_loss);

    auto first = make_trainer(mesh, recipe, 3, o);
    for (int s = 0; s < 3; ++s) first->step(data);
    const kshard::SaveInfo sync = first->save(dir / recipe / "sync");
    {
      FaultScope slow("slow:" + std::to_string(world.size() - 1) + ":3");
      first->save_async(dir / recipe / "async");
    }
    // Training goes on while the write is pending (the slow writer sleeps a
    // second halfway): these steps commit nothing.
    bool early = false;
    for (int s = 0; s < 2; ++s) early = early || first->step(data).committed_save.has_value();
    if ((early || !first->save_pending()) && why.empty())
      why = recipe + ": the slow save was committed by a step";
    const auto done = first->wait_for_save();
    if ((!done || done->step != 3 || first->save_pending() || first->wait_for_save()) && why.empty())
      why = recipe + ": wait_for_save did not commit step 3 once";
    const fs::path async_path = kshard::checkpoint_path(dir / recipe / "async", 3);
    for (const char* f : {"manifest.json", "shard-00000.bin"})
      if (file_bytes(sync.path / f) != file_bytes(async_path / f) && why.empty())
        why = recipe + ": " + f + " of the async checkpoint differs from the sync one's";
    const std::string mine = "shard-0000" + std::to_string(world.rank()) + ".bin";
    const bool same_mine = file_bytes(sync.path / mine) == file_bytes(async_path / mine);
    if (kt::any_rank(!same_mine) && why.empty()) why = recipe + ": a data file differs";

    kshard::TrainerOptions other = o;
    other.schedule = {kshard::LrScheduleKind::constant, 1.0, 0.0, 0, 1};
    other.data_seed = 7;
    auto from_async = make_trainer(mesh, recipe, 99, other);
    auto from_sync = make_trainer(mesh, recipe, 98, other);
    const auto ra = from_async->resume(dir / recipe / "async");
    from_sync->load(sync.path);
    if ((!ra || ra->step != 3 || !(from_async->state() == from_sync->state())) && why.empty())
      why = recipe + ": resume of the async checkpoint did not restore step 3";
    for (int s = 3; s < 6; ++s) {
      const double a = from_async->step(data).local_loss, b = from_sync->step(data).local_loss;
      if ((bits(a) != bits(want[std::size_t(s)]) || bits(b) != bits(want[std::size_t(s)])) &&
          why.empty()) {
        std::ostringstream m;
        m.precision(17);
        m << recipe << " step " << s + 1 << ": from async " << a << ", from sync " << b
          << ", uninterrupted " << want[std::size_t(s)];
        why = m.str();
      }
    }
    const auto ps = kshard::test::gather_master_parameters(straight->model());
    if ((!same_bits(ps, kshard::test::gather_master_parameters(from_async->model())) ||
         !(from_async->state() == straight->state())) && why.empty())
      why = recipe + ": the run resumed from the async checkpoint ends elsewhere";

    // Committed by a step: every rank sleeps a little before each step so
    // that the writers (no fsync) are done within a few steps.
    kshard::SaveOptions fast;
    fast.fsync = false;
    const kshard::TrainerState at5 = first->state();
    first->save_async(dir / recipe / "by_step", fast);
    std::optional<kshard::SaveInfo> committed;
    for (int s = 0; s < 100 && !committed; ++s) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      committed = first->step(data).committed_save;
    }
    if ((!committed || committed->step != 5 || first->save_pending()) && why.empty())
      why = recipe + ": no step committed the save of step 5";
    auto from_step = make_trainer(mesh, recipe, 97, other);
    const auto rs = from_step->resume(dir / recipe / "by_step");
    if ((!rs || !(from_step->state() == at5)) && why.empty())
      why = recipe + ": the checkpoint a step committed does not restore step 5";
  }
  KSHARD_CHECK_ALL_MSG(why.empty(), why);
  remove_shared(dir);
}

// A background write that fails on one rank (disk full, injected) is a
// kshard::Error on every rank naming that rank and its file: from the next
// step (which then does nothing) or from wait_for_save. No trace of the
// failed save remains; the previous checkpoint still resumes.
BOOST_AUTO_TEST_CASE(async_save_failure_is_an_error_everywhere) {
  const auto& world = kt::world();
  const kshard::DeviceMesh mesh(world, {world.size()});
  const VectorSource data(make_tokens(4000, 10));
  const fs::path dir = shared_dir("async_fail");
  auto t = make_trainer(mesh, "fp32", 11, ckpt_options());
  t->step(data);
  t->save_async(dir);
  const kshard::TrainerState at1 = t->state();
  const int bad = world.size() - 1;
  const std::string name = "shard-0000" + std::to_string(bad) + ".bin";
  for (const bool at_step : {true, false}) {
    t->step(data);
    const std::int64_t step = t->step_count();
    {
      FaultScope disk_full("enospc:" + std::to_string(bad) + ":" + std::to_string(step));
      t->save_async(dir);  // commits step 1 first (the first time)
    }
    std::string what;
    int error_rank = -1, steps = 0;
    try {
      if (at_step) {
        for (; steps < 200; ++steps) {
          std::this_thread::sleep_for(std::chrono::milliseconds(10));
          t->step(data);
        }
      } else {
        t->wait_for_save();
      }
    } catch (const kshard::Error& e) {
      what = e.what();
      error_rank = e.rank();
    }
    const std::string how = at_step ? "step" : "wait_for_save";
    KSHARD_CHECK_ALL_MSG(!what.empty(), how << ": no error");
    KSHARD_CHECK_ALL_MSG(what.find(name) != std::string::npos && what.find("No space") != std::string::npos,
                         how << ": '" << what << "' does not name " << name);
    KSHARD_CHECK_ALL_MSG(error_rank == bad, how << ": the error names rank " << error_rank);
    // The step that threw did nothing: the steps before it ran, that one not.
    KSHARD_CHECK_ALL(t->step_count() == step + steps && !t->save_pending());
    KSHARD_CHECK_ALL(!fs::exists(kshard::checkpoint_path(dir, step)));
    KSHARD_CHECK_ALL(kshard::latest_checkpoint(dir) == kshard::checkpoint_path(dir, 1));
  }
  bool no_tmp = true;
  for (const auto& e : fs::directory_iterator(dir))
    no_tmp = no_tmp && e.path().filename().string().rfind(".tmp-", 0) != 0;
  KSHARD_CHECK_ALL(no_tmp);
  auto u = make_trainer(mesh, "fp32", 12, ckpt_options());
  const auto ri = u->resume(dir);
  KSHARD_CHECK_ALL(ri.has_value() && ri->step == 1 && u->state() == at1);
  remove_shared(dir);
}

KSHARD_TEST_SUITE_END()
