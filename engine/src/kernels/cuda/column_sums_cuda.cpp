// CUDA backend of column_sums.hpp.
//
// Pass 1: a 32 x 8 thread block covers 256 columns (thread x: eight
// consecutive columns, one 16-byte vector of bf16 / two of f32 per row) and
// one slice of the rows (thread y: every 8th row of the slice, four rows'
// loads in flight before they are added). The eight row threads of a column
// are added in order through shared memory into one partial sum per slice.
// Pass 2 adds the slices' partial sums of each column in a fixed order and
// then adds that to db. Enough slices that pass 1 has about two blocks per SM,
// at least 32 rows each.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include <Kokkos_Core.hpp>

#include "../column_sums.hpp"
#include "kshard/mesh/buffer_pool.hpp"
#include "kshard/numeric/compute.hpp"
#include "launch.hpp"
#include "row_vector.hpp"

namespace kshard::detail {
namespace {

constexpr int kColThreads = 32;  // threadIdx.x: chunks of 8 columns
constexpr int kRowThreads = 8;   // threadIdx.y: rows of the slice
constexpr int kColsPerBlock = kColThreads * 8;
constexpr std::int64_t kMinRowsPerSlice = 32;

using cuda_launch::check_launch;
using cuda_rows::load8;
using cuda_rows::Vec8;

template <class U, class A>
__global__ void __launch_bounds__(kColThreads* kRowThreads)
    column_partial_kernel(const U* dy, const std::int64_t rows, const std::int64_t cols,
                          const std::int64_t rows_per_slice, A* partial) {
  const std::int64_t c0 = (std::int64_t(blockIdx.x) * kColThreads + threadIdx.x) * 8;
  const std::int64_t begin = std::int64_t(blockIdx.y) * rows_per_slice;
  const std::int64_t end = begin + rows_per_slice < rows ? begin + rows_per_slice : rows;
  A acc[8];
#pragma unroll
  for (int k = 0; k < 8; ++k) acc[k] = A(0);
  if (c0 < cols) {  // cols is a multiple of 8: the chunk is whole
    std::int64_t r = begin + threadIdx.y;
    for (; r + 3 * kRowThreads < end; r += 4 * kRowThreads) {
      const Vec8<U> a0 = load8(dy + r * cols + c0);
      const Vec8<U> a1 = load8(dy + (r + kRowThreads) * cols + c0);
      const Vec8<U> a2 = load8(dy + (r + 2 * kRowThreads) * cols + c0);
      const Vec8<U> a3 = load8(dy + (r + 3 * kRowThreads) * cols + c0);
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        acc[k] += to_accum(a0.v[k]);
        acc[k] += to_accum(a1.v[k]);
        acc[k] += to_accum(a2.v[k]);
        acc[k] += to_accum(a3.v[k]);
      }
    }
    for (; r < end; r += kRowThreads) {
      const Vec8<U> a = load8(dy + r * cols + c0);
#pragma unroll
      for (int k = 0; k < 8; ++k) acc[k] += to_accum(a.v[k]);
    }
  }
  // [row thread][column in chunk][chunk]: consecutive x in consecutive words.
  __shared__ A sums[kRowThreads][8][kColThreads];
#pragma unroll
  for (int k = 0; k < 8; ++k) sums[threadIdx.y][k][threadIdx.x] = acc[k];
  __syncthreads();
  if (threadIdx.y == 0 && c0 < cols) {
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      A s = sums[0][k][threadIdx.x];
      for (int y = 1; y < kRowThreads; ++y) s += sums[y][k][threadIdx.x];
      partial[std::int64_t(blockIdx.y) * cols + c0 + k] = s;
    }
  }
}

// Pass 2: thread (x, y) of a 32 x 8 block adds slices y, y + 8, ... of
// column 32 blockIdx.x + x (a warp reads 128 contiguous bytes per slice), the
// eight row threads' sums are added in order, and the column total to db.
template <class A>
__global__ void __launch_bounds__(kColThreads* kRowThreads)
    column_total_kernel(const A* partial, const std::int64_t slices, const std::int64_t cols,
                        A* db) {
  const std::int64_t c = std::int64_t(blockIdx.x) * kColThreads + threadIdx.x;
  A t = A(0);
  if (c < cols)
    for (std::int64_t s = threadIdx.y; s < slices; s += kRowThreads) t += partial[s * cols + c];
  __shared__ A sums[kRowThreads][kColThreads];
  sums[threadIdx.y][threadIdx.x] = t;
  __syncthreads();
  if (threadIdx.y == 0 && c < cols) {
    A s = sums[0][threadIdx.x];
    for (int y = 1; y < kRowThreads; ++y) s += sums[y][threadIdx.x];
    db[c] += s;
  }
}

/// Blocks that keep every SM busy: two per SM (sized once per process).
std::int64_t target_blocks() {
  static const std::int64_t blocks = [] {
    int device = 0, sms = 0;
    if (cudaGetDevice(&device) != cudaSuccess ||
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess ||
        sms <= 0) {
      cudaGetLastError();  // clear it: nothing was launched
      sms = 132;           // an H100 / H200
    }
    return std::int64_t(2) * sms;
  }();
  return blocks;
}

}  // namespace

template <class U, class A>
bool column_sums_accumulate(const U* dy, std::int64_t rows, std::int64_t cols, A* db) {
  if (cols % 8 != 0 || !cuda_rows::aligned16(dy)) return false;
  if (rows <= 0 || cols <= 0) return true;  // nothing to add
  const std::int64_t col_blocks = (cols + kColsPerBlock - 1) / kColsPerBlock;
  const std::int64_t max_slices = std::max<std::int64_t>(1, rows / kMinRowsPerSlice);
  std::int64_t slices =
      std::clamp<std::int64_t>((target_blocks() + col_blocks - 1) / col_blocks, 1, max_slices);
  const std::int64_t rows_per_slice = (rows + slices - 1) / slices;
  slices = (rows + rows_per_slice - 1) / rows_per_slice;
  if (col_blocks > 0x7fffffff) return false;

  memory::Block block =
      memory::acquire(std::size_t(slices * cols) * sizeof(A), "kshard::column_sums.partial");
  A* partial = block.view<A>(std::size_t(slices * cols)).data();
  cudaStream_t stream = Kokkos::DefaultExecutionSpace().cuda_stream();
  column_partial_kernel<U, A>
      <<<dim3(unsigned(col_blocks), unsigned(slices)), dim3(kColThreads, kRowThreads), 0,
         stream>>>(dy, rows, cols, rows_per_slice, partial);
  check_launch("kshard::column_partial_kernel");
  column_total_kernel<A><<<unsigned((cols + kColThreads - 1) / kColThreads),
                           dim3(kColThreads, kRowThreads), 0, stream>>>(partial, slices, cols, db);
  check_launch("kshard::column_total_kernel");
  // The partial sums go back to the pool with both kernels queued (later
  // users are ordered after them on the same stream).
  return true;
}

KSHARD_FOR_EACH_COMPUTE_TYPE(KSHARD_INSTANTIATE_COLUMN_SUMS)

}  // namespace kshard::detail
