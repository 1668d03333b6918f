#include "kshard/checkpoint/hf_export.hpp"

#include <fstream>
#include <map>
#include <vector>

#include <nlohmann/json.hpp>

#include "kshard/error.hpp"
#include "kshard/mesh/agree.hpp"
#include "safetensors_layout.hpp"

namespace kshard {
namespace fs = std::filesystem;
using nlohmann::json;
using detail::ExportPiece;

namespace {

[[noreturn]] void bad(const std::string& what, const std::string& expected) {
  throw Error("export_hf: " + what, expected);
}

// The unit kinds the config's model has, in order.
std::vector<std::string> expected_kinds(const HfConfig& c) {
  const bool llama = c.model_type == "llama";
  std::vector<std::string> k{"Embedding"};
  for (std::int64_t l = 0; l < c.layers; ++l) k.push_back(llama ? "LlamaLayer" : "TransformerLayer");
  k.push_back(llama ? "RMSNorm" : "LayerNorm");
  k.push_back("Linear");
  return k;
}

void check(const FsdpModel& model, const HfConfig& c) {
  if (c.model_type != "llama" && c.model_type != "gpt2")
    bad("model_type '" + c.model_type + "'", "llama or gpt2");
  if (c.vocab < 1 || c.hidden < 1 || c.layers < 1 || c.heads < 1 || c.hidden % c.heads != 0 ||
      c.kv_heads < 0 || (c.kv_heads && c.heads % c.kv_heads != 0) || c.intermediate < 1 ||
      c.max_positions < 1 || !(c.norm_eps > 0))
    bad("config with vocab " + std::to_string(c.vocab) + ", hidden " + std::to_string(c.hidden) +
            ", layers " + std::to_string(c.layers) + ", heads " + std::to_string(c.heads) + "/" +
            std::to_string(c.kv_heads) + ", intermediate " + std::to_string(c.intermediate) +
            ", max_positions " + std::to_string(c.max_positions),
        "positive sizes, heads dividing hidden, kv_heads dividing heads, norm_eps > 0");
  if (c.model_type == "gpt2" && (!c.tie_word_embeddings || c.kv_heads != 0))
    bad("gpt2 without tied embeddings or with kv_heads",
        "tie_word_embeddings (GPT2LMHeadModel's head is the token table) and kv_heads 0");
  const std::vector<std::string> kinds = expected_kinds(c);
  std::string have, want;
  for (std::size_t u = 0; u < model.num_units(); ++u) have += (u ? "," : "") + model.layer_kind(u);
  for (std::size_t u = 0; u < kinds.size(); ++u) want += (u ? "," : "") + kinds[u];
  if (have != want)
    bad("a model of units " + have + " for a " + c.model_type + " config of " +
            std::to_string(c.layers) + " layers",
        "units " + want);
  if (model.options().tie_word_embeddings != c.tie_word_embeddings)
    bad(std::string("tie_word_embeddings ") + (c.tie_word_embeddings ? "true" : "false") +
            " in the config, " + (model.options().tie_word_embeddings ? "true" : "false") +
            " in the model",
        "the model's own setting (FsdpOptions::tie_word_embeddings)");
}

// Hugging Face's pieces of kshard tensor (unit, entry).
std::vector<ExportPiece> hf_pieces(const HfConfig& c, std::size_t unit, const ParamEntry& e) {
  const bool llama = c.model_type == "llama";
  const std::int64_t d = c.hidden, L = c.layers, hd = c.hidden / c.heads;
  const std::int64_t kv = (c.kv_heads ? c.kv_heads : c.heads) * hd;
  const std::int64_t rows = e.shape.empty() ? 1 : e.shape[0];
  const auto whole = [&](std::string name) {
    return std::vector<ExportPiece>{{std::move(name), e.shape, 0, rows, false}};
  };
  // A Linear weight [out, in] as GPT-2's Conv1D [in, out].
  const auto conv1d = [&](std::string name) {
    return std::vector<ExportPiece>{{std::move(name), {e.shape.at(1), e.shape.at(0)}, 0, rows, true}};
  };
  const auto expect_shape = [&](std::vector<std::int64_t> s) {
    if (e.shape != s)
      bad("unit " + std::to_string(unit) + "'s " + e.name + " is " + shape_text(e.shape),
          shape_text(s) + " for the config (" + c.model_type + ")");
  };
  if (unit == 0) {
    if (e.name == "weight") {
      expect_shape({c.vocab, d});
      return whole(llama ? "model.embed_tokens.weight" : "transformer.wte.weight");
    }
    if (e.name == "position" && !llama) {
      expect_shape({c.max_positions, d});
      return whole("transformer.wpe.weight");
    }
  } else if (std::int64_t(unit) <= L) {
    const std::string p = (llama ? "model.layers." : "transformer.h.") + std::to_string(unit - 1) + ".";
    if (llama) {
      if (e.name == "norm1.gamma") return whole(p + "input_layernorm.weight");
      if (e.name == "mlp.norm.gamma") return whole(p + "post_attention_layernorm.weight");
      if (e.name == "attn.proj.weight") return whole(p + "self_attn.o_proj.weight");
      if (e.name == "mlp.down.weight") return whole(p + "mlp.down_proj.weight");
      if (e.name == "attn.qkv.weight") {
        expect_shape({d + 2 * kv, d});
        return {{p + "self_attn.q_proj.weight", {d, d}, 0, d, false},
                {p + "self_attn.k_proj.weight", {kv, d}, d, d + kv, false},
                {p + "self_attn.v_proj.weight", {kv, d}, d + kv, d + 2 * kv, false}};
      }
      if (e.name == "mlp.gate_up.weight") {
        const std::int64_t f = c.intermediate;
        expect_shape({2 * f, d});
        return {{p + "mlp.gate_proj.weight", {f, d}, 0, f, false},
                {p + "mlp.up_proj.weight", {f, d}, f, 2 * f, false}};
      }
    } else {
      static const std::map<std::string, std::string> vectors = {
          {"ln1.gamma", "ln_1.weight"},     {"ln1.beta", "ln_1.bias"},
          {"attn.qkv.bias", "attn.c_attn.bias"}, {"attn.proj.bias", "attn.c_proj.bias"},
          {"mlp.ln.gamma", "ln_2.weight"},  {"mlp.ln.beta", "ln_2.bias"},
          {"mlp.fc1.bias", "mlp.c_fc.bias"}, {"mlp.fc2.bias", "mlp.c_proj.bias"}};
      static const std::map<std::string, std::string> matrices = {
          {"attn.qkv.weight", "attn.c_attn.weight"}, {"attn.proj.weight", "attn.c_proj.weight"},
          {"mlp.fc1.weight", "mlp.c_fc.weight"},     {"mlp.fc2.weight", "mlp.c_proj.weight"}};
      if (const auto it = vectors.find(e.name); it != vectors.end()) return whole(p + it->second);
      if (const auto it = matrices.find(e.name); it != matrices.end()) {
        if (e.name == "mlp.fc1.weight") expect_shape({c.intermediate, d});
        return conv1d(p + it->second);
      }
    }
  } else if (std::int64_t(unit) == L + 1) {
    if (e.name == "gamma") return whole(llama ? "model.norm.weight" : "transformer.ln_f.weight");
    if (e.name == "beta" && !llama) return whole("transformer.ln_f.bias");
  } else if (e.name == "weight" && llama) {  // an untied head (a tied one has no weight here)
    expect_shape({c.vocab, d});
    return whole("lm_head.weight");
  }
  bad("unit " + std::to_string(unit) + " (" + std::to_string(rows) + " rows) has parameter '" +
          e.name + "', which a " + c.model_type + " model has no place for",
      "the parameters of Hugging Face's " +
          std::string(llama ? "LlamaForCausalLM (no biases)" : "GPT2LMHeadModel (a head without bias)"));
}

json config_json(const HfConfig& c, DType dtype) {
  const char* torch_dtype = dtype == DType::bf16 ? "bfloat16" : "float32";
  if (c.model_type == "llama")
    return {{"architectures", {"LlamaForCausalLM"}},
            {"model_type", "llama"},
            {"vocab_size", c.vocab},
            {"hidden_size", c.hidden},
            {"intermediate_size", c.intermediate},
            {"num_hidden_layers", c.layers},
            {"num_attention_heads", c.heads},
            {"num_key_value_heads", c.kv_heads ? c.kv_heads : c.heads},
            {"head_dim", c.hidden / c.heads},
            {"hidden_act", "silu"},
            {"max_position_embeddings", c.max_positions},
            {"rms_norm_eps", c.norm_eps},
            {"rope_theta", c.rope_theta},
            {"attention_bias", false},
            {"mlp_bias", false},
            {"tie_word_embeddings", c.tie_word_embeddings},
            {"torch_dtype", torch_dtype}};
  return {{"architectures", {"GPT2LMHeadModel"}},
          {"model_type", "gpt2"},
          {"vocab_size", c.vocab},
          {"n_embd", c.hidden},
          {"n_layer", c.layers},
          {"n_head", c.heads},
          {"n_inner", c.intermediate},
          {"n_positions", c.max_positions},
          {"n_ctx", c.max_positions},
          {"activation_function", "gelu_new"},
          {"layer_norm_epsilon", c.norm_eps},
          {"tie_word_embeddings", true},
          {"torch_dtype", torch_dtype}};
}

}  // namespace

void export_hf(FsdpModel& model, const HfConfig& config, const fs::path& dir, DType dtype) {
  const Communicator& world = model.mesh().world();
  const bool root = world.rank() == 0;
  run_agreed(world, [&] {
    check(model, config);
    if (root) fs::create_directories(dir);
  });
  detail::write_safetensors(model, dir / "model.safetensors", dtype,
                            {{"kshard.hf_model_type", config.model_type}},
                            [&](std::size_t u, const ParamEntry& e) { return hf_pieces(config, u, e); });
  agree_ok(world, run_local([&] {
    if (!root) return;
    const fs::path tmp = dir / "config.json.partial";
    {
      std::ofstream f(tmp);
      f << config_json(config, dtype).dump(2) << "\n";
      if (!f.flush()) throw Error("cannot write " + tmp.string(), "a writable directory");
    }
    fs::rename(tmp, dir / "config.json");
  }));
}

}  // namespace kshard
