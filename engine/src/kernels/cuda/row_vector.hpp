#pragma once
// What the CUDA row kernels (layer_norm_rows_cuda.cpp, cross_entropy_rows_cuda.cpp)
// share: 16-byte vectors of a storage type and their alignment test (the
// launch check is launch.hpp's). Private to the engine's CUDA backend.
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

}  // namespace kshard::detail::cuda_rows
