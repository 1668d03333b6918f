// CUDA GEMM backend: cuBLAS on the Kokkos default stream.
//
// cuBLAS is column-major. A row-major [r, c] matrix with leading dimension ld
// is the same memory as a column-major [c, r] matrix with the same ld, i.e.
// its transpose. So row-major C = op(A) op(B) is computed as the column-major
// product C^T = op(B)^T op(A)^T: swap the operands (and m with n), keep the
// transpose flags.
#include <cublas_v2.h>

#include <mutex>
#include <string>
#include <type_traits>

#include "kshard/kernels/gemm.hpp"
#include "kshard/error.hpp"
#include "cache_config.hpp"
#include "cublas_workspace.hpp"
#include "sanitizer_marks.hpp"

namespace kshard::detail {
namespace {

const char* status_name(cublasStatus_t s) {
  switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR: return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    default: return "unknown cublasStatus_t";
  }
}

void check(cublasStatus_t s, const char* call) {
  if (s != CUBLAS_STATUS_SUCCESS)
    throw Error(std::string(call) + " returned " + status_name(s) + " (" +
                    std::to_string(static_cast<int>(s)) + ")",
                "CUBLAS_STATUS_SUCCESS");
}

// One handle per process, created on first use (so a program that never
// multiplies pays nothing) and destroyed in Kokkos::finalize, while the CUDA
// context it belongs to still exists; a later Kokkos::initialize starts over.
std::mutex g_handle_mutex;
cublasHandle_t g_handle = nullptr;
bool g_stream_set = false;  // g_stream (which may be the null stream) set on g_handle
cudaStream_t g_stream = nullptr;

cublasHandle_t handle() {
  std::lock_guard<std::mutex> lock(g_handle_mutex);
  if (g_handle == nullptr) {
    restore_default_cache_config();
    // The shared workspace before the handle: finalize hooks run last-in
    // first-out, so the handle is destroyed before its workspace is freed.
    (void)cublas_workspace();
    cublasHandle_t h = nullptr;
    check(cublasCreate(&h), "cublasCreate");
    g_handle = h;
    g_stream_set = false;
    Kokkos::push_finalize_hook([] {
      std::lock_guard<std::mutex> l(g_handle_mutex);
      if (g_handle != nullptr) cublasDestroy(g_handle);
      g_handle = nullptr;
    });
  }
  // Follows the default instance's stream even if the application changed it
  // since the handle was made. cublasSetStream resets the workspace to
  // cuBLAS' own pool, so ours is set again after it.
  const cudaStream_t stream = Kokkos::DefaultExecutionSpace().cuda_stream();
  if (!g_stream_set || stream != g_stream) {
    check(cublasSetStream(g_handle, stream), "cublasSetStream");
    check(cublasSetWorkspace(g_handle, cublas_workspace(), kCublasWorkspaceBytes),
          "cublasSetWorkspace");
    g_stream = stream;
    g_stream_set = true;
  }
  return g_handle;
}

cublasOperation_t op(Trans t) { return t == Trans::N ? CUBLAS_OP_N : CUBLAS_OP_T; }

template <class T>
cudaDataType_t cuda_type() {
  if constexpr (std::is_same_v<T, float>) return CUDA_R_32F;
  if constexpr (std::is_same_v<T, double>) return CUDA_R_64F;
  if constexpr (std::is_same_v<T, bfloat16_t>) return CUDA_R_16BF;
  if constexpr (std::is_same_v<T, float16_t>) return CUDA_R_16F;
}

// 16-bit operands: f32 accumulation on tensor cores. float: exact f32 (the
// SIMT path) unless TF32 is allowed. double: f64.
template <class T>
cublasComputeType_t compute_type() {
  if constexpr (std::is_same_v<T, double>) return CUBLAS_COMPUTE_64F;
  if constexpr (std::is_same_v<T, float>)
    return allow_tf32() ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  return CUBLAS_COMPUTE_32F;
}

}  // namespace

// Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: operands
// swapped, m and n swapped, flags kept (see the top of this file).
template <class T, class TC>
void gemm_backend(Trans ta, Trans tb, std::int64_t m, std::int64_t n, std::int64_t k,
                  accum_t<T> alpha, const T* a, std::int64_t lda, const T* b, std::int64_t ldb,
                  accum_t<T> beta, TC* c, std::int64_t ldc) {
  // alpha/beta are host scalars of the compute type (f32 or f64).
  check(cublasGemmEx(handle(), op(tb), op(ta), static_cast<int>(n), static_cast<int>(m),
                     static_cast<int>(k), &alpha, b, cuda_type<T>(), static_cast<int>(ldb), a,
                     cuda_type<T>(), static_cast<int>(lda), &beta, c, cuda_type<TC>(),
                     static_cast<int>(ldc), compute_type<T>(), CUBLAS_GEMM_DEFAULT),
        "cublasGemmEx");
  // C row-major [m, n], rows ldc apart (see sanitizer_marks.hpp for why).
  mark_written_rows(Kokkos::DefaultExecutionSpace().cuda_stream(), c, m, std::size_t(n) * sizeof(TC),
                    std::size_t(ldc) * sizeof(TC));
}

template <class T>
void gemm_strided_batched_backend(Trans ta, Trans tb, std::int64_t m, std::int64_t n,
                                  std::int64_t k, accum_t<T> alpha, const T* a, std::int64_t lda,
                                  std::int64_t stride_a, const T* b, std::int64_t ldb,
                                  std::int64_t stride_b, accum_t<T> beta, T* c, std::int64_t ldc,
                                  std::int64_t stride_c, std::int64_t batch) {
  check(cublasGemmStridedBatchedEx(
            handle(), op(tb), op(ta), static_cast<int>(n), static_cast<int>(m),
            static_cast<int>(k), &alpha, b, cuda_type<T>(), static_cast<int>(ldb),
            static_cast<long long>(stride_b), a, cuda_type<T>(), static_cast<int>(lda),
            static_cast<long long>(stride_a), &beta, c, cuda_type<T>(), static_cast<int>(ldc),
            static_cast<long long>(stride_c), static_cast<int>(batch), compute_type<T>(),
            CUBLAS_GEMM_DEFAULT),
        "cublasGemmStridedBatchedEx");
  const cudaStream_t stream = Kokkos::DefaultExecutionSpace().cuda_stream();
  for (std::int64_t i = 0; i < batch; ++i)
    mark_written_rows(stream, c + i * stride_c, m, std::size_t(n) * sizeof(T),
                      std::size_t(ldc) * sizeof(T));
}

KSHARD_INSTANTIATE_GEMM_BACKENDS

}  // namespace kshard::detail
