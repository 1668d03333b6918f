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

#include "kshard/engine/gemm.hpp"
#include "kshard/error.hpp"

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

cublasHandle_t handle() {
  std::lock_guard<std::mutex> lock(g_handle_mutex);
  if (g_handle == nullptr) {
    cublasHandle_t h = nullptr;
    check(cublasCreate(&h), "cublasCreate");
    g_handle = h;
    Kokkos::push_finalize_hook([] {
      std::lock_guard<std::mutex> l(g_handle_mutex);
      if (g_handle != nullptr) cublasDestroy(g_handle);
      g_handle = nullptr;
    });
  }
  // Set on every call: cheap, and follows the default instance's stream even
  // if the application changed it since the handle was made.
  check(cublasSetStream(g_handle, Kokkos::DefaultExecutionSpace().cuda_stream()),
        "cublasSetStream");
  return g_handle;
}

cublasOperation_t op(Trans t) { return t == Trans::N ? CUBLAS_OP_N : CUBLAS_OP_T; }

cublasStatus_t call(cublasHandle_t h, Trans ta, Trans tb, int m, int n, int k,
                    const float* alpha, const float* a, int lda, const float* b, int ldb,
                    const float* beta, float* c, int ldc) {
  return cublasSgemm(h, op(tb), op(ta), n, m, k, alpha, b, ldb, a, lda, beta, c, ldc);
}
cublasStatus_t call(cublasHandle_t h, Trans ta, Trans tb, int m, int n, int k,
                    const double* alpha, const double* a, int lda, const double* b, int ldb,
                    const double* beta, double* c, int ldc) {
  return cublasDgemm(h, op(tb), op(ta), n, m, k, alpha, b, ldb, a, lda, beta, c, ldc);
}
cublasStatus_t call_batched(cublasHandle_t h, Trans ta, Trans tb, int m, int n, int k,
                            const float* alpha, const float* a, int lda, long long sa,
                            const float* b, int ldb, long long sb, const float* beta, float* c,
                            int ldc, long long sc, int batch) {
  return cublasSgemmStridedBatched(h, op(tb), op(ta), n, m, k, alpha, b, ldb, sb, a, lda, sa,
                                   beta, c, ldc, sc, batch);
}
cublasStatus_t call_batched(cublasHandle_t h, Trans ta, Trans tb, int m, int n, int k,
                            const double* alpha, const double* a, int lda, long long sa,
                            const double* b, int ldb, long long sb, const double* beta,
                            double* c, int ldc, long long sc, int batch) {
  return cublasDgemmStridedBatched(h, op(tb), op(ta), n, m, k, alpha, b, ldb, sb, a, lda, sa,
                                   beta, c, ldc, sc, batch);
}

}  // namespace

template <class T>
void gemm_backend(Trans ta, Trans tb, std::int64_t m, std::int64_t n, std::int64_t k, T alpha,
                  const T* a, std::int64_t lda, const T* b, std::int64_t ldb, T beta, T* c,
                  std::int64_t ldc) {
  // alpha/beta are host scalars (the handle's default pointer mode).
  check(call(handle(), ta, tb, static_cast<int>(m), static_cast<int>(n), static_cast<int>(k),
             &alpha, a, static_cast<int>(lda), b, static_cast<int>(ldb), &beta, c,
             static_cast<int>(ldc)),
        "cublas<t>gemm");
}

template <class T>
void gemm_strided_batched_backend(Trans ta, Trans tb, std::int64_t m, std::int64_t n,
                                  std::int64_t k, T alpha, const T* a, std::int64_t lda,
                                  std::int64_t stride_a, const T* b, std::int64_t ldb,
                                  std::int64_t stride_b, T beta, T* c, std::int64_t ldc,
                                  std::int64_t stride_c, std::int64_t batch) {
  check(call_batched(handle(), ta, tb, static_cast<int>(m), static_cast<int>(n),
                     static_cast<int>(k), &alpha, a, static_cast<int>(lda),
                     static_cast<long long>(stride_a), b, static_cast<int>(ldb),
                     static_cast<long long>(stride_b), &beta, c, static_cast<int>(ldc),
                     static_cast<long long>(stride_c), static_cast<int>(batch)),
        "cublas<t>gemmStridedBatched");
}

template void gemm_backend<float>(Trans, Trans, std::int64_t, std::int64_t, std::int64_t, float,
                                  const float*, std::int64_t, const float*, std::int64_t, float,
                                  float*, std::int64_t);
template void gemm_backend<double>(Trans, Trans, std::int64_t, std::int64_t, std::int64_t,
                                   double, const double*, std::int64_t, const double*,
                                   std::int64_t, double, double*, std::int64_t);
template void gemm_strided_batched_backend<float>(Trans, Trans, std::int64_t, std::int64_t,
                                                  std::int64_t, float, const float*,
                                                  std::int64_t, std::int64_t, const float*,
                                                  std::int64_t, std::int64_t, float, float*,
                                                  std::int64_t, std::int64_t, std::int64_t);
template void gemm_strided_batched_backend<double>(Trans, Trans, std::int64_t, std::int64_t,
                                                   std::int64_t, double, const double*,
                                                   std::int64_t, std::int64_t, const double*,
                                                   std::int64_t, std::int64_t, double, double*,
                                                   std::int64_t, std::int64_t, std::int64_t);

}  // namespace kshard::detail
