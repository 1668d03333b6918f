#pragma once
// export_hf: a trained model in Hugging Face's format, a directory with
// config.json and model.safetensors that `transformers` loads as
// LlamaForCausalLM (model_type "llama") or GPT2LMHeadModel ("gpt2").
//
//   kshard::HfConfig c;
//   c.model_type = "llama";
//   c.vocab = 32000; c.hidden = 2048; c.layers = 8; c.heads = 16; c.kv_heads = 4;
//   c.intermediate = 5632; c.max_positions = 1024; c.rope_theta = 10000; c.norm_eps = 1e-5;
//   c.tie_word_embeddings = false;
//   kshard::export_hf(model, c, "out/my-llama");          // collective
//
// The model must be the shape the config names, unit by unit:
//  - llama: Embedding(vocab, hidden) without positions, `layers` LlamaLayers,
//    RMSNorm, Linear(hidden, vocab) without bias (its weight tied to the
//    embedding when tie_word_embeddings);
//  - gpt2: Embedding(vocab, hidden, max_positions), `layers` TransformerLayers,
//    LayerNorm, a tied Linear head without bias (GPT2LMHeadModel's head is the
//    token table).
// Names and layouts (docs/CHECKPOINTS.md): kshard's fused [q | k | v] and
// [gate | up] weights are split into q/k/v_proj and gate/up_proj (contiguous
// rows); GPT-2's Conv1D weights are written [in, out] (transposed). Rotary
// embeddings are already in Hugging Face's rotate-half layout, so q and k
// need no permutation. Above `max_shard_bytes` of tensor data the weights
// are split as transformers' save_pretrained splits them:
// model-00001-of-0000N.safetensors ... plus model.safetensors.index.json
// (tensors in order, a new file before one would cross the limit; a tensor
// larger than the limit alone in its file); otherwise one model.safetensors.
// An earlier export's weight files that this one did not replace are
// removed once the new ones are in place, so an index never names a file of
// another export. Anything else, or a unit whose parameters
// are not the expected ones, is a kshard::Error on every rank before anything
// is written; the files appear atomically (written as ".partial", renamed).
#include <cstdint>
#include <filesystem>

#include "kshard/checkpoint/hf_config.hpp"
#include "kshard/dtype.hpp"
#include "kshard/engine/fsdp/fsdp_model.hpp"

namespace kshard {

/// Writes dir/config.json and the weights (dtype: f32 or bf16); the default
/// limit is transformers' (5 GB).
void export_hf(FsdpModel& model, const HfConfig& config, const std::filesystem::path& dir,
               DType dtype = DType::f32, std::int64_t max_shard_bytes = 5'000'000'000);

}  // namespace kshard
