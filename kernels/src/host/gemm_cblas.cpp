// Host GEMM backend: OpenBLAS' CBLAS, row-major natively.
//
// 16-bit operands (bf16, f16) are widened to f32 and multiplied by SGEMM, so
// the host computes exactly what a tensor core with f32 accumulation would
// (each product of two 16-bit values is exact in f32) up to summation order.
// The host's 16-bit path exists so the low-precision recipes run and are
// tested where CI runs; its speed is not a goal (fp32 is the host default).
#include <cblas.h>

#include <vector>

#include "kshard/kernels/gemm.hpp"

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

// Elements spanned by `rows` stored rows of `cols` values with leading dimension ld.
std::size_t span(std::int64_t rows, std::int64_t cols, std::int64_t ld) {
  return rows == 0 || cols == 0 ? 0 : std::size_t((rows - 1) * ld + cols);
}
std::int64_t stored_rows(Trans t, std::int64_t r, std::int64_t c) { return t == Trans::N ? r : c; }
std::int64_t stored_cols(Trans t, std::int64_t r, std::int64_t c) { return t == Trans::N ? c : r; }

template <class T>
void widen(const T* src, std::size_t n, std::vector<float>& dst) {
  dst.resize(n);
  for (std::size_t i = 0; i < n; ++i) dst[i] = to_accum(src[i]);
}

// One 16-bit product on f32 copies. C of type TC (16-bit or float).
template <class T, class TC>
void call_widened(Trans ta, Trans tb, std::int64_t m, std::int64_t n, std::int64_t k,
                  float alpha, const T* a, std::int64_t lda, const T* b, std::int64_t ldb,
                  float beta, TC* c, std::int64_t ldc) {
  thread_local std::vector<float> wa, wb, wc;
  widen(a, span(stored_rows(ta, m, k), stored_cols(ta, m, k), lda), wa);
  widen(b, span(stored_rows(tb, k, n), stored_cols(tb, k, n), ldb), wb);
  if constexpr (std::is_same_v<TC, float>) {
    call(ta, tb, m, n, k, alpha, wa.data(), lda, wb.data(), ldb, beta, c, ldc);
  } else {
    const std::size_t nc = span(m, n, ldc);
    if (beta != 0.0f)
      widen(c, nc, wc);
    else
      wc.assign(nc, 0.0f);
    call(ta, tb, m, n, k, alpha, wa.data(), lda, wb.data(), ldb, beta, wc.data(), ldc);
    for (std::int64_t i = 0; i < m; ++i)
      for (std::int64_t j = 0; j < n; ++j) c[i * ldc + j] = from_accum<TC>(wc[i * ldc + j]);
  }
}

template <class T, class TC>
void dispatch(Trans ta, Trans tb, std::int64_t m, std::int64_t n, std::int64_t k,
              accum_t<T> alpha, const T* a, std::int64_t lda, const T* b, std::int64_t ldb,
              accum_t<T> beta, TC* c, std::int64_t ldc) {
  if constexpr (is_low_precision_v<T>)
    call_widened<T, TC>(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  else
    call(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

}  // namespace

template <class T, class TC>
void gemm_backend(Trans ta, Trans tb, std::int64_t m, std::int64_t n, std::int64_t k,
                  accum_t<T> alpha, const T* a, std::int64_t lda, const T* b, std::int64_t ldb,
                  accum_t<T> beta, TC* c, std::int64_t ldc) {
  fence_pending_kernels();
  dispatch<T, TC>(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

template <class T>
void gemm_strided_batched_backend(Trans ta, Trans tb, std::int64_t m, std::int64_t n,
                                  std::int64_t k, accum_t<T> alpha, const T* a, std::int64_t lda,
                                  std::int64_t stride_a, const T* b, std::int64_t ldb,
                                  std::int64_t stride_b, accum_t<T> beta, T* c, std::int64_t ldc,
                                  std::int64_t stride_c, std::int64_t batch) {
  fence_pending_kernels();
  // OpenBLAS threads inside each product; a loop over the batch is enough here.
  for (std::int64_t i = 0; i < batch; ++i)
    dispatch<T, T>(ta, tb, m, n, k, alpha, a + i * stride_a, lda, b + i * stride_b, ldb, beta,
                   c + i * stride_c, ldc);
}

KSHARD_INSTANTIATE_GEMM_BACKENDS

}  // namespace kshard::detail
