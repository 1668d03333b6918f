// RMSNorm on row widths the CUDA row kernels (rms_norm_rows.hpp) serve and on
// widths they decline, against an f64 reference computed here on the host
// from the same rounded inputs. Host builds run the portable team kernels
// for every width, CUDA builds the warp-per-row kernels where they serve:
// the same checks hold for both, and rms_norm_rows_backend_* pins which
// widths the backend serves, so that a CUDA run of this file really covers
// the row kernels (a backend that declined everything would pass the layer
// checks through the portable kernels).
//
// Tolerances, per element, for y, dx (stored in T) and dgamma (f32):
//   |got - ref| <= u_T * |ref| + kF32Slack * max|ref|
// u_T is the unit roundoff of the stored format, the one rounding of each
// stored element: bf16 2^-8 = 3.9e-3, f16 2^-11 = 4.9e-4, f32 2^-24 (dgamma
// is accumulated and kept in f32: u_f32 too). kF32Slack covers the f32
// arithmetic before that rounding, relative to the tensor's scale: the row's
// sum of squares (and of g * xhat) over d <= 4104 terms errs by about
// sqrt(d) * 2^-24 = 3.8e-6 relative (the summation order differs between the
// backends; d * 2^-24 = 2.4e-4 is the never-approached worst case), rstd
// takes half of that, and dgamma's column sums add <= 129 f32 terms. 2e-5 is
// 5x that estimate. Measured on the host (error / bound, printed per case):
// f32 <= 0.063 everywhere; bf16 and f16 y and dx up to 0.99 (the one
// rounding reaches u_T * |ref| on some element, as it should: nothing else
// is left), their dgamma <= 0.15.
// A kernel that rounded an intermediate (xhat, g, rstd) to 16 bits, or used
// another eps or mean, errs by >= u_T * |ref| more on some element and fails.
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <cstdint>
#include <random>
#include <type_traits>
#include <vector>

#include "kshard/engine/nn/rms_norm.hpp"
#include "kshard/kernels/rms_norm_rows.hpp"
#include "layer_test_util.hpp"

using namespace kshard;
using namespace kshard::test;

// A named namespace, not an anonymous one: the unity build compiles this
// file in one translation unit with the other layer tests, whose anonymous
// namespaces already hold a kRows, a Result and a type_name.
namespace rms_norm_rows_test {

constexpr double kF32Slack = 2e-5;
constexpr double kEps = 1e-5;

// Row widths: 64 (no backend serves it: under one 32-lane chunk row), 256
// (bf16/f16: 1 chunk per lane, f32: 2), 384 (f32: 3; not a whole number of
// 16-bit chunk rows), 2048 (f32: 16, the most; 16-bit: 8), 4096 (16-bit: 16;
// f32: 32, too many), 4104 (Llama-ish width not a multiple of 32 x 16 bytes).
constexpr std::int64_t kWidths[] = {64, 256, 384, 2048, 4096, 4104};
// 129 rows: 16 full 8-row blocks and one row in a 17th.
constexpr std::int64_t kRows[] = {1, 3, 129};

template <class T>
double unit_roundoff() {
  if constexpr (std::is_same_v<T, bfloat16_t>) return std::ldexp(1.0, -8);
  if constexpr (std::is_same_v<T, float16_t>) return std::ldexp(1.0, -11);
  return std::ldexp(1.0, -24);
}
template <class T>
const char* type_name() {
  if constexpr (std::is_same_v<T, bfloat16_t>) return "bf16";
  if constexpr (std::is_same_v<T, float16_t>) return "f16";
  return "f32";
}

struct Result {
  HostVec y, dx, dgamma;
};

/// The f64 RMSNorm of the (already rounded) inputs: y, dx and dgamma of
/// L = sum(y * dy).
Result reference(const HostVec& x, const HostVec& gamma, const HostVec& dy, std::int64_t rows,
                 std::int64_t d) {
  Result r{HostVec(x.size()), HostVec(x.size()), HostVec(std::size_t(d), 0.0)};
  for (std::int64_t i = 0; i < rows; ++i) {
    const std::size_t o = std::size_t(i * d);
    double sq = 0;
    for (std::int64_t j = 0; j < d; ++j) sq += x[o + j] * x[o + j];
    const double rs = 1.0 / std::sqrt(sq / double(d) + kEps);
    double sgx = 0;
    for (std::int64_t j = 0; j < d; ++j) sgx += dy[o + j] * gamma[j] * x[o + j] * rs;
    const double b = sgx / double(d);
    for (std::int64_t j = 0; j < d; ++j) {
      const double xhat = x[o + j] * rs;
      r.y[o + j] = xhat * gamma[j];
      r.dx[o + j] = rs * (dy[o + j] * gamma[j] - xhat * b);
      r.dgamma[j] += dy[o + j] * xhat;
    }
  }
  return r;
}

/// max_i |got_i - ref_i| / (u * |ref_i| + kF32Slack * max|ref|): <= 1 passes.
double bound_ratio(const HostVec& got, const HostVec& ref, double u) {
  const double scale = max_abs(ref);
  double worst = 0;
  for (std::size_t i = 0; i < ref.size(); ++i)
    worst = std::max(worst, std::abs(got[i] - ref[i]) / (u * std::abs(ref[i]) + kF32Slack * scale));
  return worst;
}

template <class T>
void check_widths() {
  const double u = unit_roundoff<T>();
  for (const std::int64_t d : kWidths)
    for (const std::int64_t rows : kRows) {
      const std::size_t n = std::size_t(rows * d);
      std::mt19937_64 rng{std::uint64_t(d * 1000 + rows)};
      // x with a non-zero mean (RMSNorm does not centre), gamma around its
      // init of ones, dy in [-1, 1): all as T holds them.
      const HostVec x = rounded<T>(random_vec(n, rng, -0.5, 1.5));
      const HostVec gamma = rounded<T>(random_vec(std::size_t(d), rng, 0.7, 1.3));
      const HostVec dy = rounded<T>(random_vec(n, rng));
      const Result ref = reference(x, gamma, dy, rows, d);

      RMSNorm<T> layer(d, kEps);
      const std::vector<Kokkos::View<const T*>> params{to_device<T>(gamma, "gamma")};
      Kokkos::View<T*> y("y", n), dx("dx", n);
      layer.forward(to_device<T>(x, "x"), {1, rows, d}, params, y);
      auto grads = allocate_gradients(layer);
      layer.backward(to_device<T>(dy, "dy"), params, grads, dx);

      const double ey = bound_ratio(to_host(y), ref.y, u);
      const double edx = bound_ratio(to_host(dx), ref.dx, u);
      const double eg = bound_ratio(to_host(grads[0]), ref.dgamma, std::ldexp(1.0, -24));
      BOOST_TEST_MESSAGE("RMSNorm " << type_name<T>() << " rows " << rows << " d " << d
                                    << ": error / bound y " << ey << ", dx " << edx
                                    << ", dgamma " << eg);
      BOOST_TEST_INFO(type_name<T>() << " rows " << rows << " d " << d << " y");
      BOOST_TEST(ey <= 1.0);
      BOOST_TEST_INFO(type_name<T>() << " rows " << rows << " d " << d << " dx");
      BOOST_TEST(edx <= 1.0);
      BOOST_TEST_INFO(type_name<T>() << " rows " << rows << " d " << d << " dgamma");
      BOOST_TEST(eg <= 1.0);
    }
}

/// Whether this build's backend should take (T, d): CUDA builds serve
/// f32/bf16/f16 rows of 1..16 chunks of 32 lanes x 16 bytes (16-byte-aligned
/// pointers; Views are); host builds serve nothing.
template <class T>
bool expect_served(std::int64_t d) {
#if defined(KOKKOS_ENABLE_CUDA)
  if constexpr (std::is_same_v<T, double>) {
    (void)d;
    return false;
  } else {
    const std::int64_t per = 32 * (16 / std::int64_t(sizeof(T)));
    return d % per == 0 && d / per >= 1 && d / per <= 16;
  }
#else
  (void)d;
  return false;
#endif
}

template <class T>
void check_backend_serves() {
  using A = accum_t<T>;
  const std::int64_t rows = 3;
  for (const std::int64_t d : kWidths) {
    const std::size_t n = std::size_t(rows * d);
    std::mt19937_64 rng{std::uint64_t(d)};
    // One element more than the rows need, for the misaligned views below.
    const auto x = to_device<T>(random_vec(n + 1, rng), "x");
    const auto gamma = to_device<T>(random_vec(std::size_t(d) + 1, rng), "gamma");
    const auto dy = to_device<T>(random_vec(n + 1, rng), "dy");
    Kokkos::View<T*> y("y", n + 1), dx("dx", n + 1);
    Kokkos::View<A*> rstd("rstd", std::size_t(rows)), dy_xhat("dy_xhat", n + 1);
    const bool want = expect_served<T>(d);
    const bool fwd = detail::rms_norm_forward_rows<T, A>(x.data(), gamma.data(), y.data(),
                                                         rstd.data(), rows, d, kEps);
    BOOST_TEST_INFO(type_name<T>() << " d " << d << " forward");
    BOOST_TEST(fwd == want);
    const bool bwd = detail::rms_norm_backward_rows<T, A>(
        x.data(), gamma.data(), dy.data(), rstd.data(), dx.data(), dy_xhat.data(), rows, d);
    BOOST_TEST_INFO(type_name<T>() << " d " << d << " backward");
    BOOST_TEST(bwd == want);
    // A row start off the 16-byte grid: declined (nothing runs), whatever d.
    const bool fwd_off = detail::rms_norm_forward_rows<T, A>(x.data() + 1, gamma.data(), y.data(),
                                                             rstd.data(), rows, d, kEps);
    BOOST_TEST_INFO(type_name<T>() << " d " << d << " misaligned x");
    BOOST_TEST(!fwd_off);
    const bool bwd_off = detail::rms_norm_backward_rows<T, A>(
        x.data(), gamma.data(), dy.data(), rstd.data(), dx.data() + 1, dy_xhat.data(), rows, d);
    BOOST_TEST_INFO(type_name<T>() << " d " << d << " misaligned dx");
    BOOST_TEST(!bwd_off);
  }
  Kokkos::fence();
}

}  // namespace rms_norm_rows_test

BOOST_AUTO_TEST_SUITE(rms_norm_rows)

BOOST_AUTO_TEST_CASE(f32_served_and_declined_widths) { rms_norm_rows_test::check_widths<float>(); }
BOOST_AUTO_TEST_CASE(bf16_served_and_declined_widths) {
  rms_norm_rows_test::check_widths<bfloat16_t>();
}
BOOST_AUTO_TEST_CASE(f16_served_and_declined_widths) {
  rms_norm_rows_test::check_widths<float16_t>();
}

BOOST_AUTO_TEST_CASE(backend_serves_the_documented_widths) {
  rms_norm_rows_test::check_backend_serves<float>();
  rms_norm_rows_test::check_backend_serves<bfloat16_t>();
  rms_norm_rows_test::check_backend_serves<float16_t>();
  rms_norm_rows_test::check_backend_serves<double>();
}

BOOST_AUTO_TEST_SUITE_END()
