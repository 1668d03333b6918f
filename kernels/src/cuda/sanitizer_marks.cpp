#include "sanitizer_marks.hpp"

#include <nvtx3/nvToolsExt.h>
#include <nvtx3/nvToolsExtMem.h>
#include <nvtx3/nvToolsExtMemCudaRt.h>

#include <vector>

namespace kshard::detail {
namespace {

nvtxDomainHandle_t domain() {
  static const nvtxDomainHandle_t d = nvtxDomainCreateA("kshard");
  return d;
}

void mark(cudaStream_t stream, const nvtxMemVirtualRangeDesc_t* ranges, std::size_t count) {
  nvtxMemMarkInitializedBatch_t batch{};
  batch.extCompatID = NVTX_EXT_COMPATID_MEM;
  batch.structSize = sizeof(batch);
  batch.regionType = NVTX_MEM_TYPE_VIRTUAL_ADDRESS;
  batch.regionDescCount = count;
  batch.regionDescElementSize = sizeof(nvtxMemVirtualRangeDesc_t);
  batch.regionDescElements = ranges;
  nvtxMemCudaMarkInitialized(domain(), stream, 0, &batch);
}

}  // namespace

void mark_written(cudaStream_t stream, const void* p, std::size_t bytes) {
  if (p == nullptr || bytes == 0) return;
  const nvtxMemVirtualRangeDesc_t r{bytes, p};
  mark(stream, &r, 1);
}

void mark_written_rows(cudaStream_t stream, const void* p, std::int64_t rows,
                       std::size_t row_bytes, std::size_t pitch_bytes) {
  if (p == nullptr || rows <= 0 || row_bytes == 0) return;
  if (pitch_bytes == row_bytes) {
    mark_written(stream, p, std::size_t(rows) * row_bytes);
    return;
  }
  std::vector<nvtxMemVirtualRangeDesc_t> ranges(static_cast<std::size_t>(rows));
  for (std::int64_t r = 0; r < rows; ++r)
    ranges[std::size_t(r)] = {row_bytes, static_cast<const char*>(p) + r * pitch_bytes};
  mark(stream, ranges.data(), ranges.size());
}

}  // namespace kshard::detail
