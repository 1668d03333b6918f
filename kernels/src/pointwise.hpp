#pragma once
// Per-element formulas that the portable kernels and the CUDA backend's
// vectorized ones (elementwise_stream.hpp) both apply, kept in one place so
// that the two paths compute the same values. Private to the engine.
#include <type_traits>

#include <Kokkos_Macros.hpp>

#include "kshard/compat/kokkos.hpp"

namespace kshard::detail::pointwise {

/// sigmoid(2u) = (1 + tanh(u)) / 2 and e = exp(-2u), the pieces of GELU's
/// tanh form. On the GPU in f32 two special-function instructions
/// (ex2.approx through __expf, rcp.approx through __fdividef: a few units in
/// the last place of f32, far below the bf16 rounding that follows in every
/// kernel that uses them) where tanhf takes ~20 instructions: the fp8 casts
/// that apply GELU as they load (fp8_input.hpp) were ALU-bound with tanhf.
template <class A>
struct GeluParts {
  A s, e;
};
template <class A>
KOKKOS_INLINE_FUNCTION GeluParts<A> gelu_parts(A u) {
#if defined(__CUDA_ARCH__)
  if constexpr (std::is_same_v<A, float>) {
    const float e = __expf(-2.0f * u);
    return {__fdividef(1.0f, 1.0f + e), e};  // 0 once e is inf (u < ~-44)
  }
#endif
  const A e = compat::exp(A(-2) * u);
  return {A(1) / (A(1) + e), e};
}

/// gelu(v) = 0.5 v (1 + tanh(u)) = v sigmoid(2u), u = sqrt(2/pi) (v +
/// 0.044715 v^3): the tanh approximation (GPT-2's, PyTorch's
/// approximate="tanh"), in A. (The sigmoid form also keeps the digits the
/// tanh form loses in 1 + t for large negative v.)
template <class A>
KOKKOS_INLINE_FUNCTION A gelu(A v) {
  const A c = A(0.7978845608028654);  // sqrt(2 / pi)
  return v * gelu_parts(c * v * (A(1) + A(0.044715) * v * v)).s;
}

/// d gelu / dv = s + 2 v s (1 - s) c (1 + 3 * 0.044715 v^2), s = sigmoid(2u)
/// (the tanh form's 0.5 (1 + t) + 0.5 v (1 - t^2) u'); 1 - s as e s where s is
/// near 1 (no cancellation), as 1 - s elsewhere (e may be inf there).
template <class A>
KOKKOS_INLINE_FUNCTION A gelu_slope(A v) {
  const A c = A(0.7978845608028654);
  const GeluParts<A> p = gelu_parts(c * v * (A(1) + A(0.044715) * v * v));
  const A one_minus_s = p.s < A(0.5) ? A(1) - p.s : p.e * p.s;
  return p.s + A(2) * v * p.s * one_minus_s * c * (A(1) + A(3 * 0.044715) * v * v);
}

/// sigmoid(a) = 1 / (1 + exp(-a)) (the precise exp: SwiGLU's kernels are
/// memory-bound, and the portable and CUDA paths then give the same bits).
template <class A>
KOKKOS_INLINE_FUNCTION A sigmoid(A a) {
  return A(1) / (A(1) + compat::exp(-a));
}

/// SwiGLU of one (gate a, up b) pair: silu(a) * b = a * sigmoid(a) * b.
template <class A>
KOKKOS_INLINE_FUNCTION A swiglu(A a, A b) {
  return a * sigmoid(a) * b;
}

/// Its gradients for the output gradient g: da = g * b * silu'(a) with
/// silu'(a) = s (1 + a (1 - s)), s = sigmoid(a); db = g * silu(a).
template <class A>
KOKKOS_INLINE_FUNCTION void swiglu_grads(A a, A b, A g, A& da, A& db) {
  const A s = sigmoid(a);
  da = g * b * s * (A(1) + a * (A(1) - s));
  db = g * a * s;
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
