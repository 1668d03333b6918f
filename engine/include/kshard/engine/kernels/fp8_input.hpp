#pragma once
// What an fp8 cast quantizes (fp8_tensor.hpp, fp8_blockwise.hpp): the tensor
// it reads, or GELU of it. The second lets a LayerNormMLP's fc2 quantize its
// input straight from fc1's pre-activation: the GELU output [rows, 4d], the
// largest activation of a layer, is then never written, neither in forward
// nor recomputed in backward (TransformerEngine fuses the same cast into its
// GELU kernel).

namespace kshard {

enum class Fp8Input {
  x,          ///< the values read
  gelu_of_x,  ///< gelu(x) (tanh form) rounded to bf16: the bits gelu_forward writes
};

}  // namespace kshard
