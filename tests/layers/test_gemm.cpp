// GEMM (plain and strided-batched) against a naive triple loop in double.
// Tolerances: double 1e-13 and float 1e-5, relative to max |C|: each entry
// is a dot product of k <= 13 terms of magnitude <= 1, so the rounding error
// is below k * u * max|C| (u = 1.1e-16 / 6e-8) with a wide margin.
#include <boost/test/unit_test.hpp>

#include <limits>

#include "kshard/kernels/gemm.hpp"
#include "kshard/error.hpp"
#include "layer_test_util.hpp"

using namespace kshard;
using namespace kshard::test;

namespace {

// Row-major reference: C = alpha op(A) op(B) + beta C with leading dimensions.
void naive(Trans ta, Trans tb, std::int64_t m, std::int64_t n, std::int64_t k, double alpha,
           const HostVec& a, std::int64_t lda, const HostVec& b, std::int64_t ldb, double beta,
           HostVec& c, std::int64_t ldc, std::int64_t oa = 0, std::int64_t ob = 0,
           std::int64_t oc = 0) {
  for (std::int64_t i = 0; i < m; ++i)
    for (std::int64_t j = 0; j < n; ++j) {
      double s = 0;
      for (std::int64_t l = 0; l < k; ++l) {
        const double av = ta == Trans::N ? a[oa + i * lda + l] : a[oa + l * lda + i];
        const double bv = tb == Trans::N ? b[ob + l * ldb + j] : b[ob + j * ldb + l];
        s += av * bv;
      }
      c[oc + i * ldc + j] = alpha * s + beta * c[oc + i * ldc + j];
    }
}

template <class T>
double tol();
template <>
double tol<double>() { return 1e-13; }
template <>
double tol<float>() { return 1e-5; }

template <class T>
void check_all_transposes() {
  const std::int64_t m = 5, n = 7, k = 13, pad = 3;
  std::mt19937_64 rng(1);
  for (Trans ta : {Trans::N, Trans::T})
    for (Trans tb : {Trans::N, Trans::T}) {
      // Padded leading dimensions catch any confusion of ld with a dimension.
      const std::int64_t ar = ta == Trans::N ? m : k, ac = ta == Trans::N ? k : m;
      const std::int64_t br = tb == Trans::N ? k : n, bc = tb == Trans::N ? n : k;
      const std::int64_t lda = ac + pad, ldb = bc + pad, ldc = n + pad;
      HostVec a = random_vec(ar * lda, rng), b = random_vec(br * ldb, rng);
      HostVec c = random_vec(m * ldc, rng);
      // Round inputs to T so that the reference sees the same numbers.
      for (auto* v : {&a, &b, &c})
        for (auto& x : *v) x = static_cast<double>(static_cast<T>(x));
      auto ad = to_device<T>(a), bd = to_device<T>(b), cd = to_device<T>(c);
      gemm<T>(ta, tb, m, n, k, T(0.75), ad.data(), lda, bd.data(), ldb, T(-0.5), cd.data(), ldc);
      HostVec want = c;
      naive(ta, tb, m, n, k, 0.75, a, lda, b, ldb, -0.5, want, ldc);
      BOOST_TEST_INFO("ta=" << (ta == Trans::N ? 'N' : 'T') << " tb=" << (tb == Trans::N ? 'N' : 'T'));
      BOOST_TEST(rel_err(to_host(cd), want) <= tol<T>());

      // Dense View form (ld = stored row length), beta = 0 ignores C's contents.
      HostVec ap(ar * ac), bp(br * bc);
      for (std::int64_t i = 0; i < ar; ++i)
        for (std::int64_t j = 0; j < ac; ++j) ap[i * ac + j] = a[i * lda + j];
      for (std::int64_t i = 0; i < br; ++i)
        for (std::int64_t j = 0; j < bc; ++j) bp[i * bc + j] = b[i * ldb + j];
      Kokkos::View<T*> cv("c", m * n);
      // beta = 0 must not read C (layers write into uninitialised workspaces).
      Kokkos::deep_copy(cv, std::numeric_limits<T>::quiet_NaN());
      gemm<T>(ta, tb, m, n, k, T(1), to_device<T>(ap), to_device<T>(bp), T(0), cv);
      HostVec want2(m * n, 0.0);
      naive(ta, tb, m, n, k, 1.0, ap, ac, bp, bc, 0.0, want2, n);
      BOOST_TEST(rel_err(to_host(cv), want2) <= tol<T>());
    }
}

template <class T>
void check_strided_batched() {
  std::mt19937_64 rng(2);
  const std::int64_t m = 4, n = 3, k = 6, batch = 3;
  for (Trans ta : {Trans::N, Trans::T})
    for (Trans tb : {Trans::N, Trans::T}) {
      // Separate matrices (stride >= matrix span) ...
      const std::int64_t lda = ta == Trans::N ? k : m, ldb = tb == Trans::N ? n : k;
      const std::int64_t sa = m * k + 2, sb = k * n + 1, sc = m * n + 5;
      HostVec a = random_vec(batch * sa, rng), b = random_vec(batch * sb, rng);
      HostVec c = random_vec(batch * sc, rng);
      for (auto* v : {&a, &b, &c})
        for (auto& x : *v) x = static_cast<double>(static_cast<T>(x));
      auto ad = to_device<T>(a), bd = to_device<T>(b), cd = to_device<T>(c);
      gemm_strided_batched<T>(ta, tb, m, n, k, T(1.5), ad.data(), lda, sa, bd.data(), ldb, sb,
                              T(0.25), cd.data(), n, sc, batch);
      HostVec want = c;
      for (std::int64_t i = 0; i < batch; ++i)
        naive(ta, tb, m, n, k, 1.5, a, lda, b, ldb, 0.25, want, n, i * sa, i * sb, i * sc);
      BOOST_TEST(rel_err(to_host(cd), want) <= tol<T>());
    }
  // ... and interleaved "heads": matrix h is columns [h*w, (h+1)*w) of shared rows,
  // as attention reads q/k/v out of one [seq, 3d] activation.
  const std::int64_t seq = 5, w = 2, heads = 3, ld = 3 * heads * w;
  HostVec qkv = random_vec(seq * ld, rng);
  for (auto& x : qkv) x = static_cast<double>(static_cast<T>(x));
  auto qd = to_device<T>(qkv);
  Kokkos::View<T*> sd("scores", heads * seq * seq);
  gemm_strided_batched<T>(Trans::N, Trans::T, seq, seq, w, T(1), qd.data(), ld, w,
                          qd.data() + heads * w, ld, w, T(0), sd.data(), seq, seq * seq, heads);
  HostVec want(heads * seq * seq, 0.0);
  for (std::int64_t h = 0; h < heads; ++h)
    naive(Trans::N, Trans::T, seq, seq, w, 1.0, qkv, ld, qkv, ld, 0.0, want, seq, h * w,
          heads * w + h * w, h * seq * seq);
  BOOST_TEST(rel_err(to_host(sd), want) <= tol<T>());
  // Interleaved output: C matrices side by side in the rows of one [seq, heads*w].
  Kokkos::View<T*> od("out", seq * heads * w);
  gemm_strided_batched<T>(Trans::N, Trans::N, seq, w, seq, T(1), sd.data(), seq, seq * seq,
                          qd.data() + 2 * heads * w, ld, w, T(0), od.data(), heads * w, w, heads);
  HostVec want_o(seq * heads * w, 0.0);
  for (std::int64_t h = 0; h < heads; ++h)
    naive(Trans::N, Trans::N, seq, w, seq, 1.0, want, seq, qkv, ld, 0.0, want_o, heads * w,
          h * seq * seq, 2 * heads * w + h * w, h * w);
  BOOST_TEST(rel_err(to_host(od), want_o) <= tol<T>());
}

}  // namespace

BOOST_AUTO_TEST_SUITE(gemm_tests)

BOOST_AUTO_TEST_CASE(all_transposes_double) { check_all_transposes<double>(); }
BOOST_AUTO_TEST_CASE(all_transposes_float) { check_all_transposes<float>(); }
BOOST_AUTO_TEST_CASE(strided_batched_double) { check_strided_batched<double>(); }
BOOST_AUTO_TEST_CASE(strided_batched_float) { check_strided_batched<float>(); }

// 16-bit operands (bf16 / f16) with f32 accumulation, C in f32 (the weight
// gradient path) or in the 16-bit type (activations). Reference: the naive
// product in double of the same rounded operands. f32 C: each of the k = 13
// products is exact in f32 and the sum rounds k times: 1e-5 relative to max|C|
// as for float. 16-bit C: one final rounding, at most the unit roundoff
// relative to |C| (bf16 2^-8, f16 2^-11), bounded relative to max|C| by that
// plus the f32 sum.
template <class T, class TC>
void check_low_precision(double tol_c) {
  const std::int64_t m = 5, n = 7, k = 13, pad = 3;
  std::mt19937_64 rng(5);
  for (Trans ta : {Trans::N, Trans::T})
    for (Trans tb : {Trans::N, Trans::T}) {
      const std::int64_t ar = ta == Trans::N ? m : k, ac = ta == Trans::N ? k : m;
      const std::int64_t br = tb == Trans::N ? k : n, bc = tb == Trans::N ? n : k;
      const std::int64_t lda = ac + pad, ldb = bc + pad, ldc = n + pad;
      HostVec a = random_vec(ar * lda, rng), b = random_vec(br * ldb, rng);
      HostVec c = random_vec(m * ldc, rng);
      a = rounded<T>(a);
      b = rounded<T>(b);
      c = rounded<TC>(c);
      auto ad = to_device<T>(a), bd = to_device<T>(b);
      auto cd = to_device<TC>(c);
      gemm<T>(ta, tb, m, n, k, 0.75f, ad.data(), lda, bd.data(), ldb, -0.5f, cd.data(), ldc);
      HostVec want = c;
      naive(ta, tb, m, n, k, 0.75, a, lda, b, ldb, -0.5, want, ldc);
      const HostVec got = to_host(cd);
      BOOST_TEST_INFO("ta=" << int(ta) << " tb=" << int(tb));
      BOOST_TEST(rel_err(got, want) <= tol_c);
    }
}

BOOST_AUTO_TEST_CASE(bf16_operands_f32_accumulation) {
  check_low_precision<bfloat16_t, float>(1e-5);
  check_low_precision<bfloat16_t, bfloat16_t>(std::ldexp(1.0, -8) + 1e-5);
  check_low_precision<float16_t, float>(1e-5);
  check_low_precision<float16_t, float16_t>(std::ldexp(1.0, -11) + 1e-5);
}

BOOST_AUTO_TEST_CASE(k_zero_scales_c_and_empty_is_a_no_op) {
  auto c = to_device<double>({1, 2, 3, 4});
  auto a = to_device<double>({0});
  gemm<double>(Trans::N, Trans::N, 2, 2, 0, 1.0, a.data(), 1, a.data(), 2, 3.0, c.data(), 2);
  BOOST_TEST(to_host(c) == (HostVec{3, 6, 9, 12}), boost::test_tools::per_element());
  gemm<double, double>(Trans::N, Trans::N, 0, 2, 3, 1.0, nullptr, 3, nullptr, 2, 0.0, nullptr, 2);
  gemm_strided_batched<double>(Trans::N, Trans::N, 2, 2, 2, 1.0, nullptr, 2, 4, nullptr, 2, 4,
                               0.0, nullptr, 2, 4, 0);
}

BOOST_AUTO_TEST_CASE(bad_arguments_throw) {
  Kokkos::View<float*> a("a", 6), b("b", 6), c("c", 4);
  const float* pa = a.data();
  const float* pb = b.data();
  BOOST_CHECK_THROW(gemm<float>(Trans::N, Trans::N, -1, 2, 3, 1, pa, 3, pb, 2, 0, c.data(), 2),
                    Error);
  // op(A) = A [2, 3] needs lda >= 3; A^T stored [3, 2] needs lda >= 2.
  BOOST_CHECK_THROW(gemm<float>(Trans::N, Trans::N, 2, 2, 3, 1, pa, 2, pb, 2, 0, c.data(), 2),
                    Error);
  BOOST_CHECK_NO_THROW(
      gemm<float>(Trans::T, Trans::N, 2, 2, 3, 1, pa, 2, pb, 2, 0, c.data(), 2));
  BOOST_CHECK_THROW(gemm<float>(Trans::N, Trans::T, 2, 2, 3, 1, pa, 3, pb, 2, 0, c.data(), 2),
                    Error);  // B^T stored [2, 3] needs ldb >= 3
  BOOST_CHECK_THROW(gemm<float>(Trans::N, Trans::N, 2, 2, 3, 1, pa, 3, pb, 2, 0, c.data(), 1),
                    Error);
  BOOST_CHECK_THROW(gemm<float>(Trans::N, Trans::N, 2, 2, 3, 1, nullptr, 3, pb, 2, 0, c.data(), 2),
                    Error);
  // View form: too few elements.
  BOOST_CHECK_THROW(gemm<float>(Trans::N, Trans::N, 2, 3, 3, 1.f, a, b, 0.f, c), Error);
  BOOST_CHECK_THROW(gemm<float>(Trans::N, Trans::N, 3, 2, 3, 1.f, a, b, 0.f, c), Error);
  // Overlapping output matrices in a batch.
  BOOST_CHECK_THROW(gemm_strided_batched<float>(Trans::N, Trans::N, 2, 2, 1, 1, pa, 1, 2, pb, 2,
                                                2, 0, c.data(), 2, 1, 2),
                    Error);
  BOOST_CHECK_THROW(gemm_strided_batched<float>(Trans::N, Trans::N, 2, 2, 1, 1, pa, 1, 2, pb, 2,
                                                2, 0, c.data(), 2, 2, -1),
                    Error);
}

BOOST_AUTO_TEST_SUITE_END()
