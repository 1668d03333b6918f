// CUDA backend of layer_norm_rows.hpp: one warp per row, the row in
// registers.
//
// Lane l holds chunks c = 0..N-1 of V = 16 / sizeof(T) elements at columns
// (c * 32 + l) * V .. + V: every load and store is a 16-byte vector and a
// warp's 32 vectors of one chunk are 512 contiguous bytes (coalesced). The
// forward reads x once (mean, then centred squares, then y, all from
// registers); the backward reads x and dy once. Statistics are f32 and
// reduced with warp shuffles (butterfly: every lane ends with the same sum,
// so the result does not depend on which lane reads it). 8 warps (rows) per
// 256-thread block.
#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <type_traits>

#include <Kokkos_Core.hpp>

#include "kshard/kernels/layer_norm_rows.hpp"
#include "kshard/error.hpp"
#include "launch.hpp"
#include "row_vector.hpp"
#include "kshard/numeric/compute.hpp"

namespace kshard::detail {
namespace {

constexpr int kWarps = 8;
// Chunks per lane at most: rows up to 2048 f32 / 4096 bf16 elements (the
// backward then holds 2 x 64 f32 values of x and dy per lane in registers).
constexpr int kMaxChunks = 16;

using cuda_rows::Chunk;
using cuda_rows::kVec;
using cuda_rows::load;
using cuda_rows::store;
using cuda_rows::warp_sum;
using cuda_launch::check_launch;

template <class T, int N>
__global__ void __launch_bounds__(kWarps * 32)
    ln_forward_kernel(const T* __restrict__ x, const T* __restrict__ gamma,
                      const T* __restrict__ beta, T* __restrict__ y, float* __restrict__ mean,
                      float* __restrict__ rstd, std::int64_t rows, int d, float eps) {
  constexpr int V = kVec<T>;
  const std::int64_t r = std::int64_t(blockIdx.x) * kWarps + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (r >= rows) return;
  const T* xr = x + r * d;
  Chunk<T> c[N];
#pragma unroll
  for (int i = 0; i < N; ++i) c[i] = load(xr + (i * 32 + lane) * V);
  float s = 0.f;
#pragma unroll
  for (int i = 0; i < N; ++i)
#pragma unroll
    for (int j = 0; j < V; ++j) s += to_accum(c[i].v[j]);
  const float mu = warp_sum(s) / float(d);
  // Two passes (mean, then centred squares): no cancellation for large means.
  float q = 0.f;
#pragma unroll
  for (int i = 0; i < N; ++i)
#pragma unroll
    for (int j = 0; j < V; ++j) {
      const float e = to_accum(c[i].v[j]) - mu;
      q += e * e;
    }
  const float rs = 1.f / sqrtf(warp_sum(q) / float(d) + eps);
  T* yr = y + r * d;
#pragma unroll
  for (int i = 0; i < N; ++i) {
    const int col = (i * 32 + lane) * V;
    const Chunk<T> g = load(gamma + col), b = load(beta + col);
    Chunk<T> out;
#pragma unroll
    for (int j = 0; j < V; ++j)
      out.v[j] = from_accum<T>((to_accum(c[i].v[j]) - mu) * rs * to_accum(g.v[j]) +
                               to_accum(b.v[j]));
    store(yr + col, out);
  }
  if (lane == 0) {
    mean[r] = mu;
    rstd[r] = rs;
  }
}

template <class T, int N>
__global__ void __launch_bounds__(kWarps * 32)
    ln_backward_kernel(const T* __restrict__ x, const T* __restrict__ gamma,
                       const T* __restrict__ dy, const float* __restrict__ mean,
                       const float* __restrict__ rstd, T* __restrict__ dx,
                       float* __restrict__ dy_xhat, std::int64_t rows, int d) {
  constexpr int V = kVec<T>;
  const std::int64_t r = std::int64_t(blockIdx.x) * kWarps + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (r >= rows) return;
  const std::int64_t o = r * d;
  const float mu = mean[r], rs = rstd[r];
  Chunk<T> xc[N], gc[N];
#pragma unroll
  for (int i = 0; i < N; ++i) {
    xc[i] = load(x + o + (i * 32 + lane) * V);
    gc[i] = load(dy + o + (i * 32 + lane) * V);
  }
  float sg = 0.f, sgx = 0.f;
#pragma unroll
  for (int i = 0; i < N; ++i) {
    const Chunk<T> w = load(gamma + (i * 32 + lane) * V);
#pragma unroll
    for (int j = 0; j < V; ++j) {
      const float g = to_accum(gc[i].v[j]) * to_accum(w.v[j]);
      sg += g;
      sgx += g * ((to_accum(xc[i].v[j]) - mu) * rs);
    }
  }
  const float a = warp_sum(sg) / float(d), b = warp_sum(sgx) / float(d);
#pragma unroll
  for (int i = 0; i < N; ++i) {
    const int col = (i * 32 + lane) * V;
    const Chunk<T> w = load(gamma + col);
    Chunk<T> out;
    float p[V];
#pragma unroll
    for (int j = 0; j < V; ++j) {
      const float xhat = (to_accum(xc[i].v[j]) - mu) * rs;
      const float dyv = to_accum(gc[i].v[j]);
      out.v[j] = from_accum<T>(rs * (dyv * to_accum(w.v[j]) - a - xhat * b));
      p[j] = dyv * xhat;
    }
    store(dx + o + col, out);
    cuda_rows::store_f32(dy_xhat + o + col, p);
  }
}

}  // namespace

template <class T, class A>
bool layer_norm_forward_rows(const T* x, const T* gamma, const T* beta, T* y, A* mean, A* rstd,
                             std::int64_t rows, std::int64_t d, double eps) {
  if constexpr (std::is_same_v<T, double>) {
    return false;
  } else {
    const auto launch =
        cuda_rows::row_launch<T, kMaxChunks, kWarps>(rows, d, x, gamma, beta, y);
    if (!launch) return false;
    cudaStream_t stream = Kokkos::DefaultExecutionSpace().cuda_stream();
    cuda_rows::with_chunks<1, kMaxChunks>(launch.chunks, [&](auto nc) {
      ln_forward_kernel<T, decltype(nc)::value>
          <<<launch.blocks, kWarps * 32, 0, stream>>>(
              x, gamma, beta, y, mean, rstd, rows, static_cast<int>(d), static_cast<float>(eps));
    });
    check_launch("kshard ln_forward_kernel");
    return true;
  }
}

template <class T, class A>
bool layer_norm_backward_rows(const T* x, const T* gamma, const T* dy, const A* mean,
                              const A* rstd, T* dx, A* dy_xhat, std::int64_t rows,
                              std::int64_t d) {
  if constexpr (std::is_same_v<T, double>) {
    return false;
  } else {
    const auto launch =
        cuda_rows::row_launch<T, kMaxChunks, kWarps>(rows, d, x, gamma, dy, dx, dy_xhat);
    if (!launch) return false;
    cudaStream_t stream = Kokkos::DefaultExecutionSpace().cuda_stream();
    cuda_rows::with_chunks<1, kMaxChunks>(launch.chunks, [&](auto nc) {
      ln_backward_kernel<T, decltype(nc)::value>
          <<<launch.blocks, kWarps * 32, 0, stream>>>(
              x, gamma, dy, mean, rstd, dx, dy_xhat, rows, static_cast<int>(d));
    });
    check_launch("kshard ln_backward_kernel");
    return true;
  }
}

KSHARD_FOR_EACH_COMPUTE_TYPE(KSHARD_INSTANTIATE_LN_ROWS)

}  // namespace kshard::detail
