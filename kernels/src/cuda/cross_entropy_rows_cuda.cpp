// CUDA backend of cross_entropy_rows.hpp: one 256-thread block per row.
//
// Pass 1 keeps a running (max m, sum s of exp(l - m)) per thread over its
// 16-byte chunks (a larger value rescales s by exp(m_old - m_new)), then the
// block combines the pairs: warp butterflies, then warp 0 over the 8 warp
// results, in a fixed order (deterministic). Pass 2 writes the gradient; each
// thread reads and writes only its own chunks, so dlogits may alias logits
// (the target's logit is read before the first barrier, before any write).
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <type_traits>

#include <Kokkos_Core.hpp>

#include "kshard/kernels/cross_entropy_rows.hpp"
#include "kshard/error.hpp"
#include "launch.hpp"
#include "row_vector.hpp"
#include "kshard/numeric/compute.hpp"

namespace kshard::detail {
namespace {

constexpr int kThreads = 256;

using cuda_rows::Chunk;
using cuda_rows::kVec;
using cuda_rows::aligned16;
using cuda_launch::check_launch;

struct MaxSum {
  float m, s;
};

// Combines two partial (max, sum of exp(x - max)); -inf maxima carry s = 0.
__device__ __forceinline__ MaxSum combine(MaxSum a, MaxSum b) {
  const float m = fmaxf(a.m, b.m);
  if (m == -INFINITY) return {m, 0.f};
  return {m, a.s * expf(a.m - m) + b.s * expf(b.m - m)};
}

__device__ __forceinline__ MaxSum warp_combine(MaxSum v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    MaxSum other{__shfl_xor_sync(0xffffffffu, v.m, o), __shfl_xor_sync(0xffffffffu, v.s, o)};
    v = combine(v, other);
  }
  return v;
}

template <class Target>
__device__ __forceinline__ bool target_ok(Target t, std::int64_t vocab) {
  return t >= Target(0) && t < Target(vocab) &&
         static_cast<Target>(static_cast<std::int64_t>(t)) == t;
}

template <class T, class Target>
__global__ void __launch_bounds__(kThreads)
    ce_rows_kernel(const T* logits, std::int64_t vocab, const Target* __restrict__ targets,
                   T* dlogits, double grad_scale, const double* __restrict__ result,
                   double* __restrict__ row_loss) {
  constexpr int V = kVec<T>;
  __shared__ MaxSum warp_part[kThreads / 32];
  __shared__ float lse_shared;
  const std::int64_t r = blockIdx.x;
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const T* l = logits + r * vocab;
  T* dl = dlogits + r * vocab;
  const std::int64_t chunks = vocab / V;
  const Target tt = targets[r];
  if (!target_ok(tt, vocab)) {
    Chunk<T> zero;
#pragma unroll
    for (int j = 0; j < V; ++j) zero.v[j] = from_accum<T>(0.f);
    for (std::int64_t k = tid; k < chunks; k += kThreads)
      reinterpret_cast<Chunk<T>*>(dl)[k] = zero;
    if (tid == 0) row_loss[r] = 0;
    return;
  }
  const std::int64_t t = static_cast<std::int64_t>(tt);
  const float lt = to_accum(l[t]);  // before the barriers below, so before any write
  MaxSum acc{-INFINITY, 0.f};
  for (std::int64_t k = tid; k < chunks; k += kThreads) {
    const Chunk<T> c = reinterpret_cast<const Chunk<T>*>(l)[k];
    float cm = to_accum(c.v[0]);
#pragma unroll
    for (int j = 1; j < V; ++j) cm = fmaxf(cm, to_accum(c.v[j]));
    float cs = 0.f;
#pragma unroll
    for (int j = 0; j < V; ++j) cs += expf(to_accum(c.v[j]) - cm);
    acc = combine(acc, MaxSum{cm, cs});
  }
  acc = warp_combine(acc);
  if (lane == 0) warp_part[warp] = acc;
  __syncthreads();
  if (warp == 0) {
    MaxSum v = lane < kThreads / 32 ? warp_part[lane] : MaxSum{-INFINITY, 0.f};
    v = warp_combine(v);
    if (lane == 0) lse_shared = v.m + logf(v.s);
  }
  __syncthreads();
  const float lse = lse_shared;
  const float g = static_cast<float>(grad_scale / result[1]);
  for (std::int64_t k = tid; k < chunks; k += kThreads) {
    const Chunk<T> c = reinterpret_cast<const Chunk<T>*>(l)[k];
    Chunk<T> out;
#pragma unroll
    for (int j = 0; j < V; ++j) {
      const float p = expf(to_accum(c.v[j]) - lse);
      out.v[j] = from_accum<T>(g * (p - (k * V + j == t ? 1.f : 0.f)));
    }
    reinterpret_cast<Chunk<T>*>(dl)[k] = out;
  }
  if (tid == 0) row_loss[r] = static_cast<double>(lse - lt);
}

}  // namespace

template <class T, class Target>
bool cross_entropy_rows(const T* logits, std::int64_t rows, std::int64_t vocab,
                        const Target* targets, T* dlogits, double grad_scale,
                        const double* result, double* row_loss) {
  if constexpr (std::is_same_v<T, double>) {
    return false;
  } else {
    if (rows <= 0 || rows > 0x7fffffff || vocab % kVec<T> != 0 || !aligned16(logits) ||
        !aligned16(dlogits))
      return false;
    cudaStream_t stream = Kokkos::DefaultExecutionSpace().cuda_stream();
    ce_rows_kernel<T, Target><<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(
        logits, vocab, targets, dlogits, grad_scale, result, row_loss);
    check_launch("kshard ce_rows_kernel");
    return true;
  }
}

KSHARD_FOR_EACH_CE_PAIR(KSHARD_INSTANTIATE_CE_ROWS)

}  // namespace kshard::detail
