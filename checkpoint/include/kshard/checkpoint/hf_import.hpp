#pragma once
// import_hf: a model in Hugging Face's format (what export_hf writes, or what
// transformers' save_pretrained wrote for a LlamaForCausalLM or
// GPT2LMHeadModel) as the weights of a kshard model, on any mesh.
//
//   kshard::HfConfig c = ...;                        // the shape the model was built with
//   kshard::import_hf(model, c, "models/my-llama");  // collective
//
// The directory holds config.json and either model.safetensors or
// model.safetensors.index.json with its shards (transformers' layout above
// its size limit). config.json must agree with `config` field by field
// (read_hf_config; a GPT-2 file may have more positions than the model's
// table: the first rows are read, so a model may train at a shorter
// context). Every tensor kshard's model has must be there with its shape
// (F32, BF16, F16 or F64; the layouts export_hf writes, read back: q/k/v_proj
// and gate/up_proj stacked into kshard's fused weights, GPT-2's Conv1D
// weights transposed); a tensor kshard has no place for is an error, except
// the buffers older transformers versions saved (attn.bias, attn.masked_bias,
// rotary_emb.inv_freq) and the head of a tied model, which transformers ties
// to the token table anyway. Each rank reads only what its shard needs.
// Errors (a missing file, field or tensor, another shape, a truncated file)
// are a kshard::Error on every rank naming it; the model is unchanged then
// (nothing is half-loaded: every value is read before any is set).
#include <filesystem>

#include "kshard/checkpoint/hf_config.hpp"
#include "kshard/engine/fsdp/fsdp_model.hpp"

namespace kshard {

void import_hf(FsdpModel& model, const HfConfig& config, const std::filesystem::path& dir);

}  // namespace kshard
