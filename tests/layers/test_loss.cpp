// Losses: values against closed forms, gradients against central finite
// differences in double (same h = 1e-6 and 1e-6 relative tolerance as the
// layer checks, for the same reasons: FD noise ~1e-9), float vs double.
#include <boost/test/unit_test.hpp>

#include "kshard/engine/nn/loss.hpp"
#include "kshard/error.hpp"
#include "layer_test_util.hpp"

using namespace kshard;
using namespace kshard::test;

namespace {

template <class F>
HostVec fd(F&& f, HostVec v) {
  HostVec g(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) {
    const double keep = v[i];
    v[i] = keep + kFdStep;
    const double fp = f(v);
    v[i] = keep - kFdStep;
    const double fm = f(v);
    v[i] = keep;
    g[i] = (fp - fm) / (2 * kFdStep);
  }
  return g;
}

double ce(const HostVec& logits, std::int64_t rows, std::int64_t vocab,
          const std::vector<std::int32_t>& targets, HostVec* grad = nullptr) {
  Kokkos::View<std::int32_t*> t("t", targets.size());
  auto th = Kokkos::create_mirror_view(t);
  for (std::size_t i = 0; i < targets.size(); ++i) th(i) = targets[i];
  Kokkos::deep_copy(t, th);
  Kokkos::View<double*> dl("dl", logits.size());
  const double l = cross_entropy_loss<double, std::int32_t>(to_device<double>(logits), rows, vocab,
                                                            t, dl);
  if (grad) *grad = to_host(dl);
  return l;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(loss_tests)

BOOST_AUTO_TEST_CASE(mse_value_and_gradient) {
  std::mt19937_64 rng(1);
  const HostVec p = random_vec(15, rng), t = random_vec(15, rng);
  auto td = to_device<double>(t);
  Kokkos::View<double*> dp("dp", 15);
  const double l = mse_loss<double>(to_device<double>(p), td, dp);
  double want = 0;
  for (std::size_t i = 0; i < p.size(); ++i) want += (p[i] - t[i]) * (p[i] - t[i]) / 15.0;
  BOOST_TEST(l == want, boost::test_tools::tolerance(1e-14));
  auto f = [&](const HostVec& v) {
    Kokkos::View<double*> scratch("s", 15);
    return mse_loss<double>(to_device<double>(v), td, scratch);
  };
  BOOST_TEST(rel_err(fd(f, p), to_host(dp)) <= kFdTol);
  // grad_scale scales the gradient, not the loss.
  Kokkos::View<double*> dp2("dp2", 15);
  BOOST_TEST(mse_loss<double>(to_device<double>(p), td, dp2, 0.5) == l,
             boost::test_tools::tolerance(1e-14));
  HostVec half = to_host(dp);
  for (auto& v : half) v *= 0.5;
  BOOST_TEST(rel_err(to_host(dp2), half) <= 1e-15);
}

BOOST_AUTO_TEST_CASE(cross_entropy_value_and_gradient) {
  const std::int64_t rows = 5, vocab = 7;
  std::mt19937_64 rng(2);
  HostVec logits = random_vec(rows * vocab, rng, -3, 3);
  logits[3] = 40.0;  // a large logit: the max-subtraction must keep it finite
  // Row 2 is ignored (negative target): no loss, zero gradient, not counted.
  const std::vector<std::int32_t> targets{0, 6, -100, 3, 3};
  HostVec grad;
  const double l = ce(logits, rows, vocab, targets, &grad);
  double want = 0;
  for (std::int64_t r = 0; r < rows; ++r) {
    if (targets[r] < 0) continue;
    double mx = -1e300, s = 0;
    for (std::int64_t j = 0; j < vocab; ++j) mx = std::max(mx, logits[r * vocab + j]);
    for (std::int64_t j = 0; j < vocab; ++j) s += std::exp(logits[r * vocab + j] - mx);
    want += mx + std::log(s) - logits[r * vocab + targets[r]];
  }
  want /= 4;
  BOOST_TEST(l == want, boost::test_tools::tolerance(1e-13));
  auto f = [&](const HostVec& v) { return ce(v, rows, vocab, targets); };
  BOOST_TEST(rel_err(fd(f, logits), grad) <= kFdTol);
  for (std::int64_t j = 0; j < vocab; ++j) BOOST_TEST(grad[2 * vocab + j] == 0.0);

  // Uniform logits: loss = log(vocab) exactly-ish.
  const HostVec flat(rows * vocab, 0.25);
  const double l_flat = ce(flat, rows, vocab, {1, 2, 3, 4, 5});
  BOOST_TEST(l_flat == std::log(7.0), boost::test_tools::tolerance(1e-14));
}

BOOST_AUTO_TEST_CASE(cross_entropy_target_types_and_float) {
  const std::int64_t rows = 3, vocab = 4;
  std::mt19937_64 rng(3);
  const HostVec logits = random_vec(rows * vocab, rng, -2, 2);
  const double ref = ce(logits, rows, vocab, {1, 0, 3});
  // Targets as int64 (ce() above: int32).
  Kokkos::View<double*> dl("dl", rows * vocab);
  Kokkos::View<std::int64_t*> t64("t", 3);
  auto h = Kokkos::create_mirror_view(t64);
  h(0) = 1;
  h(1) = 0;
  h(2) = 3;
  Kokkos::deep_copy(t64, h);
  const double l64 =
      cross_entropy_loss<double, std::int64_t>(to_device<double>(logits), rows, vocab, t64, dl);
  BOOST_TEST(l64 == ref, boost::test_tools::tolerance(1e-15));
  // float: loss within 1e-6 relative (float softmax of O(1) logits), gradient 1e-6 absolute.
  Kokkos::View<float*> dlf("dlf", rows * vocab);
  Kokkos::View<std::int32_t*> t32("t32", 3);
  Kokkos::deep_copy(t32, Kokkos::View<const std::int32_t*, Kokkos::HostSpace>(
                             std::vector<std::int32_t>{1, 0, 3}.data(), 3));
  const double lf = cross_entropy_loss<float, std::int32_t>(to_device<float>(logits), rows, vocab,
                                                            t32, dlf);
  BOOST_TEST(lf == ref, boost::test_tools::tolerance(1e-6));
  BOOST_TEST(rel_err(to_host(dlf), to_host(dl), 1.0) <= 1e-6);
  // All rows ignored: loss 0, gradient 0.
  const double l_none = ce(logits, rows, vocab, {-1, -1, -1});
  BOOST_TEST(l_none == 0.0);
}

// The forward-only mode: the sum of the counted rows' losses equals the
// training loss times the counted rows, ignored rows count nothing, the
// logits are left as they were, a target >= vocab throws.
BOOST_AUTO_TEST_CASE(cross_entropy_sum_is_the_forward_only_mode) {
  const std::int64_t rows = 5, vocab = 9;
  std::mt19937_64 rng(8);
  const HostVec logits = random_vec(rows * vocab, rng, -3, 3);
  const std::vector<std::int32_t> t{2, -1, 8, 0, -100};
  Kokkos::View<std::int32_t*> td("t", t.size());
  Kokkos::deep_copy(td, Kokkos::View<const std::int32_t*, Kokkos::HostSpace>(t.data(), t.size()));
  const auto ld = to_device<double>(logits);
  const CrossEntropySum s = cross_entropy_sum<double, std::int32_t>(ld, rows, vocab, td);
  BOOST_TEST(s.rows == 3);
  const double mean = ce(logits, rows, vocab, t);
  BOOST_TEST(s.sum == mean * 3, boost::test_tools::tolerance(1e-14));
  BOOST_TEST(rel_err(to_host(ld), logits, 1.0) == 0.0);  // not overwritten
  const auto lf = to_device<float>(logits);
  const CrossEntropySum sf = cross_entropy_sum<float, std::int32_t>(lf, rows, vocab, td);
  BOOST_TEST(sf.sum == mean * 3, boost::test_tools::tolerance(1e-6));
  const std::vector<std::int32_t> bad{2, 9, 0, 0, 0};
  Kokkos::View<std::int32_t*> bd("bad", bad.size());
  Kokkos::deep_copy(bd, Kokkos::View<const std::int32_t*, Kokkos::HostSpace>(bad.data(), bad.size()));
  BOOST_CHECK_THROW((cross_entropy_sum<double, std::int32_t>(ld, rows, vocab, bd)), Error);
  BOOST_CHECK_THROW((cross_entropy_sum<double, std::int32_t>(ld, rows + 1, vocab, td)), Error);
}

BOOST_AUTO_TEST_CASE(loss_argument_errors) {
  Kokkos::View<double*> a("a", 6), b("b", 5), d("d", 6);
  BOOST_CHECK_THROW(mse_loss<double>(a, b, d), Error);
  BOOST_CHECK_THROW(mse_loss<double>(a, a, b), Error);
  BOOST_CHECK_THROW(mse_loss<double>(Kokkos::View<double*>("e", 0), Kokkos::View<double*>("e", 0),
                                     Kokkos::View<double*>("e", 0)),
                    Error);
  const HostVec logits(6, 0.0);
  const std::vector<std::int32_t> t_vocab{0, 3}, t_three{0, 1, 2}, t_one{0};
  BOOST_CHECK_THROW(ce(logits, 2, 3, t_vocab), Error);  // target == vocab
  BOOST_CHECK_THROW(ce(logits, 3, 3, t_three), Error);  // logits size
  BOOST_CHECK_THROW(ce(logits, 2, 3, t_one), Error);    // targets size
}

BOOST_AUTO_TEST_SUITE_END()
