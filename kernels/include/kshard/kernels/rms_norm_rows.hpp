#pragma once
// RMSNorm's row kernels (forward: y, rstd; backward: dx and dy * xhat for the
// gamma gradient) where the backend has a faster one than the portable Kokkos
// team kernels of rms_norm.cpp. For the engine's layers (kshard::detail: not
// a user API).
//
// CUDA: one warp per row, the row held in registers (16-byte loads), so x and
// dy are read from memory once and the statistic comes from warp shuffles,
// not from a team reduction through shared memory. It serves float /
// bfloat16_t / float16_t rows whose width is a multiple of 32 lanes x 16
// bytes and at most 16 such chunks per lane (d = 256 .. 4096 for the 16-bit
// types, 128 .. 2048 for f32) with 16-byte-aligned pointers; everything else,
// and every host build, runs the portable kernels (the backend declines).
// Same arithmetic as the portable kernels (f32 statistics, one rounding per
// stored element), a different summation order.
#include <cstdint>

namespace kshard::detail {

/// rstd = 1 / sqrt(mean(x^2) + eps) per row, y = x * rstd * gamma.
/// Returns false when the backend has no kernel for this case (nothing ran).
template <class T, class A>
bool rms_norm_forward_rows(const T* x, const T* gamma, T* y, A* rstd, std::int64_t rows,
                           std::int64_t d, double eps);

/// dx = rstd * (g - xhat * mean(g * xhat)), g = dy * gamma, xhat = x * rstd,
/// and dy_xhat = dy * xhat (accumulation type). Returns false when the
/// backend declines.
template <class T, class A>
bool rms_norm_backward_rows(const T* x, const T* gamma, const T* dy, const A* rstd, T* dx,
                            A* dy_xhat, std::int64_t rows, std::int64_t d);

}  // namespace kshard::detail

/// A backend's explicit instantiation of both row kernels for compute type T
/// (with KSHARD_FOR_EACH_COMPUTE_TYPE).
#define KSHARD_INSTANTIATE_RMS_ROWS(T)                                                       \
  template bool rms_norm_forward_rows<T, accum_t<T>>(const T*, const T*, T*, accum_t<T>*,   \
                                                     std::int64_t, std::int64_t, double);   \
  template bool rms_norm_backward_rows<T, accum_t<T>>(const T*, const T*, const T*,         \
                                                      const accum_t<T>*, T*, accum_t<T>*,   \
                                                      std::int64_t, std::int64_t);
