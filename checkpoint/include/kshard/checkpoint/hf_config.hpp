#pragma once
// HfConfig: the shape of a Hugging Face causal language model as kshard
// builds it, the part of a `config.json` that export_hf writes and import_hf
// reads (LlamaForCausalLM: model_type "llama"; GPT2LMHeadModel: "gpt2").
//
//   kshard::HfConfig c = kshard::read_hf_config("models/my-llama");  // local
//   // ... build the model from c (kshard-train does it from its flags and
//   // checks them against the file: import_hf) ...
//
// read_hf_config takes the fields transformers writes (and transformers'
// defaults for the ones it leaves out) and refuses what kshard cannot build
// with a kshard::Error naming the field: another model_type or architecture,
// biases in a Llama (attention_bias, mlp_bias), another activation (Llama:
// silu; GPT-2: gelu_new, the tanh approximation kshard's GELU computes), rope
// scaling other than "default", head_dim other than hidden / heads, GPT-2's
// cross attention or attention scaled by the layer index.
#include <cstdint>
#include <filesystem>
#include <string>

namespace kshard {

struct HfConfig {
  std::string model_type = "llama";  ///< llama | gpt2
  std::int64_t vocab = 0, hidden = 0, layers = 0, heads = 0;
  std::int64_t kv_heads = 0;       ///< llama: key/value heads (0: heads)
  std::int64_t intermediate = 0;   ///< MLP hidden width
  std::int64_t max_positions = 0;  ///< the training sequence length (gpt2: the position table's rows)
  double rope_theta = 10000.0;     ///< llama
  double norm_eps = 1e-5;          ///< rms_norm_eps / layer_norm_epsilon
  bool tie_word_embeddings = false;
};

/// dir/config.json as an HfConfig (kv_heads as the file says, so never 0).
/// Local: no communication; kshard::Error naming the file and field.
HfConfig read_hf_config(const std::filesystem::path& dir);

}  // namespace kshard
