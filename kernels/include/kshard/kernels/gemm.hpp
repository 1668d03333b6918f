#pragma once
// Row-major GEMM on memory of the default execution space, backed by the
// vendor BLAS: CBLAS (OpenBLAS) on host builds, cuBLAS on CUDA builds.
//
//   C = alpha * op(A) * op(B) + beta * C,   op(X) = X or X^T
//
// All matrices are row-major; op(A) is [m, k], op(B) is [k, n], C is [m, n].
// A is stored [m, k] (Trans::N) or [k, m] (Trans::T), and lda is the distance
// between consecutive stored rows (>= the stored row length), likewise B and C.
//
//   // y[rows, out] = x[rows, in] * W[out, in]^T
//   kshard::gemm<float>(kshard::Trans::N, kshard::Trans::T, rows, out, in,
//                       1.0f, x, w, 0.0f, y);               // dense Views
//   // per-(batch, head) products: one call, batch matrices at fixed strides
//   kshard::gemm_strided_batched(Trans::N, Trans::T, s, s, hd, scale,
//                                q, 3 * d, hd, k, 3 * d, hd, 0.0f, p, s, s * s, heads);
//
// Types: A and B are T = float, double, bfloat16_t or float16_t; C is T or,
// for the 16-bit types, float (weight gradients accumulate in f32). Products
// of 16-bit operands accumulate in f32 (cuBLAS: tensor cores with
// CUBLAS_COMPUTE_32F; host: converted to f32 for SGEMM). alpha and beta are
// accum_t<T>. float GEMMs are exact f32 unless set_allow_tf32(true) (off by
// default, as torch.backends.cuda.matmul.allow_tf32): then cuBLAS may use
// TF32 tensor cores (10-bit significand inputs, f32 accumulation).
//
// Calls are ordered with Kokkos kernels on the default execution space (on
// CUDA, cuBLAS runs on the Kokkos default stream; on host, pending Kokkos
// work is fenced first), so no extra fence is needed between a kernel that
// writes A/B and the GEMM, or between the GEMM and a kernel that reads C.
// Bad sizes or strides throw kshard::Error before anything runs.
#include <cstdint>

#include <Kokkos_Core.hpp>

#include "kshard/numeric/compute.hpp"

namespace kshard {

enum class Trans { N, T };

/// Pointer form (BLAS-like): pointers into memory of the default memory space.
template <class T, class TC>
void gemm(Trans ta, Trans tb, std::int64_t m, std::int64_t n, std::int64_t k, accum_t<T> alpha,
          const T* a, std::int64_t lda, const T* b, std::int64_t ldb, accum_t<T> beta, TC* c,
          std::int64_t ldc);

/// Dense View form: A, B, C packed (ld = stored row length); checks that each
/// View holds at least the elements the product touches.
template <class T, class TC>
void gemm(Trans ta, Trans tb, std::int64_t m, std::int64_t n, std::int64_t k, accum_t<T> alpha,
          Kokkos::View<const T*> a, Kokkos::View<const T*> b, accum_t<T> beta,
          Kokkos::View<TC*> c);

/// `batch` independent products; matrix i of A starts at a + i * stride_a
/// (likewise B, C). Strides may be smaller than a matrix (interleaved heads),
/// but the C matrices of different batch entries must not overlap. C is T.
template <class T>
void gemm_strided_batched(Trans ta, Trans tb, std::int64_t m, std::int64_t n, std::int64_t k,
                          accum_t<T> alpha, const T* a, std::int64_t lda, std::int64_t stride_a,
                          const T* b, std::int64_t ldb, std::int64_t stride_b, accum_t<T> beta,
                          T* c, std::int64_t ldc, std::int64_t stride_c, std::int64_t batch);

/// Lets float GEMMs use TF32 tensor cores (CUDA only; no effect on the host).
void set_allow_tf32(bool allow) noexcept;
bool allow_tf32() noexcept;

/// The (A/B type, C type) pairs gemm() is instantiated for, to apply a macro to:
/// KSHARD_FOR_EACH_GEMM_TYPES(M) expands to M(float, float) M(double, double) ...
#define KSHARD_FOR_EACH_GEMM_TYPES(M)                                        \
  M(float, float) M(double, double) M(bfloat16_t, bfloat16_t) M(bfloat16_t, float) \
  M(float16_t, float16_t) M(float16_t, float)

namespace detail {
// Backend entry points (host/gemm_cblas.cpp or cuda/gemm_cublas.cpp), called
// with validated, non-empty arguments.
template <class T, class TC>
void gemm_backend(Trans ta, Trans tb, std::int64_t m, std::int64_t n, std::int64_t k,
                  accum_t<T> alpha, const T* a, std::int64_t lda, const T* b, std::int64_t ldb,
                  accum_t<T> beta, TC* c, std::int64_t ldc);
template <class T>
void gemm_strided_batched_backend(Trans ta, Trans tb, std::int64_t m, std::int64_t n,
                                  std::int64_t k, accum_t<T> alpha, const T* a, std::int64_t lda,
                                  std::int64_t stride_a, const T* b, std::int64_t ldb,
                                  std::int64_t stride_b, accum_t<T> beta, T* c, std::int64_t ldc,
                                  std::int64_t stride_c, std::int64_t batch);
}  // namespace detail

// The backends' explicit instantiations (once, in each backend's .cpp, inside
// namespace kshard::detail).
#define KSHARD_GEMM_BACKEND_ONE(T, TC)                                                         \
  template void gemm_backend<T, TC>(Trans, Trans, std::int64_t, std::int64_t, std::int64_t,   \
                                    accum_t<T>, const T*, std::int64_t, const T*,             \
                                    std::int64_t, accum_t<T>, TC*, std::int64_t);
#define KSHARD_GEMM_BATCHED_BACKEND_ONE(T)                                                     \
  template void gemm_strided_batched_backend<T>(                                              \
      Trans, Trans, std::int64_t, std::int64_t, std::int64_t, accum_t<T>, const T*,           \
      std::int64_t, std::int64_t, const T*, std::int64_t, std::int64_t, accum_t<T>, T*,       \
      std::int64_t, std::int64_t, std::int64_t);
#define KSHARD_INSTANTIATE_GEMM_BACKENDS                       \
  KSHARD_FOR_EACH_GEMM_TYPES(KSHARD_GEMM_BACKEND_ONE)          \
  KSHARD_FOR_EACH_COMPUTE_TYPE(KSHARD_GEMM_BATCHED_BACKEND_ONE)

}  // namespace kshard
