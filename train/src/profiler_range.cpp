#include "kshard/train/profiler_range.hpp"

#include <Kokkos_Core.hpp>

#if defined(KOKKOS_ENABLE_CUDA)
#include <cuda_profiler_api.h>
#include <cuda_runtime_api.h>
#endif

namespace kshard {

void ProfilerRange::start() {
  if (open_) return;
  // Work queued before the window belongs outside it.
  Kokkos::fence();
#if defined(KOKKOS_ENABLE_CUDA)
  // Without a profiler attached this is a no-op; an error here must not end a
  // training run, so it is cleared, not thrown.
  if (cudaProfilerStart() != cudaSuccess) (void)cudaGetLastError();
#endif
  open_ = true;
}

void ProfilerRange::stop() {
  if (!open_) return;
  Kokkos::fence();
#if defined(KOKKOS_ENABLE_CUDA)
  if (cudaProfilerStop() != cudaSuccess) (void)cudaGetLastError();
#endif
  open_ = false;
}

}  // namespace kshard
