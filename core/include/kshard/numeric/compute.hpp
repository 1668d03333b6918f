#pragma once
// Compute types: what a kernel stores (T) and what it accumulates in
// (accum_t<T>). Layers run in T = float, double (finite-difference checks),
// bfloat16_t or float16_t; kernels load T, do every sum, exponential and
// statistic in accum_t<T> (f32 for the 16-bit types, as FSDP2 + autocast do),
// and store the result rounded back to T (round-to-nearest-even).
//
//   template <class T> KOKKOS_INLINE_FUNCTION void axpy(const T* x, T* y, int i) {
//     using A = kshard::accum_t<T>;
//     const A v = kshard::to_accum(x[i]) + kshard::to_accum(y[i]);
//     y[i] = kshard::from_accum<T>(v);
//   }
#include <type_traits>

#include <Kokkos_Macros.hpp>

#include "kshard/dtype.hpp"
#include "kshard/numeric/convert.hpp"
#include "kshard/numeric/types.hpp"

namespace kshard {

template <class T>
struct accum {
  using type = T;  // float and double accumulate in themselves
};
template <>
struct accum<bfloat16_t> {
  using type = float;
};
template <>
struct accum<float16_t> {
  using type = float;
};
template <class T>
using accum_t = typename accum<T>::type;

/// True for the 16-bit compute types (stored narrow, accumulated in f32).
template <class T>
inline constexpr bool is_low_precision_v =
    std::is_same_v<T, bfloat16_t> || std::is_same_v<T, float16_t>;

KOKKOS_INLINE_FUNCTION float to_accum(float v) { return v; }
KOKKOS_INLINE_FUNCTION double to_accum(double v) { return v; }
KOKKOS_INLINE_FUNCTION float to_accum(bfloat16_t v) { return to_float(v); }
KOKKOS_INLINE_FUNCTION float to_accum(float16_t v) { return to_float(v); }

template <class T>
KOKKOS_INLINE_FUNCTION T from_accum(accum_t<T> v) {
  if constexpr (is_low_precision_v<T>)
    return from_float<T>(v);
  else
    return v;
}

}  // namespace kshard

/// Applies M to every compute type, for explicit instantiations:
///   KSHARD_FOR_EACH_COMPUTE_TYPE(KSHARD_MY_INSTANTIATE)   // inside namespace kshard
#define KSHARD_FOR_EACH_COMPUTE_TYPE(M) M(float) M(double) M(bfloat16_t) M(float16_t)
