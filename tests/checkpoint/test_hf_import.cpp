// Hugging Face import (kshard::import_hf).
// - export_then_import_is_exact (every launch): export_hf then import_hf into
//   a model initialised otherwise gives back every master value bitwise (f32,
//   one file or an index and its shards) or its bf16 rounding (bf16), for
//   Llama (untied; tied with grouped-query attention) and GPT-2.
// - folders_from_python (stage of checkpoint_hf_import, on a [2, 2] mesh):
//   folders that kshard did not write — Python's safetensors with
//   hf_reference.py's numpy forward (tests/checkpoint/hf_reference.py make),
//   and, where CI installed it, transformers' own save_pretrained with its
//   logits and greedy generate() (hf_transformers_check.py make) — imported
//   must give those logits to 1e-4 relative to the largest one and the same
//   greedy tokens from kshard::generate.
// - bad_folders_change_nothing (same stage): a missing tensor, another shape,
//   an unsupported architecture or rope scaling, a config that disagrees, a
//   truncated file, ...: a kshard::Error on every rank naming it, and the
//   model's parameters unchanged.
#include <kshard/testing/harness.hpp>

#include <cmath>
#include <sstream>

#include <kshard/checkpoint/hf_export.hpp>
#include <kshard/checkpoint/hf_import.hpp>
#include <kshard/train/generate.hpp>

#include "ckpt_test_util.hpp"
#include "hf_test_util.hpp"

namespace kt = kshard::testing;
using namespace ckpt_test;

namespace {

std::vector<std::vector<float>> masters(const kshard::FsdpModel& m) {
  std::vector<std::vector<float>> out;
  for (std::size_t u = 0; u < m.num_units(); ++u) out.push_back(m.group(u).gather_master());
  return out;
}

kshard::HfConfig small(const std::string& type, std::int64_t kv, bool tie) {
  kshard::HfConfig c;
  c.model_type = type;
  c.vocab = 53;
  c.hidden = 32;
  c.layers = 2;
  c.heads = 4;
  c.kv_heads = kv;
  c.intermediate = 40;
  c.max_positions = 10;
  c.rope_theta = 1000.0;
  c.norm_eps = 1e-6;
  c.tie_word_embeddings = tie;
  return c;
}

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string part;
  while (std::getline(ss, part, ','))
    if (!part.empty()) out.push_back(part);
  return out;
}

}  // namespace

KSHARD_TEST_SUITE(hf_import)

BOOST_AUTO_TEST_CASE(export_then_import_is_exact) {
  const auto mesh = make_mesh(kt::world(), launch_mesh(kt::world_size()));
  const fs::path dir = root() / ("hf-roundtrip-" + mesh_name(launch_mesh(kt::world_size())));
  fresh_dir(dir, kt::world());
  for (const kshard::HfConfig& c : {small("llama", 0, false), small("llama", 2, true), small("gpt2", 0, true)}) {
    const auto a = hf_test::build_model(mesh, c, 7);
    const auto b = hf_test::build_model(mesh, c, 8);
    const std::string name = c.model_type + (c.tie_word_embeddings ? "_tied" : "");
    kshard::export_hf(*a, c, dir / name);
    kshard::import_hf(*b, c, dir / name);
    const auto want = masters(*a);
    KSHARD_CHECK_ALL_MSG(masters(*b) == want, name + ": f32 export -> import is not bitwise");
    kshard::export_hf(*a, c, dir / (name + "_bf16"), kshard::DType::bf16);
    kshard::import_hf(*b, c, dir / (name + "_bf16"));
    const auto got = masters(*b);
    bool rounded = true;
    for (std::size_t u = 0; u < want.size(); ++u)
      for (std::size_t k = 0; k < want[u].size(); ++k)
        rounded = rounded && got[u][k] == kshard::to_float(kshard::from_float<kshard::bfloat16_t>(want[u][k]));
    KSHARD_CHECK_ALL_MSG(rounded, name + ": bf16 export -> import is not the bf16 rounding");
    // Files of at most 4 KiB of tensors: an index and its shards (a tensor
    // above the limit alone in its file); exported again into the same
    // directory unsharded, the index and shards are gone.
    const fs::path sh = dir / (name + "_sharded");
    kshard::export_hf(*a, c, sh, kshard::DType::f32, 4096);
    kshard::import_hf(*b, c, sh);
    KSHARD_CHECK_ALL_MSG(masters(*b) == want, name + ": sharded export -> import is not bitwise");
    KSHARD_CHECK_ALL(fs::exists(sh / "model.safetensors.index.json") && !fs::exists(sh / "model.safetensors"));
    std::size_t shards = 0;
    for (const auto& f : fs::directory_iterator(sh)) shards += f.path().filename().string().rfind("model-", 0) == 0;
    const nlohmann::json index = nlohmann::json::parse(std::ifstream(sh / "model.safetensors.index.json"));
    KSHARD_CHECK_ALL_MSG(shards > 2 && index["weight_map"].contains("model.norm.weight") == (c.model_type == "llama"),
                         name + ": " + std::to_string(shards) + " shard files");
    kshard::export_hf(*a, c, sh);
    std::size_t left = 0;
    for (const auto& f : fs::directory_iterator(sh)) left += f.path().filename().string().rfind("model-", 0) == 0;
    KSHARD_CHECK_ALL(left == 0 && !fs::exists(sh / "model.safetensors.index.json") &&
                     fs::exists(sh / "model.safetensors"));
    kshard::import_hf(*b, c, sh);
    KSHARD_CHECK_ALL(masters(*b) == want);
  }
}

BOOST_AUTO_TEST_CASE(folders_from_python) {
  KSHARD_SKIP_IF(env("KSHARD_HF_STAGE") != "import", "run by checkpoint_hf_import");
  const auto mesh = make_mesh(kt::world(), launch_mesh(kt::world_size()));
  const std::vector<std::string> dirs = split(env("KSHARD_HF_IMPORT_DIRS"));
  KSHARD_CHECK_ALL(!dirs.empty());
  for (const std::string& d : dirs) {
    kshard::HfConfig c = kshard::read_hf_config(d);
    const nlohmann::json b = nlohmann::json::parse(std::ifstream(fs::path(d) / "batch.json"));
    const std::int64_t batch = b["batch"], seq = b["seq"], prompt = b["prompt"];
    c.max_positions = seq;  // GPT-2: the model's table takes the file's first rows
    const auto m = hf_test::build_model(mesh, c, 3);
    kshard::import_hf(*m, c, d);
    const auto ids = hf_test::read_raw<std::int32_t>(fs::path(d) / "ids.i32");
    const auto want = hf_test::read_raw<float>(fs::path(d) / "logits.f32");
    auto got = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(),
                                                   m->forward(hf_test::to_device(ids), {batch, seq, 1}));
    KSHARD_CHECK_ALL(std::size_t(got.extent(0)) == want.size());
    double err = 0, scale = 0;
    for (std::size_t k = 0; k < want.size(); ++k) {
      err = std::max(err, std::abs(double(got(k)) - want[k]));
      scale = std::max(scale, std::abs(double(want[k])));
    }
    BOOST_TEST_MESSAGE(d << ": " << c.model_type << " logits max |diff| / max |logit| = " << err / scale);
    KSHARD_CHECK_ALL_MSG(err <= 1e-4 * scale, d + ": logits differ by " + std::to_string(err / scale));
    const auto greedy = hf_test::read_raw<std::int32_t>(fs::path(d) / "greedy.i32");
    kshard::GenerateOptions g;
    g.new_tokens = int(greedy.size());
    g.context = seq;
    const auto gen = kshard::generate(*m, kt::world(), {ids.begin(), ids.begin() + prompt}, g);
    KSHARD_CHECK_ALL_MSG(gen == greedy, d + ": greedy continuation differs");
  }
}

BOOST_AUTO_TEST_CASE(bad_folders_change_nothing) {
  KSHARD_SKIP_IF(env("KSHARD_HF_STAGE") != "import", "run by checkpoint_hf_import");
  const auto mesh = make_mesh(kt::world(), launch_mesh(kt::world_size()));
  const fs::path made = env("KSHARD_HF_MADE");
  kshard::HfConfig c = kshard::read_hf_config(made / "np_llama");
  c.max_positions = 12;
  const auto m = hf_test::build_model(mesh, c, 5);
  const auto before = masters(*m);
  const std::pair<const char*, const char*> cases[] = {
      {"missing_tensor", "has no tensor 'model.layers.1.self_attn.k_proj.weight'"},
      {"wrong_shape", "tensor 'model.layers.0.mlp.up_proj.weight' is [32, 48]"},
      {"extra_tensor", "has tensor 'model.layers.0.self_attn.q_norm.weight' [8], which kshard's llama model has no place for"},
      {"int_tensor", "tensor 'model.norm.weight' is I32"},
      {"architecture", "model_type is 'mistral'"},
      {"rope_scaling", "rope type 'linear'"},
      {"disagrees", "num_key_value_heads is 4 but the model's is 2"},
      {"biases", "attention_bias is true"},
      {"truncated", "(truncated?)"},
      {"no_weights", "has no model.safetensors or model.safetensors.index.json"},
      {"missing_shard", "model-00002-of-00002.safetensors"},
      {"no_config", "cannot read Hugging Face config"}};
  for (const auto& [name, needle] : cases) {
    std::string e = "(no error)";
    try {
      kshard::import_hf(*m, c, made / "bad" / name);
    } catch (const kshard::Error& err) {
      e = err.what();
    }
    BOOST_TEST_MESSAGE(name << ": " << e);
    KSHARD_CHECK_ALL_MSG(e.find(needle) != std::string::npos, std::string(name) + ": " + e);
  }
  KSHARD_CHECK_ALL_MSG(masters(*m) == before, "a failed import changed the model");
}

KSHARD_TEST_SUITE_END()
