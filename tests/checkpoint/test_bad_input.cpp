// Bad input: every rank throws kshard::Error naming the file and what is
// wrong, never a hang. Each case copies a good checkpoint, damages the copy
// on rank 0, and loads it on every rank. Also: a save that fails on one rank
// (disk full, injected) fails on every rank and leaves the previous
// checkpoint the latest.
#include <kshard/testing/harness.hpp>

#include <cstdlib>

#include "ckpt_test_util.hpp"
#include "kshard/checkpoint/safetensors.hpp"

namespace kt = kshard::testing;
using namespace ckpt_test;

namespace {

fs::path bad_dir(const std::string& what) {
  return launch_dir(kt::world_size(), fs::path("bad") / what);
}

/// A saved good checkpoint and the trainer to load into.
struct Good {
  kshard::DeviceMesh mesh;
  Trainer t;
  fs::path path;
  Good()
      : mesh(make_mesh(kt::world(), launch_mesh(kt::world_size()))), t(mesh, "fp32", 21) {
    fresh_dir(bad_dir("good"), kt::world());
    t.train_step();
    path = kshard::save_checkpoint(bad_dir("good"), 1, *t.model, *t.opt, t.user_state()).path;
  }
  /// A copy of the good checkpoint at `name`, damaged by rank 0.
  template <class Damage>
  fs::path damaged(const std::string& name, Damage&& damage) {
    const fs::path p = bad_dir(name);
    if (kt::world_rank() == 0) {
      fs::remove_all(p);
      fs::create_directories(p.parent_path());
      fs::copy(path, p, fs::copy_options::recursive);
      damage(p);
    }
    kt::world().barrier();
    return p;
  }
};

void flip_byte(const fs::path& file, std::int64_t at) {
  std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(at);
  char c = 0;
  f.get(c);
  f.seekp(at);
  f.put(char(c ^ 0x5a));
}

std::string slurp(const fs::path& p) {
  std::ifstream f(p);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

void spit(const fs::path& p, const std::string& s) { std::ofstream(p) << s; }

bool mentions(const std::string& e, const std::string& a, const std::string& b) {
  return e.find(a) != std::string::npos && e.find(b) != std::string::npos;
}

}  // namespace

#define EXPECT_LOAD_ERROR(path, needle1, needle2)                                            \
  do {                                                                                      \
    const std::string e_ = error_of([&] { kshard::load_checkpoint(path, *g.t.model, *g.t.opt); }); \
    KSHARD_CHECK_ALL_MSG(mentions(e_, needle1, needle2),                                    \
                         "expected a kshard::Error with '" << needle1 << "' and '" << needle2 \
                                                           << "', got: '" << e_ << "'");    \
  } while (0)

KSHARD_TEST_SUITE(bad_input)

BOOST_AUTO_TEST_CASE(corrupt_bytes) {
  Good g;
  // A byte in the middle of the last rank's file: only the rank that reads it
  // can see it, every rank must report it.
  const std::string last = "shard-" + std::string(5 - std::to_string(g.mesh.shard_size() - 1).size(), '0') +
                           std::to_string(g.mesh.shard_size() - 1) + ".bin";
  const fs::path p = g.damaged("corrupt", [&](const fs::path& d) {
    flip_byte(d / last, std::int64_t(fs::file_size(d / last) / 2));
  });
  EXPECT_LOAD_ERROR(p, (p / last).string(), "is corrupt");
  EXPECT_LOAD_ERROR(p, "crc32", "manifest records");
}

BOOST_AUTO_TEST_CASE(truncated_file) {
  Good g;
  const fs::path p = g.damaged("truncated", [&](const fs::path& d) {
    fs::resize_file(d / "shard-00000.bin", fs::file_size(d / "shard-00000.bin") / 3);
  });
  EXPECT_LOAD_ERROR(p, (p / "shard-00000.bin").string(), "(truncated)");
}

BOOST_AUTO_TEST_CASE(missing_file) {
  Good g;
  const fs::path p = g.damaged("missing-file", [&](const fs::path& d) { fs::remove(d / "shard-00000.bin"); });
  EXPECT_LOAD_ERROR(p, (p / "shard-00000.bin").string(), "is missing");
}

BOOST_AUTO_TEST_CASE(missing_manifest) {
  Good g;
  const fs::path p = g.damaged("missing-manifest", [&](const fs::path& d) { fs::remove(d / "manifest.json"); });
  EXPECT_LOAD_ERROR(p, (p / "manifest.json").string(), "is not a complete checkpoint");
}

BOOST_AUTO_TEST_CASE(unreadable_manifest) {
  Good g;
  // As root, permissions do not stop reads: a directory in the manifest's place does.
  const fs::path p = g.damaged("unreadable-manifest", [&](const fs::path& d) {
    fs::remove(d / "manifest.json");
    fs::create_directory(d / "manifest.json");
  });
  EXPECT_LOAD_ERROR(p, (p / "manifest.json").string(), "cannot read");
}

BOOST_AUTO_TEST_CASE(manifest_not_json) {
  Good g;
  const fs::path p = g.damaged("not-json", [&](const fs::path& d) { spit(d / "manifest.json", "{\"format\": "); });
  EXPECT_LOAD_ERROR(p, (p / "manifest.json").string(), "is not valid JSON");
}

BOOST_AUTO_TEST_CASE(unknown_format_version) {
  Good g;
  const fs::path p = g.damaged("version", [&](const fs::path& d) {
    auto j = nlohmann::json::parse(slurp(d / "manifest.json"));
    j["format_version"] = 99;
    spit(d / "manifest.json", j.dump());
  });
  EXPECT_LOAD_ERROR(p, (p / "manifest.json").string(), "format_version is 99");
}

BOOST_AUTO_TEST_CASE(manifest_edited_inconsistently) {
  Good g;
  const fs::path p = g.damaged("inconsistent", [&](const fs::path& d) {
    auto j = nlohmann::json::parse(slurp(d / "manifest.json"));
    j["units"][1]["params"][2]["tensors"]["master"]["pieces"][0]["start"] = 1;
    spit(d / "manifest.json", j.dump());
  });
  EXPECT_LOAD_ERROR(p, (p / "manifest.json").string(), "units[1].params[2].tensors.master.pieces[0].start");
}

BOOST_AUTO_TEST_CASE(manifest_of_another_model) {
  Good g;
  ModelCfg other;
  other.d = 48;
  Trainer t(g.mesh, "fp32", 1, other);
  const std::string e = error_of([&] { kshard::load_checkpoint(g.path, *t.model, *t.opt); });
  KSHARD_CHECK_ALL_MSG(mentions(e, (g.path / "manifest.json").string(), "is of another model") &&
                           mentions(e, "[64, 32] in the checkpoint", "[64, 48] in the model"),
                       "got: " << e);
}

BOOST_AUTO_TEST_CASE(missing_or_unreadable_directory) {
  Good g;
  const fs::path none = bad_dir("does-not-exist");
  EXPECT_LOAD_ERROR(none, none.string(), "does not exist");
  const fs::path file = g.damaged("a-file", [&](const fs::path& d) {
    fs::remove_all(d);
    spit(d, "not a directory");
  });
  EXPECT_LOAD_ERROR(file, file.string(), "is not a directory");
}

// A save that fails on one rank (disk full, injected after half its file)
// throws on every rank naming that file, removes the temporary directory, and
// leaves the previous checkpoint the latest and loadable.
BOOST_AUTO_TEST_CASE(disk_full_during_save) {
  Good g;
  const int victim = g.mesh.shard_size() - 1;  // a rank of replica 0: it writes
  ::setenv("KSHARD_CHECKPOINT_TEST_FAULT", ("enospc:" + std::to_string(victim) + ":2").c_str(), 1);
  g.t.train_step();
  const std::string e = error_of([&] { kshard::save_checkpoint(bad_dir("good"), 2, *g.t.model, *g.t.opt); });
  ::unsetenv("KSHARD_CHECKPOINT_TEST_FAULT");
  KSHARD_CHECK_ALL_MSG(mentions(e, "No space left on device", ".tmp-step-0000000002/shard-"), "got: " << e);
  KSHARD_CHECK_ALL(kshard::latest_checkpoint(bad_dir("good")) == kshard::checkpoint_path(bad_dir("good"), 1));
  KSHARD_CHECK_ALL(!fs::exists(bad_dir("good") / ".tmp-step-0000000002"));
  Trainer t(g.mesh, "fp32", 2);
  KSHARD_CHECK_ALL(kshard::load_latest_checkpoint(bad_dir("good"), *t.model, *t.opt)->step == 1);
}

BOOST_AUTO_TEST_CASE(steps_that_differ_between_ranks) {
  KSHARD_SKIP_IF(kt::world_size() < 2, "ranks cannot disagree at 1 rank");
  Good g;
  const std::string e = error_of(
      [&] { kshard::save_checkpoint(bad_dir("good"), 5 + kt::world_rank(), *g.t.model, *g.t.opt); });
  KSHARD_CHECK_ALL_MSG(e.find("ranks disagree on the step to save") != std::string::npos, "got: " << e);
}

// safetensors: a truncated file, a header that is not JSON, a missing tensor.
BOOST_AUTO_TEST_CASE(bad_safetensors) {
  Good g;
  const fs::path dir = bad_dir("st");
  if (kt::world_rank() == 0) fs::create_directories(dir);
  kt::world().barrier();
  const fs::path good = dir / "good.safetensors";
  kshard::export_safetensors(*g.t.model, good);
  const fs::path trunc = dir / "truncated.safetensors", garbage = dir / "garbage.safetensors";
  if (kt::world_rank() == 0) {
    fs::copy_file(good, trunc, fs::copy_options::overwrite_existing);
    fs::resize_file(trunc, fs::file_size(good) - 100);
    std::string s = slurp(good);
    s[8] = '#';  // the header's opening brace
    spit(garbage, s);
  }
  kt::world().barrier();
  auto import_error = [&](const fs::path& p, kshard::FsdpModel& m) {
    return error_of([&] { kshard::import_safetensors(m, p); });
  };
  std::string e = import_error(trunc, *g.t.model);
  KSHARD_CHECK_ALL_MSG(mentions(e, trunc.string(), "outside the"), "got: " << e);
  e = import_error(garbage, *g.t.model);
  KSHARD_CHECK_ALL_MSG(mentions(e, garbage.string(), "not valid JSON"), "got: " << e);
  e = import_error(dir / "none.safetensors", *g.t.model);
  KSHARD_CHECK_ALL_MSG(mentions(e, (dir / "none.safetensors").string(), "No such file"), "got: " << e);
  ModelCfg other;
  other.vocab = 80;
  Trainer t(g.mesh, "fp32", 1, other);
  e = import_error(good, *t.model);
  KSHARD_CHECK_ALL_MSG(mentions(e, good.string(), "'layers.0.weight' has shape [64, 32]"), "got: " << e);
}

KSHARD_TEST_SUITE_END()
