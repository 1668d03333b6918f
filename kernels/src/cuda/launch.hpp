#pragma once
// What the engine's CUDA kernel files share to launch a kernel: the check
// after a launch, and a launch with more than 48 KiB of dynamic shared
// memory. Private to the engine's CUDA backend. Plain CUDA runtime, no
// Kokkos: the host emulation of the attention kernels
// (tests/layers/flash_cuda_emulation) puts its own launch.hpp in its place.
#include <cuda_runtime.h>

#include <cstddef>
#include <string>

#include "kshard/error.hpp"

namespace kshard::detail::cuda_launch {

/// Throws kshard::Error when the last launch failed.
inline void check_launch(const char* kernel) {
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess)
    throw Error(std::string("launching ") + kernel + ": " + cudaGetErrorName(e) + " (" +
                    cudaGetErrorString(e) + ")",
                "cudaSuccess");
}

/// kernel<<<grid, threads, smem, stream>>>(params), checked. Dynamic shared
/// memory above 48 KiB must be opted into per kernel (cheap: done on every
/// launch so that it also holds after a device reset).
template <class Kernel, class Params>
void launch_with_smem(Kernel kernel, const char* name, dim3 grid, int threads, std::size_t smem,
                      cudaStream_t stream, const Params& params) {
  const cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             static_cast<int>(smem));
  if (e != cudaSuccess)
    throw Error(std::string("cudaFuncSetAttribute(") + name + ", " + std::to_string(smem) +
                    " B shared): " + cudaGetErrorName(e),
                "a GPU with that much shared memory per block (sm_80 or newer)");
  kernel<<<grid, threads, smem, stream>>>(params);
  check_launch(name);
}

}  // namespace kshard::detail::cuda_launch
