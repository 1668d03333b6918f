// Consolidated safetensors export/import. roundtrip_cpp runs on every launch;
// export_for_python and import_from_python are the C++ stages of the round
// trip through Python's own safetensors package (safetensors_check.py):
//   checkpoint_st_export (2 ranks)  -> model.safetensors (f32), model.bf16.safetensors,
//                                      reference.f32 + reference.json (the master, raw)
//   checkpoint_st_python_check      -> Python checks names/shapes/values, writes
//                                      python.safetensors (f32) and python_f16.safetensors
//   checkpoint_st_import ([2, 2])   -> imports both, re-exports them (roundtrip*.safetensors);
//                                      imports model.safetensors and checks it bitwise
//   checkpoint_st_python_compare    -> Python: the re-exports equal what it wrote
#include <kshard_test/gathers.hpp>
#include <kshard/testing/harness.hpp>

#include "ckpt_test_util.hpp"
#include "kshard/checkpoint/safetensors.hpp"

namespace kt = kshard::testing;
using namespace ckpt_test;

namespace {

fs::path st_dir() { return root() / "st"; }

/// The master of the model as "<unit>.<param>" -> values, in model order.
std::vector<std::pair<std::string, std::vector<float>>> named_master(kshard::FsdpModel& m) {
  const auto full = kshard::test::gather_master_parameters(m);
  std::vector<std::pair<std::string, std::vector<float>>> out;
  for (std::size_t u = 0; u < m.num_units(); ++u)
    for (const auto& e : m.group(u).index().entries())
      out.emplace_back(m.group(u).name() + "." + e.name,
                       std::vector<float>(full[u].begin() + e.offset, full[u].begin() + e.offset + e.numel));
  return out;
}

}  // namespace

KSHARD_TEST_SUITE(safetensors)

// Export f32 and bf16 on this mesh, import into a model initialised
// differently: f32 is bitwise, bf16 is the master rounded to nearest even.
BOOST_AUTO_TEST_CASE(roundtrip_cpp) {
  const auto shape = launch_mesh(kt::world_size());
  const auto mesh = make_mesh(kt::world(), shape);
  const fs::path dir = root() / ("mesh-" + mesh_name(shape)) / "st";
  fresh_dir(dir, kt::world());
  Trainer a(mesh, "bf16", 41);
  a.train_step();
  kshard::export_safetensors(*a.model, dir / "m.safetensors");
  kshard::export_safetensors(*a.model, dir / "m.bf16.safetensors", kshard::DType::bf16, {{"note", "test"}});
  const auto h = kshard::read_safetensors_header(dir / "m.bf16.safetensors");
  KSHARD_CHECK_ALL(h.data_start % 8 == 0 && h.metadata.at("note") == "test" &&
                   h.metadata.at("format") == "pt" && h.tensors.size() == 2 + 12 + 2 + 2);
  KSHARD_CHECK_ALL(!fs::exists(dir / "m.safetensors.partial"));
  Trainer b(mesh, "fp32", 42);
  kshard::import_safetensors(*b.model, dir / "m.safetensors");
  std::string why;
  KSHARD_CHECK_ALL_MSG(same_bits(kshard::test::gather_master_parameters(*b.model), kshard::test::gather_master_parameters(*a.model),
                                 why, "master"),
                       why);
  kshard::import_safetensors(*b.model, dir / "m.bf16.safetensors");
  auto rounded = kshard::test::gather_master_parameters(*a.model);
  for (auto& u : rounded)
    for (auto& x : u) x = kshard::to_float(kshard::from_float<kshard::bfloat16_t>(x));
  KSHARD_CHECK_ALL_MSG(same_bits(kshard::test::gather_master_parameters(*b.model), rounded, why, "bf16 master"), why);
}

BOOST_AUTO_TEST_CASE(export_for_python) {
  KSHARD_SKIP_IF(env("KSHARD_ST_STAGE") != "export", "run by checkpoint_st_export");
  const auto mesh = make_mesh(kt::world(), launch_mesh(kt::world_size()));
  fresh_dir(st_dir(), kt::world());
  Trainer a(mesh, "fp32", 51);
  a.train_step();
  a.train_step();
  kshard::export_safetensors(*a.model, st_dir() / "model.safetensors");
  kshard::export_safetensors(*a.model, st_dir() / "model.bf16.safetensors", kshard::DType::bf16);
  // The reference, through another path (gather_master_parameters) and
  // format (raw f32 + a JSON index) than the exporter's.
  const auto named = named_master(*a.model);
  if (kt::world_rank() == 0) {
    std::ofstream raw(st_dir() / "reference.f32", std::ios::binary);
    nlohmann::json index = nlohmann::json::array();
    std::int64_t at = 0;
    for (std::size_t u = 0, k = 0; u < a.model->num_units(); ++u)
      for (const auto& e : a.model->group(u).index().entries()) {
        const auto& [name, values] = named[k++];
        raw.write(reinterpret_cast<const char*>(values.data()), std::streamsize(values.size() * 4));
        index.push_back({{"name", name}, {"shape", e.shape}, {"offset", at}, {"layer", a.model->layer_kind(u)}});
        at += e.numel;
      }
    std::ofstream(st_dir() / "reference.json") << index.dump(1);
  }
  KSHARD_CHECK_ALL(fs::exists(st_dir() / "model.safetensors"));
}

BOOST_AUTO_TEST_CASE(import_from_python) {
  KSHARD_SKIP_IF(env("KSHARD_ST_STAGE") != "import", "run by checkpoint_st_import");
  const auto mesh = make_mesh(kt::world(), launch_mesh(kt::world_size()));
  Trainer t(mesh, "bf16", 61);  // another mesh, another recipe: the master is f32 anyway
  for (const std::string name : {"python", "python_f16"}) {
    kshard::import_safetensors(*t.model, st_dir() / (name + ".safetensors"));
    kshard::export_safetensors(*t.model, st_dir() / ("roundtrip_" + name + ".safetensors"));
  }
  // C++ -> C++ across meshes: model.safetensors (written at 2 ranks) is the reference.
  kshard::import_safetensors(*t.model, st_dir() / "model.safetensors");
  std::ifstream raw(st_dir() / "reference.f32", std::ios::binary);
  bool same = true;
  for (const auto& [name, values] : named_master(*t.model)) {
    std::vector<float> want(values.size());
    raw.read(reinterpret_cast<char*>(want.data()), std::streamsize(want.size() * 4));
    same = same && std::memcmp(want.data(), values.data(), values.size() * 4) == 0;
  }
  KSHARD_CHECK_ALL(same && bool(raw));
}

KSHARD_TEST_SUITE_END()
