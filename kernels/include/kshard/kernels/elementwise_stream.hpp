#pragma once
// Element-wise passes over long flat arrays (the gather's f32 -> bf16/f16
// cast, GELU and SwiGLU forward and backward, the residual add, the gradient
// statistics)
// where the backend has a faster kernel than the portable ones
// (compat::for_each_index, Kokkos reductions). For the engine's layers (kshard::detail: not a user API).
//
// Why a second implementation: these passes are bound by how many bytes each
// thread has in flight. The portable kernels read one element per thread per
// loop iteration and use it before the next load (Views may alias, so the
// compiler cannot hoist the next loads above the store), which ncu measured
// on the H200 at 1.5-2.7 TB/s of the 4 TB/s a copy reaches (GELU backward
// over [4096, 8192] bf16: 129 us; the statistics of a 50M-element f32 shard:
// 137 + 17 us; the master -> bf16 cast of 50M elements: 110 us). The CUDA
// backend loads 8 elements per thread as 16-byte vectors before it computes
// anything.
//
// Same arithmetic as the portable kernels, element by element (the statistics
// add their partial sums in another, fixed, order: deterministic, not bitwise
// equal to the portable reduction). Every function returns false when the
// backend has no kernel (host builds); the caller then runs the portable one.
// Pointers need not be aligned (the CUDA backend falls back to scalar loads
// for a misaligned array).
#include <cstdint>

#include "kshard/kernels/cast.hpp"

namespace kshard::detail {

/// dst[i] = T(src[i]), round to nearest even (cast_from_f32).
template <class T>
bool cast_from_f32_stream(const float* src, T* dst, std::int64_t n);

/// y = gelu(x), tanh approximation in accum_t<T> (gelu_forward).
template <class T>
bool gelu_forward_stream(const T* x, T* y, std::int64_t n);

/// dx = dy * gelu'(x) (gelu_backward); dx may be dy.
template <class T>
bool gelu_backward_stream(const T* x, const T* dy, T* dx, std::int64_t n);

/// out = a + b in accum_t<T> (detail::add); out may be a or b.
template <class T>
bool add_stream(const T* a, const T* b, T* out, std::int64_t n);

/// SwiGLU over rows of [a | b] (swiglu.hpp): y[r, j] = silu(a) * b, x: [rows, 2h],
/// y: [rows, h] (swiglu_forward).
template <class T>
bool swiglu_forward_stream(const T* x, T* y, std::int64_t rows, std::int64_t h);

/// Its backward: dx = [da | db] from x and dy (swiglu_backward).
template <class T>
bool swiglu_backward_stream(const T* x, const T* dy, T* dx, std::int64_t rows, std::int64_t h);

/// accumulate_with_stats for n > 0: dst per `mode`, and into stats[0..1]
/// (device memory) the sum of squares and the count of inf/NaN of the new
/// dst, on the device's stream (nothing waits). src is unused for
/// GradWrite::none.
template <class T>
bool accumulate_with_stats_stream(const T* src, float* dst, double* stats, std::int64_t n,
                                  GradWrite mode);

}  // namespace kshard::detail

/// A backend's explicit instantiations (with KSHARD_FOR_EACH_COMPUTE_TYPE for
/// the first, float / bfloat16_t / float16_t for the second).
#define KSHARD_INSTANTIATE_STREAM_COMPUTE(T)                                                 \
  template bool gelu_forward_stream<T>(const T*, T*, std::int64_t);                          \
  template bool gelu_backward_stream<T>(const T*, const T*, T*, std::int64_t);               \
  template bool swiglu_forward_stream<T>(const T*, T*, std::int64_t, std::int64_t);          \
  template bool swiglu_backward_stream<T>(const T*, const T*, T*, std::int64_t, std::int64_t); \
  template bool add_stream<T>(const T*, const T*, T*, std::int64_t);
#define KSHARD_INSTANTIATE_STREAM_STORAGE(T)                                         \
  template bool cast_from_f32_stream<T>(const float*, T*, std::int64_t);             \
  template bool accumulate_with_stats_stream<T>(const T*, float*, double*, std::int64_t, \
                                                GradWrite);
