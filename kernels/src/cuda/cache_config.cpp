#include "cache_config.hpp"

#include <cuda_runtime.h>

#include <string>

#include "kshard/error.hpp"

namespace kshard::detail {

void restore_default_cache_config() {
  // A function-local static: thread-safe, once. (A later Kokkos::initialize
  // in the same process sets Kokkos' preference again; a training process
  // initializes once.)
  static const bool done = [] {
    const cudaError_t e = cudaDeviceSetCacheConfig(cudaFuncCachePreferNone);
    if (e != cudaSuccess)
      throw Error(std::string("cudaDeviceSetCacheConfig(cudaFuncCachePreferNone): ") +
                      cudaGetErrorString(e),
                  "cudaSuccess");
    return true;
  }();
  (void)done;
}

}  // namespace kshard::detail
