#pragma once
// One device workspace for cuBLAS (gemm_cublas.cpp, set on its handle) and
// cuBLASLt (linear_epilogue_cublaslt.cpp, passed to each matmul). Both run on
// the Kokkos default stream, one call after the other, so one buffer serves
// both (PyTorch shares its cuBLAS workspace with cuBLASLt the same way).
// It is a Kokkos allocation labelled "kshard.cache:workspace:cublas", so the
// memory tracker counts it with the library workspaces that peak reports add
// (memory_tracker.hpp) instead of it being invisible as cuBLAS' own
// cudaMalloc would be. Made on first use, freed in Kokkos::finalize. Private.
#include <cstddef>

namespace kshard::detail {

/// 32 MiB: cuBLAS' own default on Hopper; split-K and stream-K kernels use it.
constexpr std::size_t kCublasWorkspaceBytes = std::size_t(32) << 20;

/// The workspace, 256-byte aligned (cuBLAS' requirement), kCublasWorkspaceBytes long.
void* cublas_workspace();

}  // namespace kshard::detail
