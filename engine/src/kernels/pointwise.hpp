#pragma once
// Per-element formulas that the portable kernels and the CUDA backend's
// vectorized ones (elementwise_stream.hpp) both apply, kept in one place so
// that the two paths compute the same values. Private to the engine.
#include <Kokkos_Macros.hpp>

#include "kshard/compat/kokkos.hpp"

namespace kshard::detail::pointwise {

/// gelu(v), tanh approximation (GPT-2's, PyTorch's approximate="tanh"), in A.
template <class A>
KOKKOS_INLINE_FUNCTION A gelu(A v) {
  const A c = A(0.7978845608028654);  // sqrt(2 / pi)
  const A t = compat::tanh(c * (v + A(0.044715) * v * v * v));
  return A(0.5) * v * (A(1) + t);
}

/// d gelu / dv = 0.5 (1 + t) + 0.5 v (1 - t^2) c (1 + 3 * 0.044715 v^2).
template <class A>
KOKKOS_INLINE_FUNCTION A gelu_slope(A v) {
  const A c = A(0.7978845608028654);
  const A t = compat::tanh(c * (v + A(0.044715) * v * v * v));
  return A(0.5) * (A(1) + t) + A(0.5) * v * (A(1) - t * t) * c * (A(1) + A(3 * 0.044715) * v * v);
}

/// The gradient statistics of one written value: its square into `squares`
/// when finite, else one more into `nonfinite`.
KOKKOS_INLINE_FUNCTION void tally(float v, double& squares, double& nonfinite) {
  if (v - v == 0.0f)  // finite: inf - inf and NaN - NaN are NaN
    squares += double(v) * double(v);
  else
    nonfinite += 1.0;
}

}  // namespace kshard::detail::pointwise
