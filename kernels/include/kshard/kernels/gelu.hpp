#pragma once
// GELU, tanh approximation (PyTorch's approximate="tanh", GPT-2's), as
// elementwise kernels on flat Views, computed in accum_t<T>:
//   y = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
// Used by the Gelu layer (kshard/engine/nn/gelu.hpp), by Linear's host/f32
// bias+GELU epilogue and by LayerNormMLP (which recomputes the GELU output in
// backward from the saved pre-activation).
#include <Kokkos_Core.hpp>

#include "kshard/numeric/compute.hpp"

namespace kshard {

namespace detail {
/// Elementwise kernels, also used by LayerNormMLP: y = gelu(x); dx = dy * gelu'(x).
template <class T>
void gelu_forward(Kokkos::View<const T*> x, Kokkos::View<T*> y);
template <class T>
void gelu_backward(Kokkos::View<const T*> x, Kokkos::View<const T*> dy, Kokkos::View<T*> dx);
}  // namespace detail

}  // namespace kshard
