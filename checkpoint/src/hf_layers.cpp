#include "kshard/checkpoint/hf_layers.hpp"

#include "kshard/engine/nn/embedding.hpp"
#include "kshard/engine/nn/layer_norm.hpp"
#include "kshard/engine/nn/linear.hpp"
#include "kshard/engine/nn/llama_layer.hpp"
#include "kshard/engine/nn/rms_norm.hpp"
#include "kshard/engine/nn/transformer_layer.hpp"
#include "kshard/error.hpp"

namespace kshard {

std::vector<LayerDef> hf_layers(const HfConfig& c) {
  if (c.model_type != "llama" && c.model_type != "gpt2")
    throw Error("hf_layers: model_type '" + c.model_type + "'", "llama or gpt2");
  std::vector<LayerDef> defs;
  if (c.model_type == "llama") {
    LlamaBlockConfig b;
    b.d_model = c.hidden;
    b.heads = c.heads;
    b.kv_heads = c.kv_heads;
    b.ffn = c.intermediate;
    b.rope_theta = c.rope_theta;
    b.norm_eps = c.norm_eps;
    defs.push_back(layer<Embedding>(c.vocab, c.hidden));
    for (std::int64_t l = 0; l < c.layers; ++l) defs.push_back(layer<LlamaLayer>(b));
    defs.push_back(layer<RMSNorm>(c.hidden, c.norm_eps));
  } else {
    defs.push_back(layer<Embedding>(c.vocab, c.hidden, c.max_positions));
    for (std::int64_t l = 0; l < c.layers; ++l)
      defs.push_back(layer<TransformerLayer>(c.hidden, c.heads, c.intermediate, c.norm_eps));
    defs.push_back(layer<LayerNorm>(c.hidden, c.norm_eps));
  }
  defs.push_back(layer<Linear>(c.hidden, c.vocab, false));
  return defs;
}

}  // namespace kshard
