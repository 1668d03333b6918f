// CUDA backend of rms_norm_rows.hpp: one warp per row, the row in registers,
// laid out as LayerNorm's row kernels (layer_norm_rows_cuda.cpp) lay it out.
//
// Lane l holds chunks c = 0..N-1 of V = 16 / sizeof(T) elements at columns
// (c * 32 + l) * V .. + V: every load and store is a 16-byte vector and a
// warp's 32 vectors of one chunk are 512 contiguous bytes (coalesced). The
// forward reads x once (sum of squares, then y, from registers); the backward
// reads x and dy once (sum of g * xhat, then dx and dy * xhat). Statistics
// are f32, reduced with warp shuffles. 8 warps (rows) per 256-thread block.
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include <Kokkos_Core.hpp>

#include "kshard/kernels/rms_norm_rows.hpp"
#include "kshard/numeric/compute.hpp"
#include "launch.hpp"
#include "row_vector.hpp"

namespace kshard::detail {
namespace {

constexpr int kWarps = 8;
// Chunks per lane at most: rows up to 2048 f32 / 4096 bf16 elements. The
// backward holds x and dy (2 x 64 32-bit registers per lane at 16 chunks), as
// LayerNorm's does; wider rows would spill, and run the portable kernels.
constexpr int kMaxChunks = 16;

using cuda_launch::check_launch;
using cuda_rows::Chunk;
using cuda_rows::kVec;
using cuda_rows::load;
using cuda_rows::store;
using cuda_rows::warp_sum;

template <class T, int N>
__global__ void __launch_bounds__(kWarps * 32)
    rms_forward_kernel(const T* __restrict__ x, const T* __restrict__ gamma, T* __restrict__ y,
                       float* __restrict__ rstd, std::int64_t rows, int d, float eps) {
  constexpr int V = kVec<T>;
  const std::int64_t r = std::int64_t(blockIdx.x) * kWarps + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  // The whole warp leaves together (r is per warp), so warp_sum's full mask holds.
  if (r >= rows) return;
  const T* xr = x + r * d;
  Chunk<T> c[N];
#pragma unroll
  for (int i = 0; i < N; ++i) c[i] = load(xr + (i * 32 + lane) * V);
  float q = 0.f;
#pragma unroll
  for (int i = 0; i < N; ++i)
#pragma unroll
    for (int j = 0; j < V; ++j) {
      const float v = to_accum(c[i].v[j]);
      q += v * v;
    }
  const float rs = 1.f / sqrtf(warp_sum(q) / float(d) + eps);
  T* yr = y + r * d;
#pragma unroll
  for (int i = 0; i < N; ++i) {
    const int col = (i * 32 + lane) * V;
    const Chunk<T> g = load(gamma + col);
    Chunk<T> out;
#pragma unroll
    for (int j = 0; j < V; ++j)
      out.v[j] = from_accum<T>(to_accum(c[i].v[j]) * rs * to_accum(g.v[j]));
    store(yr + col, out);
  }
  if (lane == 0) rstd[r] = rs;
}

// With xhat = x * rstd and g = dy * gamma:
//   dx = rstd * (g - xhat * mean(g * xhat)),  dy_xhat = dy * xhat (f32).
template <class T, int N>
__global__ void __launch_bounds__(kWarps * 32)
    rms_backward_kernel(const T* __restrict__ x, const T* __restrict__ gamma,
                        const T* __restrict__ dy, const float* __restrict__ rstd,
                        T* __restrict__ dx, float* __restrict__ dy_xhat, std::int64_t rows,
                        int d) {
  constexpr int V = kVec<T>;
  const std::int64_t r = std::int64_t(blockIdx.x) * kWarps + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (r >= rows) return;
  const std::int64_t o = r * d;
  const float rs = rstd[r];
  Chunk<T> xc[N], gc[N];
#pragma unroll
  for (int i = 0; i < N; ++i) {
    xc[i] = load(x + o + (i * 32 + lane) * V);
    gc[i] = load(dy + o + (i * 32 + lane) * V);
  }
  float sgx = 0.f;
#pragma unroll
  for (int i = 0; i < N; ++i) {
    const Chunk<T> w = load(gamma + (i * 32 + lane) * V);
#pragma unroll
    for (int j = 0; j < V; ++j)
      sgx += to_accum(gc[i].v[j]) * to_accum(w.v[j]) * to_accum(xc[i].v[j]) * rs;
  }
  const float b = warp_sum(sgx) / float(d);
  // Convert x and dy again below rather than keep pass one's f32 copies live:
  // without this the 16-bit rows of 10+ chunks spill (ptxas -v, CUDA 13,
  // sm_80: bf16 at 16 chunks 856 bytes per thread, f16 288; with it bf16 80,
  // f16 none). Values and rounding are unchanged.
#pragma unroll
  for (int i = 0; i < N; ++i) {
    cuda_rows::reload_barrier(xc[i]);
    cuda_rows::reload_barrier(gc[i]);
  }
#pragma unroll
  for (int i = 0; i < N; ++i) {
    const int col = (i * 32 + lane) * V;
    const Chunk<T> w = load(gamma + col);
    Chunk<T> out;
    float p[V];
#pragma unroll
    for (int j = 0; j < V; ++j) {
      const float xhat = to_accum(xc[i].v[j]) * rs;
      const float dyv = to_accum(gc[i].v[j]);
      out.v[j] = from_accum<T>(rs * (dyv * to_accum(w.v[j]) - xhat * b));
      p[j] = dyv * xhat;
    }
    store(dx + o + col, out);
    cuda_rows::store_f32(dy_xhat + o + col, p);
  }
}

}  // namespace

template <class T, class A>
bool rms_norm_forward_rows(const T* x, const T* gamma, T* y, A* rstd, std::int64_t rows,
                           std::int64_t d, double eps) {
  if constexpr (std::is_same_v<T, double>) {
    return false;
  } else {
    const auto launch =
        cuda_rows::row_launch<T, kMaxChunks, kWarps>(rows, d, x, gamma, y);
    if (!launch) return false;
    cudaStream_t stream = Kokkos::DefaultExecutionSpace().cuda_stream();
    cuda_rows::with_chunks<1, kMaxChunks>(launch.chunks, [&](auto nc) {
      rms_forward_kernel<T, decltype(nc)::value>
          <<<launch.blocks, kWarps * 32, 0, stream>>>(
              x, gamma, y, rstd, rows, static_cast<int>(d), static_cast<float>(eps));
    });
    check_launch("kshard rms_forward_kernel");
    return true;
  }
}

template <class T, class A>
bool rms_norm_backward_rows(const T* x, const T* gamma, const T* dy, const A* rstd, T* dx,
                            A* dy_xhat, std::int64_t rows, std::int64_t d) {
  if constexpr (std::is_same_v<T, double>) {
    return false;
  } else {
    const auto launch =
        cuda_rows::row_launch<T, kMaxChunks, kWarps>(rows, d, x, gamma, dy, dx, dy_xhat);
    if (!launch) return false;
    cudaStream_t stream = Kokkos::DefaultExecutionSpace().cuda_stream();
    cuda_rows::with_chunks<1, kMaxChunks>(launch.chunks, [&](auto nc) {
      rms_backward_kernel<T, decltype(nc)::value>
          <<<launch.blocks, kWarps * 32, 0, stream>>>(
              x, gamma, dy, rstd, dx, dy_xhat, rows, static_cast<int>(d));
    });
    check_launch("kshard rms_backward_kernel");
    return true;
  }
}

KSHARD_FOR_EACH_COMPUTE_TYPE(KSHARD_INSTANTIATE_RMS_ROWS)

}  // namespace kshard::detail
