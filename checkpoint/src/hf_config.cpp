#include "kshard/checkpoint/hf_config.hpp"

#include <fstream>
#include <optional>

#include <nlohmann/json.hpp>

#include "hf_layout.hpp"
#include "kshard/error.hpp"

namespace kshard {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// Reads the fields of one config.json, naming the file and field in errors.
class ConfigReader {
 public:
  ConfigReader(json j, std::string file) : j_(std::move(j)), file_(std::move(file)) {}

  [[noreturn]] void bad(const std::string& field, const std::string& what,
                        const std::string& expected) const {
    throw Error(file_ + ": " + field + " " + what, expected);
  }
  bool has(const std::string& k) const { return j_.contains(k) && !j_[k].is_null(); }
  const json& at(const std::string& k) const { return j_.at(k); }

  /// A positive integer; `fallback` (transformers' default) when absent.
  std::int64_t count(const std::string& k, std::optional<std::int64_t> fallback = std::nullopt) const {
    if (!has(k)) {
      if (fallback) return *fallback;
      bad(k, "is missing", "a positive integer");
    }
    const json& v = j_[k];
    if (!v.is_number_integer() || v.get<std::int64_t>() < 1) bad(k, "is " + v.dump(), "a positive integer");
    return v.get<std::int64_t>();
  }
  double number(const json& v, const std::string& k) const {
    if (!v.is_number() || !(v.get<double>() > 0)) bad(k, "is " + v.dump(), "a positive number");
    return v.get<double>();
  }
  double number(const std::string& k, double fallback) const { return has(k) ? number(j_[k], k) : fallback; }
  bool flag(const std::string& k, bool fallback) const {
    if (!has(k)) return fallback;
    if (!j_[k].is_boolean()) bad(k, "is " + j_[k].dump(), "true or false");
    return j_[k].get<bool>();
  }
  std::string text(const std::string& k, const std::string& fallback) const {
    if (!has(k)) return fallback;
    if (!j_[k].is_string()) bad(k, "is " + j_[k].dump(), "a string");
    return j_[k].get<std::string>();
  }
  /// Refuses a field whose value kshard's model does not compute.
  void require(const std::string& k, const json& fallback, const json& want, const std::string& why) const {
    const json v = has(k) ? j_[k] : fallback;
    if (v != want) bad(k, "is " + v.dump(), want.dump() + " (" + why + ")");
  }

 private:
  json j_;
  std::string file_;
};

HfConfig read_llama(const ConfigReader& r) {
  HfConfig c;
  c.model_type = "llama";
  c.vocab = r.count("vocab_size", 32000);
  c.hidden = r.count("hidden_size", 4096);
  c.intermediate = r.count("intermediate_size", 11008);
  c.layers = r.count("num_hidden_layers", 32);
  c.heads = r.count("num_attention_heads", 32);
  c.kv_heads = r.count("num_key_value_heads", c.heads);
  c.max_positions = r.count("max_position_embeddings", 2048);
  c.norm_eps = r.number("rms_norm_eps", 1e-6);
  c.tie_word_embeddings = r.flag("tie_word_embeddings", false);
  if (c.hidden % c.heads != 0)
    r.bad("hidden_size", std::to_string(c.hidden) + " with num_attention_heads " + std::to_string(c.heads),
          "heads dividing hidden_size");
  if (c.heads % c.kv_heads != 0)
    r.bad("num_key_value_heads", std::to_string(c.kv_heads) + " with num_attention_heads " +
                                     std::to_string(c.heads),
          "key/value heads dividing the heads");
  r.require("head_dim", c.hidden / c.heads, c.hidden / c.heads,
            "kshard's attention has hidden_size / num_attention_heads per head");
  r.require("hidden_act", "silu", "silu", "kshard's SwiGLU MLP");
  r.require("attention_bias", false, false, "kshard's Llama attention has no biases");
  r.require("mlp_bias", false, false, "kshard's SwiGLU MLP has no biases");
  r.require("pretraining_tp", 1, 1, "one tensor-parallel slice");
  // transformers 5 writes rope_parameters {rope_theta, rope_type}; older
  // versions rope_theta and rope_scaling at the top level.
  c.rope_theta = r.number("rope_theta", 10000.0);
  std::string rope_type = "default";
  if (r.has("rope_parameters")) {
    const json& p = r.at("rope_parameters");
    if (!p.is_object()) r.bad("rope_parameters", "is " + p.dump(), "an object");
    if (p.contains("rope_theta")) c.rope_theta = r.number(p["rope_theta"], "rope_parameters.rope_theta");
    if (p.contains("rope_type") && p["rope_type"].is_string()) rope_type = p["rope_type"].get<std::string>();
  }
  if (r.has("rope_scaling")) {
    const json& s = r.at("rope_scaling");
    const char* key = s.is_object() && s.contains("rope_type") ? "rope_type" : "type";
    rope_type = s.is_object() && s.contains(key) && s[key].is_string() ? s[key].get<std::string>() : s.dump();
  }
  if (rope_type != "default")
    r.bad("rope type", "'" + rope_type + "'", "\"default\" (kshard's rotary embeddings are not scaled)");
  return c;
}

HfConfig read_gpt2(const ConfigReader& r) {
  HfConfig c;
  c.model_type = "gpt2";
  c.vocab = r.count("vocab_size", 50257);
  c.hidden = r.count("n_embd", 768);
  c.layers = r.count("n_layer", 12);
  c.heads = r.count("n_head", 12);
  c.kv_heads = c.heads;
  c.intermediate = r.count("n_inner", 4 * c.hidden);
  c.max_positions = r.count("n_positions", 1024);
  c.norm_eps = r.number("layer_norm_epsilon", 1e-5);
  c.tie_word_embeddings = r.flag("tie_word_embeddings", true);
  if (c.hidden % c.heads != 0)
    r.bad("n_embd", std::to_string(c.hidden) + " with n_head " + std::to_string(c.heads), "n_head dividing n_embd");
  const std::string act = r.text("activation_function", "gelu_new");
  if (act != "gelu_new" && act != "gelu_pytorch_tanh")
    r.bad("activation_function", "'" + act + "'", "gelu_new (the tanh approximation kshard's GELU computes)");
  r.require("tie_word_embeddings", true, true, "GPT2LMHeadModel's head is the token table");
  r.require("scale_attn_weights", true, true, "attention scaled by 1/sqrt(head_dim)");
  r.require("scale_attn_by_inverse_layer_idx", false, false, "every layer's attention scaled alike");
  r.require("add_cross_attention", false, false, "a decoder without cross attention");
  return c;
}

}  // namespace

HfConfig read_hf_config(const fs::path& dir) {
  const fs::path file = dir / "config.json";
  const std::string name = "Hugging Face config '" + file.string() + "'";
  std::ifstream in(file);
  if (!in)
    throw Error("cannot read " + name, "a Hugging Face model directory (config.json and model.safetensors)");
  json j;
  try {
    j = json::parse(in);
  } catch (const json::exception& e) {
    throw Error(name + " is not valid JSON (" + e.what() + ")", "config.json as transformers writes it");
  }
  if (!j.is_object()) throw Error(name + " is not a JSON object", "config.json as transformers writes it");
  const ConfigReader r(j, name);
  const std::string type = r.text("model_type", "");
  const char* arch = type == "llama" ? "LlamaForCausalLM" : type == "gpt2" ? "GPT2LMHeadModel" : nullptr;
  if (!arch)
    r.bad("model_type", "is '" + type + "'",
          "llama (LlamaForCausalLM) or gpt2 (GPT2LMHeadModel), the architectures kshard builds");
  if (r.has("architectures")) {
    const json& a = r.at("architectures");
    bool found = false;
    if (a.is_array())
      for (const auto& x : a) found = found || (x.is_string() && x.get<std::string>() == arch);
    if (!found) r.bad("architectures", "is " + a.dump(), std::string("[\"") + arch + "\"] (a causal language model)");
  }
  return type == "llama" ? read_llama(r) : read_gpt2(r);
}

json detail::hf_config_json(const HfConfig& c, DType dtype) {
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

}  // namespace kshard
