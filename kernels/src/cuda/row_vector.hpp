#pragma once
// What the engine's CUDA kernels over rows and flat arrays (layer_norm_rows,
// cross_entropy_rows, elementwise_stream) share: 16-byte vectors
// of a storage type and their alignment test (the launch check is
// launch.hpp's). Private to the engine's CUDA backend.
#include <cuda_runtime.h>

#include <cstdint>

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
