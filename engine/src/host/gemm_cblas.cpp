// Host GEMM backend: OpenBLAS' CBLAS, row-major natively.
#include <cblas.h>

#include "kshard/engine/gemm.hpp"

namespace kshard::detail {
namespace {

CBLAS_TRANSPOSE op(Trans t) { return t == Trans::N ? CblasNoTrans : CblasTrans; }

// Host kernels may still be running on a threaded backend; BLAS must see their results.
void fence_pending_kernels() { Kokkos::DefaultExecutionSpace().fence(); }

void call(Trans ta, Trans tb, std::int64_t m, std::int64_t n, std::int64_t k, float alpha,
          const float* a, std::int64_t lda, const float* b, std::int64_t ldb, float beta,
          float* c, std::int64_t ldc) {
  cblas_sgemm(CblasRowMajor, op(ta), op(tb), static_cast<int>(m), static_cast<int>(n),
              static_cast<int>(k), alpha, a, static_cast<int>(lda), b, static_cast<int>(ldb),
              beta, c, static_cast<int>(ldc));
}
void call(Trans ta, Trans tb, std::int64_t m, std::int64_t n, std::int64_t k, double alpha,
          const double* a, std::int64_t lda, const double* b, std::int64_t ldb, double beta,
          double* c, std::int64_t ldc) {
  cblas_dgemm(CblasRowMajor, op(ta), op(tb), static_cast<int>(m), static_cast<int>(n),
              static_cast<int>(k), alpha, a, static_cast<int>(lda), b, static_cast<int>(ldb),
              beta, c, static_cast<int>(ldc));
}

}  // namespace

template <class T>
void gemm_backend(Trans ta, Trans tb, std::int64_t m, std::int64_t n, std::int64_t k, T alpha,
                  const T* a, std::int64_t lda, const T* b, std::int64_t ldb, T beta, T* c,
                  std::int64_t ldc) {
  fence_pending_kernels();
  call(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

template <class T>
void gemm_strided_batched_backend(Trans ta, Trans tb, std::int64_t m, std::int64_t n,
                                  std::int64_t k, T alpha, const T* a, std::int64_t lda,
                                  std::int64_t stride_a, const T* b, std::int64_t ldb,
                                  std::int64_t stride_b, T beta, T* c, std::int64_t ldc,
                                  std::int64_t stride_c, std::int64_t batch) {
  fence_pending_kernels();
  // OpenBLAS threads inside each product; a loop over the batch is enough here.
  for (std::int64_t i = 0; i < batch; ++i)
    call(ta, tb, m, n, k, alpha, a + i * stride_a, lda, b + i * stride_b, ldb, beta,
         c + i * stride_c, ldc);
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
