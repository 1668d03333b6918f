#pragma once
// Fp8Policy: how a layer's Linear products compute in fp8 (TransformerEngine's
// fp8_autocast recipe, seen from a layer). The model sets it on its layers from
// the Recipe (fsdp/recipe.hpp); composite layers pass it to their Linears.
//
//   none     bf16 GEMMs (every recipe without fp8 compute)
//   current  per-tensor current scaling (TE's Float8CurrentScaling): each
//            operand's scale comes from its own amax in this step; E4M3 for
//            activations and weights, E5M2 for gradients (HYBRID)
//   delayed  per-tensor delayed scaling (TE's DelayedScaling, fp8_format
//            HYBRID, margin 0): each operand's scale comes from the amaxes
//            it had in the last amax_history_len steps (their max, or the
//            most recent), so the cast needs no amax pass first; the amaxes
//            of a step are max-reduced over all ranks before the update
//            (FsdpModel::finish_optimizer_step), so every rank uses the same
//            scales. Scales are powers of two (TE's are not): exact to apply,
//            bit-identical on host and device.
//   block    block scaling (TE's Float8BlockScaling, DeepSeek-V3's recipe):
//            E4M3 everywhere, a scale per 1x128 block along the reduction
//            dimension for activations and gradients and per 128x128 tile
//            for weights (kernels/fp8_blockwise.hpp), from this step's values;
//            power-of-two scales (TE's default for this recipe). Rows, in and
//            out features must be multiples of 128; other Linears stay bf16.
//
// Which products: forward x W^T, dgrad dy W and wgrad dy^T x of every Linear in
// bf16 compute whose rows, in and out features are multiples of 16 (the fp8
// tensor cores' rule, kernels/fp8_gemm.hpp; 128 for block scaling); other
// shapes stay bf16. Bias,
// GELU, attention's softmax core, LayerNorm, the loss and the optimizer are
// not fp8 (TE's defaults).
#include "kshard/kernels/fp8_tensor.hpp"

namespace kshard {

enum class Fp8Scaling { none, current, delayed, block };

struct Fp8Policy {
  Fp8Scaling scaling = Fp8Scaling::none;
  int amax_history_len = 1024;               ///< delayed: steps of history (TE's default)
  Fp8AmaxAlgo amax_algo = Fp8AmaxAlgo::max;  ///< delayed: max of the history, or the most recent
  bool enabled() const noexcept { return scaling != Fp8Scaling::none; }
};

}  // namespace kshard
