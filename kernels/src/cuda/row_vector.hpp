#pragma once
// What the engine's CUDA kernels over rows and flat arrays (layer_norm_rows,
// rms_norm_rows, cross_entropy_rows, elementwise_stream) share: 16-byte
// vectors of a storage type and their alignment test, and for the kernels
// that hold a row in one warp's registers the warp sum and the dispatch on
// the row's width (the launch check is launch.hpp's). Private to the
// engine's CUDA backend.
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>
#include <type_traits>

namespace kshard::detail::cuda_rows {

/// Elements of T in one 16-byte load.
template <class T>
constexpr int kVec = 16 / static_cast<int>(sizeof(T));

/// One 16-byte vector of T (loaded and stored as a whole).
template <class T>
struct alignas(16) Chunk {
  T v[kVec<T>];
};

inline bool aligned16(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; }

/// p must be 16-byte aligned.
template <class T>
__device__ __forceinline__ Chunk<T> load(const T* p) {
  return *reinterpret_cast<const Chunk<T>*>(p);
}
template <class T>
__device__ __forceinline__ void store(T* p, const Chunk<T>& c) {
  *reinterpret_cast<Chunk<T>*>(p) = c;
}

/// An empty asm that "rewrites" c's 32-bit words: the compiler must convert
/// c's elements again after it instead of keeping the f32 values of a first
/// pass live into a second. A 16-bit row of N chunks then stays in 4N packed
/// registers rather than 8N f32 ones (what makes the 16-bit backward kernels
/// spill at 10+ chunks); no instruction is emitted.
template <class T>
__device__ __forceinline__ void reload_barrier(Chunk<T>& c) {
  static_assert(sizeof(Chunk<T>) == sizeof(uint4), "four 32-bit words");
  // Through a uint4 copy (memcpy: no aliasing through a cast pointer, which
  // can push the chunk to local memory).
  uint4 u;
  memcpy(&u, &c, sizeof u);
  asm volatile("" : "+r"(u.x), "+r"(u.y), "+r"(u.z), "+r"(u.w));
  memcpy(&c, &u, sizeof u);
}

/// Stores V floats (V a multiple of 4; p 16-byte aligned) as 16-byte
/// vectors: the f32 side outputs (dy * xhat) of a chunk of a 16-bit row.
template <int V>
__device__ __forceinline__ void store_f32(float* p, const float (&v)[V]) {
  static_assert(V % 4 == 0, "whole 16-byte vectors");
#pragma unroll
  for (int j = 0; j < V; j += 4)
    *reinterpret_cast<float4*>(p + j) = make_float4(v[j], v[j + 1], v[j + 2], v[j + 3]);
}

/// The sum over a warp's 32 lanes (butterfly: every lane ends with the same
/// sum, so the result does not depend on which lane reads it).
__device__ __forceinline__ float warp_sum(float s) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
  return s;
}

/// Warp-per-row kernels: lane l holds chunks c = 0..N-1 of a row at columns
/// (c * 32 + l) * kVec<T>. The chunks per lane for width d, or 0 when d is
/// not a whole number of 32-lane chunk rows or needs more than MaxChunks
/// (a kernel's register budget); double rows are never held (0).
template <class T, int MaxChunks>
int row_chunks(std::int64_t d) {
  if constexpr (std::is_same_v<T, double>) {
    (void)d;
    return 0;
  } else {
    const std::int64_t per = 32 * kVec<T>;
    if (d % per != 0 || d / per < 1 || d / per > MaxChunks) return 0;
    return static_cast<int>(d / per);
  }
}

/// f(std::integral_constant<int, n>()) for the n in N..MaxChunks that equals
/// the runtime n (the kernels take the chunk count as a template parameter so
/// that the row stays in registers).
template <int N, int MaxChunks, class F>
void with_chunks(int n, F f) {
  if constexpr (N <= MaxChunks) {
    if (n == N) return f(std::integral_constant<int, N>());
    with_chunks<N + 1, MaxChunks>(n, f);
  }
}

/// The grid of a warp-per-row kernel with Warps rows per block, or none
/// (chunks 0: the backend declines) when row_chunks declines the width, there
/// are no rows, a pointer is not 16-byte aligned or the rows need more blocks
/// than one grid holds.
struct RowLaunch {
  int chunks = 0;
  unsigned blocks = 0;
  explicit operator bool() const { return chunks > 0; }
};
template <class T, int MaxChunks, int Warps, class... P>
RowLaunch row_launch(std::int64_t rows, std::int64_t d, const P*... pointers) {
  RowLaunch l;
  const int n = row_chunks<T, MaxChunks>(d);
  if (n == 0 || rows <= 0 || !(aligned16(pointers) && ...)) return l;
  const std::int64_t blocks = (rows + Warps - 1) / Warps;
  if (blocks > 0x7fffffff) return l;
  l.chunks = n;
  l.blocks = static_cast<unsigned>(blocks);
  return l;
}

/// Eight consecutive elements of T (16, 32 or 64 bytes: whole 16-byte
/// vectors), the unit of work of the flat kernels: one thread loads all of a
/// chunk's inputs before it computes.
template <class T>
struct alignas(16) Vec8 {
  T v[8];
};
/// p must be 16-byte aligned.
template <class T>
__device__ __forceinline__ Vec8<T> load8(const T* p) {
  Vec8<T> r;
  const uint4* s = reinterpret_cast<const uint4*>(p);
  uint4* d = reinterpret_cast<uint4*>(&r);
#pragma unroll
  for (int k = 0; k < int(sizeof(Vec8<T>) / 16); ++k) d[k] = s[k];
  return r;
}
template <class T>
__device__ __forceinline__ void store8(T* p, const Vec8<T>& x) {
  const uint4* s = reinterpret_cast<const uint4*>(&x);
  uint4* d = reinterpret_cast<uint4*>(p);
#pragma unroll
  for (int k = 0; k < int(sizeof(Vec8<T>) / 16); ++k) d[k] = s[k];
}

}  // namespace kshard::detail::cuda_rows
