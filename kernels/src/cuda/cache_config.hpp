#pragma once
// Kokkos 3.4's Cuda::initialize sets the DEVICE-WIDE cache preference to
// cudaFuncCachePreferShared (its own kernels then choose theirs per function
// at launch). Every other kernel inherits it: cuBLAS's, cuDNN's, ours. With
// the L1 squeezed, cuBLAS's f32 SIMT GEMMs ran 7-9 % slower in kshard's
// process than in PyTorch's: same kernel, grid, instruction count, DRAM bytes
// and clock under ncu, and the same speed as PyTorch's in a program without
// Kokkos. kshard puts the device back to the CUDA default (no preference)
// before its first cuBLAS / cuBLASLt handle. Kokkos' kernels are unaffected
// (they set their preference per function). Private.
namespace kshard::detail {

/// cudaDeviceSetCacheConfig(cudaFuncCachePreferNone), once per process.
void restore_default_cache_config();

}  // namespace kshard::detail
