// Save/load round trips on this launch's mesh: every recipe, exact resume,
// a recipe change, moment dtype conversion, keep-last-K and the latest lookup.
#include <kshard_test/gathers.hpp>
#include <kshard/testing/harness.hpp>

#include <boost/test/data/monomorphic.hpp>
#include <boost/test/data/test_case.hpp>

#include "ckpt_test_util.hpp"

namespace kt = kshard::testing;
namespace bdata = boost::unit_test::data;
using namespace ckpt_test;

namespace {

fs::path here(const std::string& what) {
  return launch_dir(kt::world_size(), what);
}

}  // namespace

KSHARD_TEST_SUITE(roundtrip)

// Train 2 steps, save, load into a model initialised differently: the whole
// state (master, both moments, step count) is bitwise the saved one, the
// trainer state comes back, and one more step gives the same loss and state.
BOOST_DATA_TEST_CASE(every_recipe, bdata::make(all_recipes()), recipe) {
  const auto mesh = make_mesh(kt::world(), launch_mesh(kt::world_size()));
  const fs::path dir = here("roundtrip-" + recipe);
  fresh_dir(dir, kt::world());
  Trainer a(mesh, recipe, 1);
  a.train_step();
  a.train_step();
  const kshard::SaveInfo si = kshard::save_checkpoint(dir, a.step, *a.model, *a.opt, a.user_state());
  KSHARD_CHECK_ALL(si.path == kshard::checkpoint_path(dir, 2) && fs::is_directory(si.path));
  KSHARD_CHECK_ALL(si.total_bytes > 0);
  const FullState saved = full_state(a);

  Trainer b(mesh, recipe, 99);
  const kshard::LoadInfo li = kshard::load_checkpoint(si.path, *b.model, *b.opt);
  b.restore(li.user_state);
  std::string why;
  KSHARD_CHECK_ALL_MSG(same_state(full_state(b), saved, why), recipe << ": " << why);
  KSHARD_CHECK_ALL(li.step == 2 && b.step == 2 && li.user_state == a.user_state());
  KSHARD_CHECK_ALL(!li.recipe_changed && !li.resharded && li.optimizer_loaded && !li.moments_converted);
  KSHARD_CHECK_ALL(li.saved_recipe == a.model->recipe().describe());
  KSHARD_CHECK_ALL(li.saved_mesh == mesh.shape() && li.saved_world_size == kt::world_size());

  const double la = a.train_step(), lb = b.train_step();
  KSHARD_CHECK_ALL_MSG(std::memcmp(&la, &lb, 8) == 0, recipe << ": loss " << la << " vs " << lb);
  KSHARD_CHECK_ALL_MSG(same_state(full_state(b), full_state(a), why), recipe << " after a step: " << why);
}

// K steps + save + resume for L steps == K + L uninterrupted steps, bitwise:
// losses per rank and the final state.
BOOST_DATA_TEST_CASE(resume_is_bitwise, bdata::make(all_recipes()), recipe) {
  const auto mesh = make_mesh(kt::world(), launch_mesh(kt::world_size()));
  const fs::path dir = here("resume-" + recipe);
  fresh_dir(dir, kt::world());
  constexpr int K = 3, L = 4;
  Trainer a(mesh, recipe, 5);
  for (int s = 0; s < K; ++s) a.train_step();
  kshard::save_checkpoint(dir, a.step, *a.model, *a.opt, a.user_state());
  std::vector<double> la;
  for (int s = 0; s < L; ++s) la.push_back(a.train_step());

  Trainer b(mesh, recipe, 6);
  const auto li = kshard::load_latest_checkpoint(dir, *b.model, *b.opt);
  KSHARD_REQUIRE_ALL(li.has_value());
  b.restore(li->user_state);
  std::vector<double> lb;
  for (int s = 0; s < L; ++s) lb.push_back(b.train_step());
  KSHARD_CHECK_ALL_MSG(std::memcmp(la.data(), lb.data(), sizeof(double) * L) == 0,
                       recipe << ": resumed losses differ (first: " << la[0] << " vs " << lb[0] << ")");
  std::string why;
  KSHARD_CHECK_ALL_MSG(same_state(full_state(b), full_state(a), why), recipe << ": " << why);
}

// Saved under bf16, loaded under fp32 (and back): the f32 master carries
// over exactly and load says the recipe changed.
BOOST_AUTO_TEST_CASE(recipe_change_is_reported) {
  const auto mesh = make_mesh(kt::world(), launch_mesh(kt::world_size()));
  const fs::path dir = here("recipe-change");
  fresh_dir(dir, kt::world());
  Trainer a(mesh, "bf16", 3);
  a.train_step();
  const auto si = kshard::save_checkpoint(dir, 1, *a.model, a.user_state());  // model only
  Trainer b(mesh, "fp32", 4);
  const auto li = kshard::load_checkpoint(si.path, *b.model);
  KSHARD_CHECK_ALL(li.recipe_changed && li.saved_recipe == "bf16" && !li.optimizer_loaded);
  std::string why;
  KSHARD_CHECK_ALL_MSG(same_bits(kshard::test::gather_master_parameters(*b.model),
                                 kshard::test::gather_master_parameters(*a.model), why, "master"),
                       why);
  // A model-only checkpoint has no optimizer state to give.
  const std::string e = error_of([&] { kshard::load_checkpoint(si.path, *b.model, *b.opt); });
  KSHARD_CHECK_ALL_MSG(e.find("holds no optimizer state") != std::string::npos &&
                           e.find("manifest.json") != std::string::npos,
                       "got: " << e);
}

// f32 moments loaded into an optimizer that keeps bf16 moments: rounded to
// nearest even, reported.
BOOST_AUTO_TEST_CASE(moment_dtype_conversion) {
  const auto mesh = make_mesh(kt::world(), launch_mesh(kt::world_size()));
  const fs::path dir = here("moments");
  fresh_dir(dir, kt::world());
  Trainer a(mesh, "fp32", 3);  // f32 moments
  a.train_step();
  const auto si = kshard::save_checkpoint(dir, 1, *a.model, *a.opt);
  Trainer b(mesh, "bf16", 4);  // bf16 moments
  const auto li = kshard::load_checkpoint(si.path, *b.model, *b.opt);
  KSHARD_CHECK_ALL(li.moments_converted && li.saved_moment_dtype == "f32" && li.recipe_changed);
  const FullState sa = full_state(a), sb = full_state(b);
  bool ok = true;
  for (std::size_t u = 0; u < sa.m.size(); ++u)
    for (std::size_t i = 0; i < sa.m[u].size(); ++i)
      ok = ok && kshard::from_float<kshard::bfloat16_t>(sa.m[u][i]).bits ==
                     kshard::from_float<kshard::bfloat16_t>(sb.m[u][i]).bits &&
           kshard::to_float(kshard::from_float<kshard::bfloat16_t>(sa.m[u][i])) == sb.m[u][i];
  KSHARD_CHECK_ALL(ok);
}

// keep_last: only the newest K complete checkpoints stay; latest/list see them;
// re-saving a step replaces it.
BOOST_AUTO_TEST_CASE(keep_last_and_latest) {
  const auto mesh = make_mesh(kt::world(), launch_mesh(kt::world_size()));
  const fs::path dir = here("keep-last");
  fresh_dir(dir, kt::world());
  KSHARD_CHECK_ALL(!kshard::latest_checkpoint(dir).has_value());
  Trainer a(mesh, "fp32", 8);
  Trainer b(mesh, "fp32", 9);
  KSHARD_CHECK_ALL(!kshard::load_latest_checkpoint(dir, *b.model, *b.opt).has_value());
  kshard::SaveOptions so;
  so.keep_last = 2;
  so.crc_block_bytes = 1000;  // many blocks, not a multiple of the element sizes
  for (int s = 1; s <= 4; ++s) {
    a.train_step();
    kshard::save_checkpoint(dir, s, *a.model, *a.opt, a.user_state(), so);
  }
  const auto all = kshard::list_checkpoints(dir);
  KSHARD_CHECK_ALL(all.size() == 2 && all[0] == kshard::checkpoint_path(dir, 3) &&
                   all[1] == kshard::checkpoint_path(dir, 4));
  KSHARD_CHECK_ALL(kshard::latest_checkpoint(dir) == kshard::checkpoint_path(dir, 4));
  a.train_step();
  kshard::save_checkpoint(dir, 4, *a.model, *a.opt, a.user_state(), so);  // replaces step 4
  const auto li = kshard::load_latest_checkpoint(dir, *b.model, *b.opt);
  std::string why;
  KSHARD_CHECK_ALL(li && li->step == 4 && li->user_state.at("data_step") == 5);
  KSHARD_CHECK_ALL_MSG(same_state(full_state(b), full_state(a), why), why);
  KSHARD_CHECK_ALL(kshard::list_checkpoints(dir).size() == 2);
}

// Under HSDP only replica 0 writes: one data file per shard rank, and the
// bytes are those of the parameters, once (no padding, no duplicates).
BOOST_AUTO_TEST_CASE(one_copy_of_each_byte) {
  const auto mesh = make_mesh(kt::world(), launch_mesh(kt::world_size()));
  const fs::path dir = here("bytes");
  fresh_dir(dir, kt::world());
  Trainer a(mesh, "fp32", 8);
  const auto si = kshard::save_checkpoint(dir, 0, *a.model, *a.opt);
  const std::uint64_t expected = std::uint64_t(a.model->num_parameters()) * 12;  // master + 2 moments
  KSHARD_CHECK_ALL_MSG(si.total_bytes == expected, si.total_bytes << " vs " << expected);
  std::size_t files = 0;
  for (const auto& e : fs::directory_iterator(si.path))
    files += e.path().extension() == ".bin" ? 1 : 0;
  KSHARD_CHECK_ALL(files == std::size_t(mesh.shard_size()));
  const bool writes = mesh.ndim() == 1 || mesh.coord(0) == 0;
  KSHARD_CHECK_ALL(writes || si.bytes_written == 0);
}

KSHARD_TEST_SUITE_END()
