#pragma once
// Tells compute-sanitizer which bytes a library kernel wrote.
//
// On Hopper, cuBLAS/cuBLASLt GEMMs and cuDNN's fused attention store their
// outputs with the tensor memory accelerator (bulk asynchronous copies from
// shared memory), which initcheck does not count as writes: a kshard kernel
// that later reads such an output (the residual add reading a projection's
// result) is reported as reading uninitialized memory although every byte was
// written. Measured on the H200 (CUDA 13.0, compute-sanitizer 2025.3.1,
// ci/sanitizer-probe.cu): a cuBLASLt bf16 GEMM (256x128x128, status success)
// into a fresh cudaMalloc buffer, then a plain kernel reading its 32,768
// outputs: 32,768 initcheck errors; with the output marked: 0. kshard-train
// --recipe bf16 (the small model of ci/gpu-run sanitize): 405,504 -> 0.
//
// After each library call, its output ranges are declared initialized on the
// call's stream through NVTX's memory extension (nvtxMemCudaMarkInitialized),
// the channel compute-sanitizer reads for this. Only what the call writes is
// marked, so a kernel reading bytes that no library call and no kshard kernel
// wrote is still found. Without a tool attached an NVTX call returns at once.
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace kshard::detail {

/// [p, p + bytes) was written by work queued on `stream`.
void mark_written(cudaStream_t stream, const void* p, std::size_t bytes);

/// `rows` rows of `row_bytes` each, `pitch_bytes` apart, starting at p (a
/// matrix with a leading dimension larger than its rows: the gaps stay
/// unmarked), written on `stream`.
void mark_written_rows(cudaStream_t stream, const void* p, std::int64_t rows,
                       std::size_t row_bytes, std::size_t pitch_bytes);

}  // namespace kshard::detail
