#pragma once
// hf_layers: kshard's layers for a Hugging Face config, the model that
// export_hf writes and import_hf reads, as kshard-train builds it for
// --arch llama|gpt2:
//  - llama: Embedding(vocab, hidden), `layers` LlamaLayers (kv_heads,
//    intermediate, rope_theta, norm_eps), RMSNorm, Linear(hidden, vocab)
//    without bias;
//  - gpt2: Embedding(vocab, hidden, max_positions), `layers`
//    TransformerLayers, LayerNorm, Linear(hidden, vocab) without bias.
// Tie the head with FsdpOptions::tie_word_embeddings = config.tie_word_embeddings.
//
//   kshard::HfConfig c = kshard::read_hf_config(dir);
//   kshard::FsdpOptions o;
//   o.tie_word_embeddings = c.tie_word_embeddings;
//   kshard::FsdpModel model(mesh, kshard::hf_layers(c), kshard::Recipe::parse("bf16"), o);
//   kshard::import_hf(model, c, dir);
#include <vector>

#include "kshard/checkpoint/hf_config.hpp"
#include "kshard/engine/nn/layer_def.hpp"

namespace kshard {

std::vector<LayerDef> hf_layers(const HfConfig& config);

}  // namespace kshard
