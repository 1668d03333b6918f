#pragma once
// Recipe: the mixed-precision policy of a sharded model (FSDP2's
// MixedPrecisionPolicy; TransformerEngine's FSDP2 tests call this axis "recipe").
//
//   name   all-gather dtype                        compute dtype  reduce dtype  loss scaling
//   fp32   f32                                     f32            f32           no
//   bf16   bf16                                    bf16           f32           no
//   fp16   f16                                     f16            f16           dynamic
//   fp8    e4m3 + one f32 scale per 128-elt block  bf16           f32           no
//   fp8-current  bf16                               bf16 + fp8 GEMMs f32         no
//   fp8-delayed  bf16                               bf16 + fp8 GEMMs f32         no
//   fp8-block    bf16                               bf16 + fp8 GEMMs f32         no
//
// Master weights, optimizer state and the sharded gradient are always f32.
// The compute dtype is FSDP2's param_dtype: layers run in it (parameters and
// activations stored in it, GEMMs on tensor cores with f32 accumulation,
// statistics in f32). For bf16/fp16 the all-gathered buffer IS the compute
// parameters (no upcast copy); fp8 dequantizes its gather into bf16. Layers
// write parameter gradients in f32 (the GEMMs' accumulators), which are
// reduce-scattered in the reduce dtype. fp8_init (the other axis of those tests):
// the sharded parameter itself is kept as fp8 + scales between steps
// (re-quantized after each optimizer step) and the all-gather sends those
// bytes as they are; only meaningful for the fp8 recipe.
//
// fp8 compute (fp8_compute, nn/fp8_policy.hpp): the Linear products of every
// layer but a final Linear (the LM head) run on fp8 tensor cores, each operand scaled per
// tensor. fp8-current is TransformerEngine's Float8CurrentScaling recipe
// (E4M3 activations and weights, E5M2 gradients, scales from this step's
// amax). fp8-delayed is TE's DelayedScaling (HYBRID formats; scales from an
// amax history of fp8_compute.amax_history_len steps, max-reduced across the
// ranks; the history is model state, kept in checkpoints). fp8-block is TE's
// Float8BlockScaling (E4M3 throughout; 1x128 scales for activations and
// gradients, 128x128 for weights, from this step's values; no state; Linears
// whose rows and features are multiples of 128). Their all-gather is bf16,
// like bf16's. They need a GPU with fp8 tensor cores (compute
// capability 8.9+); the host backend emulates them bit for bit.
#include <string>

#include "kshard/dtype.hpp"
#include "kshard/engine/nn/fp8_policy.hpp"

namespace kshard {

struct Recipe {
  std::string name = "fp32";
  DType gather_dtype = DType::f32;
  DType compute_dtype = DType::f32;
  DType reduce_dtype = DType::f32;
  bool loss_scaling = false;
  bool fp8_init = false;
  int fp8_block = 128;
  Fp8Policy fp8_compute{};  ///< fp8 GEMMs (fp8-current, fp8-delayed, fp8-block)

  /// "fp32", "bf16", "fp16", "fp8", "fp8-current", "fp8-delayed", "fp8-block"; throws
  /// kshard::Error otherwise, or for
  /// fp8_init with a recipe other than fp8.
  static Recipe parse(const std::string& name, bool fp8_init = false);
  bool is_fp8() const noexcept { return gather_dtype == DType::e4m3; }
  /// "fp8+fp8_init", "bf16", ...
  std::string describe() const;
};

}  // namespace kshard
