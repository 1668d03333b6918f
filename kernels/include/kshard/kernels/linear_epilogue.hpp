#pragma once
// A Linear layer's forward GEMM with its bias (and GELU) applied in the GEMM's
// epilogue where the backend has one, instead of a second pass over the
// output. For the engine: Linear and LayerNormMLP use it (kshard::detail).
//
//   y[rows, out] = x[rows, in] W[out, in]^T + b            (LinearEpilogue::bias)
//   pre = x W^T + b,  y = gelu_tanh(pre)                    (LinearEpilogue::bias_gelu)
//
// CUDA, 16-bit T and f32: one cuBLASLt matmul (CUBLASLT_EPILOGUE_BIAS /
// GELU_AUX_BIAS, the same tanh GELU as kshard's kernel; f32 accumulation, f32
// exact unless TF32 is allowed). Elsewhere (f64, host) the backend declines
// and the caller runs the GEMM and its elementwise kernel.
#include <cstdint>

namespace kshard::detail {

enum class LinearEpilogue { bias, bias_gelu };

/// Returns false when this backend has no epilogue for T (nothing was done);
/// throws kshard::Error when the backend failed. pre is written only for
/// bias_gelu. Pointers into default-memory-space memory; row-major, packed.
template <class T>
bool linear_epilogue_backend(std::int64_t rows, std::int64_t in, std::int64_t out, const T* x,
                             const T* w, const T* b, T* y, LinearEpilogue e, T* pre);

}  // namespace kshard::detail
