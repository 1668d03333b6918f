#include "hf_layout.hpp"

#include <map>

#include "kshard/error.hpp"

namespace kshard::detail {

namespace {

// The unit kinds the config's model has, in order.
std::vector<std::string> expected_kinds(const HfConfig& c) {
  const bool llama = c.model_type == "llama";
  std::vector<std::string> k{"Embedding"};
  for (std::int64_t l = 0; l < c.layers; ++l) k.push_back(llama ? "LlamaLayer" : "TransformerLayer");
  k.push_back(llama ? "RMSNorm" : "LayerNorm");
  k.push_back("Linear");
  return k;
}

[[noreturn]] void fail(const std::string& who, const std::string& what, const std::string& expected) {
  throw Error(who + ": " + what, expected);
}

}  // namespace

void check_hf_model(const FsdpModel& model, const HfConfig& c, const std::string& who) {
  const auto bad = [&](const std::string& what, const std::string& expected) { fail(who, what, expected); };
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
  if (c.model_type == "gpt2" && (!c.tie_word_embeddings || (c.kv_heads != 0 && c.kv_heads != c.heads)))
    bad("gpt2 without tied embeddings or with grouped-query attention",
        "tie_word_embeddings (GPT2LMHeadModel's head is the token table) and kv_heads 0 (= heads)");
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

std::vector<ExportPiece> hf_pieces(const HfConfig& c, std::size_t unit, const ParamEntry& e,
                                   const std::string& who) {
  const auto bad = [&](const std::string& what, const std::string& expected) { fail(who, what, expected); };
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
  fail(who, "unit " + std::to_string(unit) + " (" + std::to_string(rows) + " rows) has parameter '" +
          e.name + "', which a " + c.model_type + " model has no place for",
      "the parameters of Hugging Face's " +
          std::string(llama ? "LlamaForCausalLM (no biases)" : "GPT2LMHeadModel (a head without bias)"));
}

}  // namespace kshard::detail
