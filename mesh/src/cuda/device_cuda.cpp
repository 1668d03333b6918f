#include <cuda_runtime_api.h>

#include "../device.hpp"

namespace kshard::detail {
int device_count() noexcept {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();  // clear the sticky error so Kokkos starts clean
    return 0;
  }
  return n;
}
}  // namespace kshard::detail
