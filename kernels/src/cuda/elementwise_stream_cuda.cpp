// CUDA backend of elementwise_stream.hpp.
//
// One thread per chunk of kV = 8 consecutive elements: it loads every input
// of its chunk as 16-byte vectors (one for 8 bf16/f16, two for 8 f32) before
// it computes, so each thread has 16-48 bytes in flight instead of the 2-4 of
// a one-element-per-iteration loop. 256-thread blocks, one chunk per thread
// (no grid-stride loop: the blocks are short and many, and the last one ends
// the kernel). The last, partial chunk and arrays whose pointers are not
// 16-byte aligned run the same arithmetic one element at a time.
//
// The statistics kernel gives each thread kStatChunks chunks (all loaded
// first), reduces a block's partial sums in a fixed order (warp butterflies,
// then the warps in order) into one slot pair per block, and a one-block
// kernel adds the slots, again in a fixed order: the result does not depend
// on scheduling (bitwise repeatable), and stays on the device.
#include <cuda_runtime.h>

#include <cstdint>

#include <Kokkos_Core.hpp>

#include "kshard/kernels/elementwise_stream.hpp"
#include "kshard/core/buffer_pool.hpp"
#include "kshard/numeric/compute.hpp"
#include "../pointwise.hpp"
#include "launch.hpp"
#include "row_vector.hpp"

namespace kshard::detail {
namespace {

constexpr int kThreads = 256;
constexpr int kV = 8;           // elements per chunk
constexpr int kStatChunks = 4;  // chunks per thread in the statistics kernel
constexpr int kTotalThreads = 1024;

using cuda_launch::check_launch;

using cuda_rows::aligned16;
using cuda_rows::load8;
using cuda_rows::store8;
template <class T>
using Vec = cuda_rows::Vec8<T>;
static_assert(kV == 8, "the chunks are cuda_rows::Vec8");

template <class... P>
bool all_aligned(const P*... p) {
  return (aligned16(p) && ...);
}

cudaStream_t stream() { return Kokkos::DefaultExecutionSpace().cuda_stream(); }

// --- the element-wise operations (one output element from the inputs at i) --

template <class T>
struct CastOp {
  const float* src;
  T* dst;
  __device__ void chunk(std::int64_t e) const {
    const Vec<float> s = load8(src + e);
    Vec<T> d;
#pragma unroll
    for (int k = 0; k < kV; ++k) d.v[k] = from_float<T>(s.v[k]);
    store8(dst + e, d);
  }
  __device__ void one(std::int64_t i) const { dst[i] = from_float<T>(src[i]); }
};

template <class T>
struct GeluForwardOp {
  const T* x;
  T* y;
  __device__ void chunk(std::int64_t e) const {
    const Vec<T> a = load8(x + e);
    Vec<T> o;
#pragma unroll
    for (int k = 0; k < kV; ++k) o.v[k] = from_accum<T>(pointwise::gelu(to_accum(a.v[k])));
    store8(y + e, o);
  }
  __device__ void one(std::int64_t i) const { y[i] = from_accum<T>(pointwise::gelu(to_accum(x[i]))); }
};

template <class T>
struct GeluBackwardOp {
  const T* x;
  const T* dy;
  T* dx;
  __device__ void chunk(std::int64_t e) const {
    const Vec<T> a = load8(x + e);
    const Vec<T> g = load8(dy + e);
    Vec<T> o;
#pragma unroll
    for (int k = 0; k < kV; ++k)
      o.v[k] = from_accum<T>(to_accum(g.v[k]) * pointwise::gelu_slope(to_accum(a.v[k])));
    store8(dx + e, o);
  }
  __device__ void one(std::int64_t i) const {
    dx[i] = from_accum<T>(to_accum(dy[i]) * pointwise::gelu_slope(to_accum(x[i])));
  }
};

// SwiGLU over rows of [a | b]: chunk e of the output (y is [rows, h]) lies in
// one row when h is a multiple of kV (run_rows checks), so its a and b are
// 8 consecutive elements each, h apart.
template <class T>
struct SwigluForwardOp {
  const T* x;
  T* y;
  std::int64_t h;
  __device__ std::int64_t input_of(std::int64_t e) const {
    const std::int64_t r = e / h;
    return e + r * h;  // r * 2h + (e - r * h)
  }
  __device__ void chunk(std::int64_t e) const {
    const std::int64_t ia = input_of(e);
    const Vec<T> a = load8(x + ia);
    const Vec<T> b = load8(x + ia + h);
    Vec<T> o;
#pragma unroll
    for (int k = 0; k < kV; ++k)
      o.v[k] = from_accum<T>(pointwise::swiglu(to_accum(a.v[k]), to_accum(b.v[k])));
    store8(y + e, o);
  }
  __device__ void one(std::int64_t i) const {
    const std::int64_t ia = input_of(i);
    y[i] = from_accum<T>(pointwise::swiglu(to_accum(x[ia]), to_accum(x[ia + h])));
  }
};

template <class T>
struct SwigluBackwardOp {
  const T* x;
  const T* dy;
  T* dx;
  std::int64_t h;
  __device__ std::int64_t input_of(std::int64_t e) const { return e + (e / h) * h; }
  __device__ void chunk(std::int64_t e) const {
    const std::int64_t ia = input_of(e);
    const Vec<T> a = load8(x + ia);
    const Vec<T> b = load8(x + ia + h);
    const Vec<T> g = load8(dy + e);
    Vec<T> da, db;
#pragma unroll
    for (int k = 0; k < kV; ++k) {
      accum_t<T> ga, gb;
      pointwise::swiglu_grads(to_accum(a.v[k]), to_accum(b.v[k]), to_accum(g.v[k]), ga, gb);
      da.v[k] = from_accum<T>(ga);
      db.v[k] = from_accum<T>(gb);
    }
    store8(dx + ia, da);
    store8(dx + ia + h, db);
  }
  __device__ void one(std::int64_t i) const {
    const std::int64_t ia = input_of(i);
    accum_t<T> ga, gb;
    pointwise::swiglu_grads(to_accum(x[ia]), to_accum(x[ia + h]), to_accum(dy[i]), ga, gb);
    dx[ia] = from_accum<T>(ga);
    dx[ia + h] = from_accum<T>(gb);
  }
};

template <class T>
struct AddOp {
  const T* a;
  const T* b;
  T* out;
  __device__ void chunk(std::int64_t e) const {
    const Vec<T> p = load8(a + e);
    const Vec<T> q = load8(b + e);
    Vec<T> o;
#pragma unroll
    for (int k = 0; k < kV; ++k) o.v[k] = from_accum<T>(to_accum(p.v[k]) + to_accum(q.v[k]));
    store8(out + e, o);
  }
  __device__ void one(std::int64_t i) const {
    out[i] = from_accum<T>(to_accum(a[i]) + to_accum(b[i]));
  }
};

template <bool Vectorized, class Op>
__global__ void __launch_bounds__(kThreads) stream_kernel(const Op op, const std::int64_t n) {
  const std::int64_t e = (std::int64_t(blockIdx.x) * kThreads + threadIdx.x) * kV;
  if (e >= n) return;
  if (Vectorized && e + kV <= n) {
    op.chunk(e);
  } else {
    const std::int64_t end = e + kV < n ? e + kV : n;
    for (std::int64_t i = e; i < end; ++i) op.one(i);
  }
}

std::int64_t chunks_of(std::int64_t n) { return (n + kV - 1) / kV; }

// `vectorizable`: the chunks may be loaded as vectors besides the pointers'
// alignment (false: every element alone, same arithmetic).
template <class Op, class... P>
bool run(const char* name, std::int64_t n, const Op& op, bool vectorizable,
         const P*... pointers) {
  if (n <= 0) return true;
  const std::int64_t blocks = (chunks_of(n) + kThreads - 1) / kThreads;
  if (blocks > 0x7fffffff) return false;  // beyond one grid: the portable kernel serves
  const dim3 grid(static_cast<unsigned>(blocks));
  if (vectorizable && all_aligned(pointers...))
    stream_kernel<true><<<grid, kThreads, 0, stream()>>>(op, n);
  else
    stream_kernel<false><<<grid, kThreads, 0, stream()>>>(op, n);
  check_launch(name);
  return true;
}

// --- gradient statistics ------------------------------------------------------

// dst per Mode from (dst, src); what accumulate_with_stats writes.
template <GradWrite Mode, class T>
__device__ __forceinline__ float written(float d, T s) {
  if constexpr (Mode == GradWrite::add)
    return d + to_float(s);
  else if constexpr (Mode == GradWrite::assign)
    return to_float(s);
  else
    return d;
}

__device__ __forceinline__ double warp_sum(double s) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
  return s;
}

/// The block's (a, b) summed in a fixed order; valid in thread 0.
template <int Threads>
__device__ __forceinline__ void block_sum(double& a, double& b) {
  constexpr int kWarps = Threads / 32;
  __shared__ double sa[kWarps], sb[kWarps];
  a = warp_sum(a);
  b = warp_sum(b);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) {
    sa[warp] = a;
    sb[warp] = b;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    a = 0;
    b = 0;
    for (int w = 0; w < kWarps; ++w) {
      a += sa[w];
      b += sb[w];
    }
  }
}

template <GradWrite Mode, bool Vectorized, class T>
__global__ void __launch_bounds__(kThreads)
    stats_kernel(const T* src, float* dst, double* slots, const std::int64_t n) {
  constexpr std::int64_t per_block = std::int64_t(kThreads) * kV * kStatChunks;
  const std::int64_t base = std::int64_t(blockIdx.x) * per_block;
  double sq = 0, bad = 0;
  if (Vectorized && base + per_block <= n) {
    // Chunk j of this thread starts at base + (j * kThreads + tid) * kV: a
    // warp's loads of one j are contiguous. Every load first, then the math.
    Vec<float> d[kStatChunks];
    Vec<T> s[kStatChunks];
#pragma unroll
    for (int j = 0; j < kStatChunks; ++j) {
      const std::int64_t e = base + (std::int64_t(j) * kThreads + threadIdx.x) * kV;
      if constexpr (Mode != GradWrite::assign) d[j] = load8(dst + e);
      if constexpr (Mode != GradWrite::none) s[j] = load8(src + e);
    }
#pragma unroll
    for (int j = 0; j < kStatChunks; ++j) {
      Vec<float> w;
#pragma unroll
      for (int k = 0; k < kV; ++k) {
        w.v[k] = written<Mode>(Mode == GradWrite::assign ? 0.0f : d[j].v[k], s[j].v[k]);
        pointwise::tally(w.v[k], sq, bad);
      }
      if constexpr (Mode != GradWrite::none)
        store8(dst + base + (std::int64_t(j) * kThreads + threadIdx.x) * kV, w);
    }
  } else {
    const std::int64_t end = base + per_block < n ? base + per_block : n;
    for (std::int64_t i = base + threadIdx.x; i < end; i += kThreads) {
      const float v =
          written<Mode>(Mode == GradWrite::assign ? 0.0f : dst[i], Mode == GradWrite::none ? T() : src[i]);
      if constexpr (Mode != GradWrite::none) dst[i] = v;
      pointwise::tally(v, sq, bad);
    }
  }
  block_sum<kThreads>(sq, bad);
  if (threadIdx.x == 0) {
    slots[2 * blockIdx.x] = sq;
    slots[2 * blockIdx.x + 1] = bad;
  }
}

__global__ void __launch_bounds__(kTotalThreads)
    stats_total_kernel(const double* slots, const std::int64_t count, double* stats) {
  double a = 0, b = 0;
  for (std::int64_t i = threadIdx.x; i < count; i += kTotalThreads) {
    a += slots[2 * i];
    b += slots[2 * i + 1];
  }
  block_sum<kTotalThreads>(a, b);
  if (threadIdx.x == 0) {
    stats[0] = a;
    stats[1] = b;
  }
}

template <GradWrite Mode, bool Vectorized, class T>
void launch_stats(const T* src, float* dst, double* slots, std::int64_t n, unsigned blocks) {
  stats_kernel<Mode, Vectorized, T><<<blocks, kThreads, 0, stream()>>>(src, dst, slots, n);
}

template <GradWrite Mode, class T>
void launch_stats(bool vectorized, const T* src, float* dst, double* slots, std::int64_t n,
                  unsigned blocks) {
  if (vectorized)
    launch_stats<Mode, true>(src, dst, slots, n, blocks);
  else
    launch_stats<Mode, false>(src, dst, slots, n, blocks);
}

}  // namespace

template <class T>
bool cast_from_f32_stream(const float* src, T* dst, std::int64_t n) {
  return run("kshard::cast_from_f32 (stream)", n, CastOp<T>{src, dst}, true, src, dst);
}

template <class T>
bool gelu_forward_stream(const T* x, T* y, std::int64_t n) {
  return run("kshard::gelu_forward (stream)", n, GeluForwardOp<T>{x, y}, true, x, y);
}

template <class T>
bool gelu_backward_stream(const T* x, const T* dy, T* dx, std::int64_t n) {
  return run("kshard::gelu_backward (stream)", n, GeluBackwardOp<T>{x, dy, dx}, true, x, dy, dx);
}

// A chunk must not cross a row (h a multiple of kV); with the base pointers
// aligned, h * sizeof(T) a multiple of 16 then keeps every row's halves aligned.
template <class T>
bool swiglu_forward_stream(const T* x, T* y, std::int64_t rows, std::int64_t h) {
  return run("kshard::swiglu_forward (stream)", rows * h, SwigluForwardOp<T>{x, y, h},
             h % kV == 0, x, y);
}

template <class T>
bool swiglu_backward_stream(const T* x, const T* dy, T* dx, std::int64_t rows, std::int64_t h) {
  return run("kshard::swiglu_backward (stream)", rows * h, SwigluBackwardOp<T>{x, dy, dx, h},
             h % kV == 0, x, dy, dx);
}

template <class T>
bool add_stream(const T* a, const T* b, T* out, std::int64_t n) {
  return run("kshard::add (stream)", n, AddOp<T>{a, b, out}, true, a, b, out);
}

template <class T>
bool accumulate_with_stats_stream(const T* src, float* dst, double* stats, std::int64_t n,
                                  GradWrite mode) {
  if (n <= 0) return false;
  constexpr std::int64_t per_block = std::int64_t(kThreads) * kV * kStatChunks;
  const std::int64_t blocks = (n + per_block - 1) / per_block;
  if (blocks > 0x7fffffff) return false;
  memory::Block block = memory::acquire(std::size_t(2 * blocks) * sizeof(double),
                                        "kshard::accumulate_with_stats");
  double* slots = block.view<double>(std::size_t(2 * blocks)).data();
  const bool vec = aligned16(dst) && (mode == GradWrite::none || aligned16(src));
  const auto b = static_cast<unsigned>(blocks);
  switch (mode) {
    case GradWrite::add: launch_stats<GradWrite::add>(vec, src, dst, slots, n, b); break;
    case GradWrite::assign: launch_stats<GradWrite::assign>(vec, src, dst, slots, n, b); break;
    default: launch_stats<GradWrite::none>(vec, src, dst, slots, n, b); break;
  }
  check_launch("kshard::accumulate_with_stats (stream)");
  stats_total_kernel<<<1, kTotalThreads, 0, stream()>>>(slots, blocks, stats);
  check_launch("kshard::accumulate_with_stats_total (stream)");
  // The slots go back to the pool with both kernels queued: later users of
  // the block are ordered after them on the same stream.
  return true;
}

KSHARD_FOR_EACH_COMPUTE_TYPE(KSHARD_INSTANTIATE_STREAM_COMPUTE)
KSHARD_INSTANTIATE_STREAM_STORAGE(float)
KSHARD_INSTANTIATE_STREAM_STORAGE(bfloat16_t)
KSHARD_INSTANTIATE_STREAM_STORAGE(float16_t)

}  // namespace kshard::detail
