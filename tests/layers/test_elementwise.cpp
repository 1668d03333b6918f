// The flat element-wise passes (cast_from_f32, GELU and SwiGLU forward / backward, the
// residual add, accumulate_with_stats) and the column sums of the bias
// gradients (accumulate_column_sums) against host loops computing the same
// formula element by element. On CUDA these run the backend's vectorized
// kernels (kernels/elementwise_stream.hpp), so the sizes cover whole 8-element
// chunks, a partial last chunk, more than one statistics block, and views
// starting 1 or 3 elements into an allocation (not 16-byte aligned: the
// scalar path). On the host they run the portable kernels.
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <limits>
#include <random>
#include <utility>

#include "kshard/kernels/cast.hpp"
#include "kshard/kernels/gelu.hpp"
#include "kshard/kernels/swiglu.hpp"
#include "kshard/engine/nn/layer.hpp"
#include "layer_test_util.hpp"

using namespace kshard;
using namespace kshard::test;

namespace {

// 8-element chunks: exactly one, one plus a partial one, several statistics
// blocks (8192 elements each) with a partial last block.
const std::int64_t kSizes[] = {1, 7, 8, 9, 2051, 3 * 8192 + 13};
const std::int64_t kOffsets[] = {0, 1, 3};

template <class T>
using Window = Kokkos::View<T*>;

/// n elements of a fresh allocation, starting `offset` elements in.
template <class T>
Window<T> window(std::int64_t offset, std::int64_t n, const HostVec& values) {
  Kokkos::View<T*> all("window", std::size_t(offset + n));
  Window<T> w = Kokkos::subview(all, std::make_pair(std::size_t(offset), std::size_t(offset + n)));
  upload<T>(values, w);
  return w;
}

template <class T>
double gelu_ref(double x) {
  using A = accum_t<T>;
  const A c = A(0.7978845608028654), v = A(x);
  const A t = std::tanh(c * (v + A(0.044715) * v * v * v));
  return to_double(from_accum<T>(A(0.5) * v * (A(1) + t)));
}
template <class T>
double gelu_grad_ref(double x, double dy) {
  using A = accum_t<T>;
  const A c = A(0.7978845608028654), v = A(x);
  const A t = std::tanh(c * (v + A(0.044715) * v * v * v));
  const A g = A(0.5) * (A(1) + t) + A(0.5) * v * (A(1) - t * t) * c * (A(1) + A(3 * 0.044715) * v * v);
  return to_double(from_accum<T>(A(dy) * g));
}

// GELU's exp (its sigmoid form; on the GPU the special-function instructions)
// differs from the reference's tanh in the last bits of accum_t<T>. Through
// the formula that difference grows with the size of its terms (the
// reference's 0.5 v (1 + t) loses digits where 1 + t is small), so the bound
// is a few units of accum_t<T> times the terms' magnitude, plus one step of
// T's rounding of the result (a tie can fall either way).
template <class T>
double rounding_step() {  // relative spacing of T at most
  if constexpr (std::is_same_v<T, bfloat16_t>) return 1.0 / 128;
  if constexpr (std::is_same_v<T, float16_t>) return 1.0 / 1024;
  return 0.0;
}
template <class T>
double gelu_bound(double want, double terms) {
  const double eps = std::numeric_limits<accum_t<T>>::epsilon();
  return rounding_step<T>() * std::abs(want) + 16 * eps * terms;
}

template <class T>
void check_compute_type() {
  std::mt19937_64 rng(11);
  for (const std::int64_t n : kSizes)
    for (const std::int64_t off : kOffsets) {
      const HostVec a = rounded<T>(random_vec(std::size_t(n), rng, -4.0, 4.0));
      const HostVec b = rounded<T>(random_vec(std::size_t(n), rng, -2.0, 2.0));
      auto da = window<T>(off, n, a), db = window<T>(off + 1, n, b);
      auto out = window<T>(off, n, HostVec(std::size_t(n), 0.0));

      detail::add<T>(da, db, out);
      HostVec got = to_host(out);
      int bad_add = 0;
      for (std::int64_t i = 0; i < n; ++i) {
        const double want =
            to_double(from_accum<T>(to_accum(from_double<T>(a[i])) + to_accum(from_double<T>(b[i]))));
        bad_add += got[i] != want;
      }
      BOOST_TEST(bad_add == 0, "add n=" << n << " offset=" << off);

      // In place, as the residual adds run (out = a + out).
      upload<T>(b, out);
      detail::add<T>(da, out, out);
      got = to_host(out);
      bad_add = 0;
      for (std::int64_t i = 0; i < n; ++i)
        bad_add += got[i] != to_double(from_accum<T>(to_accum(from_double<T>(a[i])) +
                                                      to_accum(from_double<T>(b[i]))));
      BOOST_TEST(bad_add == 0, "add in place n=" << n << " offset=" << off);

      detail::gelu_forward<T>(da, out);
      got = to_host(out);
      int bad_gelu = 0;
      for (std::int64_t i = 0; i < n; ++i) {
        const double want = gelu_ref<T>(a[i]);
        bad_gelu += !(std::abs(got[i] - want) <= gelu_bound<T>(want, std::abs(a[i]) + 1e-30));
      }
      BOOST_TEST(bad_gelu == 0, "gelu_forward n=" << n << " offset=" << off);

      // dx written over dy, as the MLP's backward does.
      upload<T>(b, out);
      detail::gelu_backward<T>(da, out, out);
      got = to_host(out);
      bad_gelu = 0;
      for (std::int64_t i = 0; i < n; ++i) {
        const double want = gelu_grad_ref<T>(a[i], b[i]);
        const double v = std::abs(a[i]);
        const double terms = std::abs(b[i]) * (1 + v * (1 + 0.134 * v * v));
        bad_gelu += !(std::abs(got[i] - want) <= gelu_bound<T>(want, terms) + 1e-30);
      }
      BOOST_TEST(bad_gelu == 0, "gelu_backward n=" << n << " offset=" << off);
    }
}

// SwiGLU over rows of [a | b]: widths h that are whole 8-element chunks (the
// CUDA backend's vector path) and not (its scalar path), one row and several,
// views 0 or 1 elements into their allocation. Reference in double from the
// T-rounded inputs; bound as GELU's: T's rounding of the result plus a few
// units of accum_t<T> times the size of the formula's terms.
template <class T>
void check_swiglu() {
  std::mt19937_64 rng(17);
  const std::pair<std::int64_t, std::int64_t> shapes[] = {{1, 8}, {3, 7}, {5, 16}, {4, 88}, {2, 1001}, {3, 264}};
  for (const auto& [rows, h] : shapes)
    for (const std::int64_t off : {std::int64_t(0), std::int64_t(1)}) {
      const std::int64_t n = rows * h;
      const HostVec x = rounded<T>(random_vec(std::size_t(2 * n), rng, -6.0, 6.0));
      const HostVec g = rounded<T>(random_vec(std::size_t(n), rng, -2.0, 2.0));
      auto dx_in = window<T>(off, 2 * n, x), dg = window<T>(off, n, g);
      auto y = window<T>(off, n, HostVec(std::size_t(n), 0.0));
      auto dx = window<T>(off, 2 * n, HostVec(std::size_t(2 * n), 0.0));
      detail::swiglu_forward<T>(dx_in, y, rows, h);
      detail::swiglu_backward<T>(dx_in, dg, dx, rows, h);
      const HostVec got_y = to_host(y), got_dx = to_host(dx);
      int bad_y = 0, bad_dx = 0;
      for (std::int64_t r = 0; r < rows; ++r)
        for (std::int64_t j = 0; j < h; ++j) {
          const double a = x[std::size_t(r * 2 * h + j)], b = x[std::size_t(r * 2 * h + h + j)];
          const double gi = g[std::size_t(r * h + j)];
          const double s = 1.0 / (1.0 + std::exp(-a));
          const double want_y = a * s * b;
          const double want_da = gi * b * s * (1 + a * (1 - s)), want_db = gi * a * s;
          const double ty = std::abs(a * b) * (1 + std::abs(a));
          const double td = std::abs(gi) * (std::abs(b) * (1 + std::abs(a)) * (1 + std::abs(a)) + std::abs(a));
          bad_y += !(std::abs(got_y[std::size_t(r * h + j)] - want_y) <= gelu_bound<T>(want_y, ty) + 1e-30);
          bad_dx += !(std::abs(got_dx[std::size_t(r * 2 * h + j)] - want_da) <= gelu_bound<T>(want_da, td) + 1e-30);
          bad_dx += !(std::abs(got_dx[std::size_t(r * 2 * h + h + j)] - want_db) <= gelu_bound<T>(want_db, td) + 1e-30);
        }
      BOOST_TEST(bad_y == 0, "swiglu_forward rows=" << rows << " h=" << h << " offset=" << off);
      BOOST_TEST(bad_dx == 0, "swiglu_backward rows=" << rows << " h=" << h << " offset=" << off);
    }
}

template <class T>
void check_storage_type() {
  std::mt19937_64 rng(13);
  const double inf = std::numeric_limits<double>::infinity();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (const std::int64_t n : kSizes)
    for (const std::int64_t off : kOffsets) {
      // cast_from_f32: exact (one round to nearest even), so bitwise equal.
      const HostVec m = rounded<float>(random_vec(std::size_t(n), rng, -3.0, 3.0));
      auto src = window<float>(off, n, m);
      auto low = window<T>(off + 1, n, HostVec(std::size_t(n), 0.0));
      cast_from_f32<T>(src, low);
      const HostVec got = to_host(low);
      int bad_cast = 0;
      for (std::int64_t i = 0; i < n; ++i)
        bad_cast += got[i] != to_double(from_float<T>(float(m[i])));
      BOOST_TEST(bad_cast == 0, "cast_from_f32 n=" << n << " offset=" << off);

      // accumulate_with_stats in each mode, with an inf and a NaN among the
      // values once there are enough of them.
      for (const GradWrite mode : {GradWrite::add, GradWrite::assign, GradWrite::none}) {
        HostVec g = rounded<T>(random_vec(std::size_t(n), rng));
        HostVec d = rounded<float>(random_vec(std::size_t(n), rng));
        if (n >= 9) {
          (mode == GradWrite::none ? d : g)[std::size_t(n / 2)] = inf;
          (mode == GradWrite::none ? d : g)[std::size_t(n - 1)] = nan;
        }
        auto gs = window<T>(off, n, g);
        auto dst = window<float>(off + 3, n, d);
        Kokkos::View<double*> stats("stats", 2);
        accumulate_with_stats<T>(gs, dst, stats, mode);
        const HostVec nd = to_host(dst), st = to_host(stats);
        double sq = 0, nonfinite = 0;
        int bad_dst = 0;
        for (std::int64_t i = 0; i < n; ++i) {
          const float s = to_float(from_double<T>(g[i]));
          const float want = mode == GradWrite::add      ? float(d[i]) + s
                             : mode == GradWrite::assign ? s
                                                         : float(d[i]);
          bad_dst += !(nd[i] == double(want) || (std::isnan(nd[i]) && std::isnan(want)));
          if (std::isfinite(want))
            sq += double(want) * double(want);
          else
            nonfinite += 1;
        }
        const char* name = mode == GradWrite::add ? "add" : mode == GradWrite::assign ? "assign" : "none";
        BOOST_TEST(bad_dst == 0, "accumulate_with_stats(" << name << ") n=" << n << " offset=" << off);
        // Sum of squares: the same terms in another order (double).
        BOOST_TEST(std::abs(st[0] - sq) <= 1e-12 * sq,
                   "sum of squares " << st[0] << " vs " << sq << " (" << name << ", n=" << n << ")");
        BOOST_TEST(st[1] == nonfinite, "inf/NaN count (" << name << ", n=" << n << ")");
      }
    }
}

// accumulate_column_sums (bias and LayerNorm gradients): db += column sums of
// dy (a GEMV against ones), against a double-precision sum on the host.
template <class T>
void check_column_sums() {
  using A = accum_t<T>;
  std::mt19937_64 rng(17);
  const double tol = std::is_same_v<A, double> ? 1e-12 : 1e-5;
  for (const std::int64_t rows : {1, 5, 33, 1000})
    for (const std::int64_t cols : {8, 16, 264, 2056, 7, 30}) {
      const HostVec dy = rounded<T>(random_vec(std::size_t(rows * cols), rng));
      const HostVec db0 = rounded<A>(random_vec(std::size_t(cols), rng));
      auto d_dy = to_device<T>(dy, "dy");
      auto d_db = to_device<A>(db0, "db");
      Kokkos::View<T*> ones;
      detail::accumulate_column_sums<T>(d_dy, rows, cols, d_db, ones);
      const HostVec got = to_host(d_db);
      double worst = 0;
      for (std::int64_t c = 0; c < cols; ++c) {
        double want = 0, scale = std::abs(db0[std::size_t(c)]);
        for (std::int64_t r = 0; r < rows; ++r) {
          want += dy[std::size_t(r * cols + c)];
          scale += std::abs(dy[std::size_t(r * cols + c)]);
        }
        want += db0[std::size_t(c)];
        worst = std::max(worst, std::abs(got[std::size_t(c)] - want) / std::max(scale, 1.0));
      }
      BOOST_TEST(worst <= tol, "column sums rows=" << rows << " cols=" << cols << ": " << worst);
    }
}

}  // namespace

BOOST_AUTO_TEST_SUITE(elementwise)

BOOST_AUTO_TEST_CASE(column_sums_float) { check_column_sums<float>(); }
BOOST_AUTO_TEST_CASE(column_sums_double) { check_column_sums<double>(); }
BOOST_AUTO_TEST_CASE(column_sums_bf16) { check_column_sums<bfloat16_t>(); }
BOOST_AUTO_TEST_CASE(column_sums_f16) { check_column_sums<float16_t>(); }

BOOST_AUTO_TEST_CASE(add_and_gelu_float) { check_compute_type<float>(); }
BOOST_AUTO_TEST_CASE(add_and_gelu_double) { check_compute_type<double>(); }
BOOST_AUTO_TEST_CASE(add_and_gelu_bf16) { check_compute_type<bfloat16_t>(); }
BOOST_AUTO_TEST_CASE(add_and_gelu_f16) { check_compute_type<float16_t>(); }
BOOST_AUTO_TEST_CASE(swiglu_float) { check_swiglu<float>(); }
BOOST_AUTO_TEST_CASE(swiglu_double) { check_swiglu<double>(); }
BOOST_AUTO_TEST_CASE(swiglu_bf16) { check_swiglu<bfloat16_t>(); }
BOOST_AUTO_TEST_CASE(swiglu_f16) { check_swiglu<float16_t>(); }
BOOST_AUTO_TEST_CASE(cast_and_grad_stats_float) { check_storage_type<float>(); }
BOOST_AUTO_TEST_CASE(cast_and_grad_stats_bf16) { check_storage_type<bfloat16_t>(); }
BOOST_AUTO_TEST_CASE(cast_and_grad_stats_f16) { check_storage_type<float16_t>(); }

BOOST_AUTO_TEST_SUITE_END()
