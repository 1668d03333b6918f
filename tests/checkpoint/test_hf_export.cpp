// Hugging Face export (kshard::export_hf). export_hf_for_python is the C++
// stage of checkpoint_hf_export -> checkpoint_hf_python_check: it trains two
// steps of a small Llama model (untied, and tied with grouped-query
// attention) and of a GPT-2 model (tied), exports each as config.json +
// model.safetensors, and writes next to them the token ids of a batch and
// kshard's logits for them (raw little-endian). hf_reference.py then runs
// Hugging Face's forward from the exported files alone, written in numpy
// after transformers' modeling_llama / modeling_gpt2, and compares.
// bad_hf_exports runs on every launch: a config that disagrees with the
// model is an error on every rank and writes nothing.
#include <kshard/testing/harness.hpp>

#include <fstream>

#include <kshard/checkpoint/hf_export.hpp>
#include <kshard/optim/fused_adam.hpp>
#include <kshard/train/generate.hpp>

#include "ckpt_test_util.hpp"
#include "hf_test_util.hpp"

namespace kt = kshard::testing;
using namespace ckpt_test;

namespace {

constexpr std::int64_t kV = 61, kD = 32, kL = 2, kH = 4, kFfn = 48, kSeq = 12, kBatch = 2;

struct Built {
  std::unique_ptr<kshard::FsdpModel> model;
  kshard::HfConfig config;
};

Built build(const kshard::DeviceMesh& mesh, const std::string& type, std::int64_t kv, bool tie) {
  kshard::HfConfig c;
  c.model_type = type;
  c.vocab = kV;
  c.hidden = kD;
  c.layers = kL;
  c.heads = kH;
  c.kv_heads = kv;
  c.intermediate = kFfn;
  c.max_positions = kSeq;
  c.rope_theta = 500.0;  // not the default: the reader must take it from config.json
  c.norm_eps = 1e-5;
  c.tie_word_embeddings = tie;
  return {hf_test::build_model(mesh, c), c};
}

std::vector<std::int32_t> batch_ids() {
  std::vector<std::int32_t> ids;
  for (std::int64_t i = 0; i < kBatch * kSeq; ++i) ids.push_back(std::int32_t((i * 37 + 11) % kV));
  return ids;
}

using hf_test::to_device;

// Two AdamW steps on next-token targets, so the exported weights are trained
// ones (not only the initialisation's laws).
void train_two_steps(kshard::FsdpModel& m) {
  kshard::AdamOptions ao;
  ao.lr = 1e-2f;
  kshard::FusedAdam adam(ao, m.mesh().shard_comm(), m.mesh().world());
  for (std::size_t i = 0; i < m.num_units(); ++i) adam.add_group(m.group(i));
  std::vector<std::int32_t> ids = batch_ids(), next(ids.size());
  for (std::size_t i = 0; i < ids.size(); ++i) next[i] = ids[(i + 1) % ids.size()];
  for (int s = 0; s < 2; ++s) {
    m.zero_grad();
    m.forward_backward_ce(to_device(ids), {kBatch, kSeq, 1}, to_device(next));
    adam.step(1.f);
    m.finish_optimizer_step();
  }
}

}  // namespace

KSHARD_TEST_SUITE(hf_export)

BOOST_AUTO_TEST_CASE(export_hf_for_python) {
  KSHARD_SKIP_IF(env("KSHARD_HF_STAGE") != "export", "run by checkpoint_hf_export");
  const auto mesh = make_mesh(kt::world(), launch_mesh(kt::world_size()));
  const fs::path dir = root() / "hf";
  fresh_dir(dir, kt::world());
  struct Case {
    const char* name;
    const char* type;
    std::int64_t kv;
    bool tie;
  };
  for (const Case& cs : {Case{"llama", "llama", 0, false}, Case{"llama_gqa_tied", "llama", 2, true},
                         Case{"gpt2", "gpt2", 0, true}}) {
    Built b = build(mesh, cs.type, cs.kv, cs.tie);
    train_two_steps(*b.model);
    // The untied Llama in files of at most 16 KiB of tensors (an index and
    // its shards, as transformers splits large models); the others in one.
    kshard::export_hf(*b.model, b.config, dir / cs.name, kshard::DType::f32,
                      std::string(cs.name) == "llama" ? 16 << 10 : 5'000'000'000);
    const std::vector<std::int32_t> ids = batch_ids();
    auto logits = Kokkos::create_mirror_view_and_copy(
        Kokkos::HostSpace(), b.model->forward(to_device(ids), {kBatch, kSeq, 1}));
    // kshard's greedy continuation of the first 3 ids (3 + 8 <= max_positions):
    // what transformers' generate() must reproduce token for token (run
    // where transformers is installed: tests/checkpoint/hf_transformers_check.py).
    kshard::GenerateOptions g;
    g.new_tokens = 8;
    g.context = kSeq;
    const std::vector<std::int32_t> gen =
        kshard::generate(*b.model, kt::world(), {ids.begin(), ids.begin() + 3}, g);
    const bool sharded = std::string(cs.name) == "llama";
    KSHARD_CHECK_ALL(fs::exists(dir / cs.name / "config.json") &&
                     fs::exists(dir / cs.name / "model.safetensors") != sharded &&
                     fs::exists(dir / cs.name / "model.safetensors.index.json") == sharded &&
                     !fs::exists(dir / cs.name / "model.safetensors.partial"));
    if (kt::world_rank() == 0) {
      hf_test::write_raw(dir / cs.name / "ids.i32", ids.data(), ids.size());
      hf_test::write_raw(dir / cs.name / "logits.f32", logits.data(), std::size_t(logits.extent(0)));
      std::ofstream(dir / cs.name / "batch.json") << "{\"batch\": " << kBatch << ", \"seq\": " << kSeq
                                                  << ", \"prompt\": 3}\n";
      hf_test::write_raw(dir / cs.name / "greedy.i32", gen.data(), gen.size());
    }
  }
}

BOOST_AUTO_TEST_CASE(bad_hf_exports) {
  const auto mesh = make_mesh(kt::world(), launch_mesh(kt::world_size()));
  const fs::path dir = root() / ("hf-bad-" + std::to_string(kt::world_size()));
  fresh_dir(dir, kt::world());
  const auto error_of = [&](kshard::FsdpModel& m, const kshard::HfConfig& c) {
    try {
      kshard::export_hf(m, c, dir / "out");
    } catch (const kshard::Error& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  Built llama = build(mesh, "llama", 2, false);
  kshard::HfConfig c = llama.config;
  c.layers = 3;
  std::string e = error_of(*llama.model, c);
  KSHARD_CHECK_ALL_MSG(e.find("units Embedding,LlamaLayer,LlamaLayer,LlamaLayer,RMSNorm,Linear") !=
                           std::string::npos, e);
  c = llama.config;
  c.tie_word_embeddings = true;
  e = error_of(*llama.model, c);
  KSHARD_CHECK_ALL_MSG(e.find("tie_word_embeddings true in the config") != std::string::npos, e);
  c = llama.config;
  c.kv_heads = 4;  // the model has 2: its qkv weight has other rows
  e = error_of(*llama.model, c);
  KSHARD_CHECK_ALL_MSG(e.find("attn.qkv.weight is [64, 32]") != std::string::npos, e);
  c = llama.config;
  c.model_type = "gpt2";
  e = error_of(*llama.model, c);
  KSHARD_CHECK_ALL_MSG(e.find("tie_word_embeddings (GPT2LMHeadModel") != std::string::npos, e);
  c = llama.config;
  c.model_type = "bert";
  e = error_of(*llama.model, c);
  KSHARD_CHECK_ALL_MSG(e.find("llama or gpt2") != std::string::npos, e);
  KSHARD_CHECK_ALL(!fs::exists(dir / "out" / "model.safetensors") &&
                   !fs::exists(dir / "out" / "config.json"));
}

KSHARD_TEST_SUITE_END()
