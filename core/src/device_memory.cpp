#include "kshard/core/device_memory.hpp"

#include <Kokkos_Core.hpp>

#if defined(KOKKOS_ENABLE_CUDA)
#include <cuda_runtime_api.h>
#else
#include <fstream>
#include <sstream>
#include <string>
#endif

namespace kshard::memory {

double available_device_bytes() {
#if defined(KOKKOS_ENABLE_CUDA)
  std::size_t free_bytes = 0, total_bytes = 0;
  if (cudaMemGetInfo(&free_bytes, &total_bytes) != cudaSuccess) {
    (void)cudaGetLastError();  // clear the sticky error state of this call
    return 0;
  }
  return double(free_bytes);
#else
  // MemAvailable: what the kernel thinks can be allocated without swapping.
  std::ifstream in("/proc/meminfo");
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream s(line);
    std::string key;
    double kib = 0;
    if (s >> key >> kib && key == "MemAvailable:") return kib * 1024.0;
  }
  return 0;
#endif
}

}  // namespace kshard::memory
