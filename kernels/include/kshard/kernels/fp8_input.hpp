#pragma once
// What an fp8 cast quantizes (fp8_tensor.hpp, fp8_blockwise.hpp): the tensor
// it reads, or a GELU step applied as it loads. This lets a LayerNormMLP run
// its GELU inside the casts around it, TransformerEngine's fused
// cast(+transpose)(+dbias)(+dgelu) kernels:
//   forward   fc2 quantizes gelu(a) straight from fc1's pre-activation a, so
//             the GELU output [rows, 4d], the largest activation of a layer,
//             is never written (nor recomputed in backward);
//   backward  fc1 quantizes its output gradient dg * gelu'(a) straight from
//             fc2's input gradient dg, so GELU's backward never writes it.
// Each applies the formula of kernels/gelu.hpp and rounds to bf16 first: the
// cast sees the bits gelu_forward / gelu_backward would have written.

namespace kshard {

enum class Fp8Input {
  x,          ///< the values read
  gelu_of_x,  ///< gelu(x) (tanh form), as gelu_forward writes it
  gelu_grad,  ///< x * gelu'(pre), as gelu_backward writes it (x: the gradient
              ///< w.r.t. GELU's output; `pre`, GELU's input, passed beside x)
};

}  // namespace kshard
