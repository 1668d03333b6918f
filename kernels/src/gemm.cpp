#include "kshard/kernels/gemm.hpp"

#include <algorithm>
#include <climits>
#include <string>

#include "kshard/error.hpp"

namespace kshard {
namespace {

std::string dims(std::int64_t m, std::int64_t n, std::int64_t k) {
  return "m=" + std::to_string(m) + ", n=" + std::to_string(n) + ", k=" + std::to_string(k);
}

// Stored row length of op(X): X is [rows, cols] when not transposed.
std::int64_t stored_cols(Trans t, std::int64_t rows, std::int64_t cols) {
  return t == Trans::N ? cols : rows;
}

void check_shape(const char* fn, Trans ta, Trans tb, std::int64_t m, std::int64_t n,
                 std::int64_t k, std::int64_t lda, std::int64_t ldb, std::int64_t ldc) {
  const std::string where = std::string(fn) + "(" + dims(m, n, k) + ")";
  if (m < 0 || n < 0 || k < 0) throw Error(where + ": negative dimension", "m, n, k >= 0");
  const std::int64_t need_a = std::max<std::int64_t>(1, stored_cols(ta, m, k));
  const std::int64_t need_b = std::max<std::int64_t>(1, stored_cols(tb, k, n));
  const std::int64_t need_c = std::max<std::int64_t>(1, n);
  if (lda < need_a)
    throw Error(where + ": lda=" + std::to_string(lda), "lda >= " + std::to_string(need_a));
  if (ldb < need_b)
    throw Error(where + ": ldb=" + std::to_string(ldb), "ldb >= " + std::to_string(need_b));
  if (ldc < need_c)
    throw Error(where + ": ldc=" + std::to_string(ldc), "ldc >= " + std::to_string(need_c));
  // Both vendor libraries take 32-bit dimensions and leading dimensions.
  for (std::int64_t v : {m, n, k, lda, ldb, ldc})
    if (v > INT_MAX)
      throw Error(where + ": a dimension or leading dimension exceeds INT_MAX",
                  "dimensions that fit a 32-bit BLAS int");
}

// Elements spanned by a row-major matrix of `rows` rows with leading dimension ld.
std::int64_t span(std::int64_t rows, std::int64_t cols, std::int64_t ld) {
  return rows == 0 || cols == 0 ? 0 : (rows - 1) * ld + cols;
}

}  // namespace

template <class T, class TC>
void gemm(Trans ta, Trans tb, std::int64_t m, std::int64_t n, std::int64_t k, accum_t<T> alpha,
          const T* a, std::int64_t lda, const T* b, std::int64_t ldb, accum_t<T> beta, TC* c,
          std::int64_t ldc) {
  check_shape("gemm", ta, tb, m, n, k, lda, ldb, ldc);
  if (m == 0 || n == 0) return;
  if (c == nullptr || (k > 0 && (a == nullptr || b == nullptr)))
    throw Error("gemm(" + dims(m, n, k) + "): null matrix pointer", "device pointers to data");
  detail::gemm_backend<T, TC>(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

template <class T, class TC>
void gemm(Trans ta, Trans tb, std::int64_t m, std::int64_t n, std::int64_t k, accum_t<T> alpha,
          Kokkos::View<const T*> a, Kokkos::View<const T*> b, accum_t<T> beta,
          Kokkos::View<TC*> c) {
  const std::int64_t lda = std::max<std::int64_t>(1, stored_cols(ta, m, k));
  const std::int64_t ldb = std::max<std::int64_t>(1, stored_cols(tb, k, n));
  const std::int64_t ldc = std::max<std::int64_t>(1, n);
  const std::string where = "gemm(" + dims(m, n, k) + ")";
  auto need = [&](const char* name, std::size_t have, std::int64_t want) {
    if (static_cast<std::int64_t>(have) < want)
      throw Error(where + ": View " + name + " has " + std::to_string(have) + " elements",
                  "at least " + std::to_string(want));
  };
  if (m < 0 || n < 0 || k < 0) throw Error(where + ": negative dimension", "m, n, k >= 0");
  need("A", a.extent(0), m * k);
  need("B", b.extent(0), k * n);
  need("C", c.extent(0), m * n);
  gemm<T, TC>(ta, tb, m, n, k, alpha, a.data(), lda, b.data(), ldb, beta, c.data(), ldc);
}

template <class T>
void gemm_strided_batched(Trans ta, Trans tb, std::int64_t m, std::int64_t n, std::int64_t k,
                          accum_t<T> alpha, const T* a, std::int64_t lda, std::int64_t stride_a,
                          const T* b, std::int64_t ldb, std::int64_t stride_b, accum_t<T> beta,
                          T* c, std::int64_t ldc, std::int64_t stride_c, std::int64_t batch) {
  check_shape("gemm_strided_batched", ta, tb, m, n, k, lda, ldb, ldc);
  const std::string where = "gemm_strided_batched(" + dims(m, n, k) + ")";
  if (batch < 0) throw Error(where + ": batch=" + std::to_string(batch), "batch >= 0");
  if (batch > INT_MAX) throw Error(where + ": batch exceeds INT_MAX", "batch that fits an int");
  if (stride_a < 0 || stride_b < 0 || stride_c < 0)
    throw Error(where + ": negative batch stride", "strides >= 0");
  // Output matrices of different batch entries must be disjoint, or the
  // result would depend on the order the library runs them in. Entries that
  // interleave (e.g. heads side by side in one row) are disjoint when the
  // stride is at least the row width and the rows of all entries fit within ld.
  if (batch > 1 && m > 0 && n > 0) {
    const bool row_disjoint = stride_c >= span(m, n, ldc);
    const bool interleaved = stride_c >= n && (batch - 1) * stride_c + n <= ldc;
    if (!row_disjoint && !interleaved)
      throw Error(where + ": output matrices overlap (stride_c=" + std::to_string(stride_c) +
                      ", ldc=" + std::to_string(ldc) + ")",
                  "disjoint C matrices per batch entry");
  }
  if (m == 0 || n == 0 || batch == 0) return;
  if (c == nullptr || (k > 0 && (a == nullptr || b == nullptr)))
    throw Error(where + ": null matrix pointer", "device pointers to data");
  detail::gemm_strided_batched_backend<T>(ta, tb, m, n, k, alpha, a, lda, stride_a, b, ldb,
                                          stride_b, beta, c, ldc, stride_c, batch);
}

namespace {
bool g_allow_tf32 = false;
}
void set_allow_tf32(bool allow) noexcept { g_allow_tf32 = allow; }
bool allow_tf32() noexcept { return g_allow_tf32; }

#define KSHARD_GEMM_INSTANTIATE(T, TC)                                                         \
  template void gemm<T, TC>(Trans, Trans, std::int64_t, std::int64_t, std::int64_t, accum_t<T>, \
                            const T*, std::int64_t, const T*, std::int64_t, accum_t<T>, TC*,   \
                            std::int64_t);                                                     \
  template void gemm<T, TC>(Trans, Trans, std::int64_t, std::int64_t, std::int64_t, accum_t<T>, \
                            Kokkos::View<const T*>, Kokkos::View<const T*>, accum_t<T>,        \
                            Kokkos::View<TC*>);
#define KSHARD_GEMM_BATCHED_INSTANTIATE(T)                                                     \
  template void gemm_strided_batched<T>(Trans, Trans, std::int64_t, std::int64_t,             \
                                        std::int64_t, accum_t<T>, const T*, std::int64_t,     \
                                        std::int64_t, const T*, std::int64_t, std::int64_t,   \
                                        accum_t<T>, T*, std::int64_t, std::int64_t,           \
                                        std::int64_t);
KSHARD_FOR_EACH_GEMM_TYPES(KSHARD_GEMM_INSTANTIATE)
KSHARD_FOR_EACH_COMPUTE_TYPE(KSHARD_GEMM_BATCHED_INSTANTIATE)
#undef KSHARD_GEMM_INSTANTIATE
#undef KSHARD_GEMM_BATCHED_INSTANTIATE

}  // namespace kshard
