// Deterministic initialisation: same (seed, key, index) -> same value, for any
// sharding and (through the golden values) any backend.
#include <boost/test/unit_test.hpp>

#include <cstring>

#include "kshard/engine/nn/init.hpp"
#include "kshard/engine/nn/linear.hpp"
#include "kshard/engine/nn/transformer_layer.hpp"
#include "kshard/error.hpp"
#include "layer_test_util.hpp"

using namespace kshard;
using namespace kshard::test;

namespace {
template <class T>
HostVec fill(std::int64_t n, const Init& init, std::uint64_t seed, const char* key,
             std::int64_t first = 0) {
  Kokkos::View<T*> v("v", static_cast<std::size_t>(n));
  fill_init<T>(v, init, seed, key, first);
  return to_host(v);
}
}  // namespace

BOOST_AUTO_TEST_SUITE(init_tests)

BOOST_AUTO_TEST_CASE(same_seed_same_values_different_seed_or_key_differ) {
  for (const Init& init : {Init::uniform(0.5), Init::normal(0.02)}) {
    const HostVec a = fill<double>(1000, init, 7, "layers.0.weight");
    const HostVec b = fill<double>(1000, init, 7, "layers.0.weight");
    const HostVec c = fill<double>(1000, init, 8, "layers.0.weight");
    const HostVec d = fill<double>(1000, init, 7, "layers.1.weight");
    BOOST_TEST(a == b, boost::test_tools::per_element());
    std::size_t same_c = 0, same_d = 0;
    for (std::size_t i = 0; i < a.size(); ++i) {
      same_c += a[i] == c[i];
      same_d += a[i] == d[i];
    }
    BOOST_TEST(same_c == 0u);
    BOOST_TEST(same_d == 0u);
  }
}

BOOST_AUTO_TEST_CASE(a_shard_equals_the_slice_of_the_full_fill) {
  const std::int64_t n = 1001;  // not divisible by the shard count
  for (const Init& init : {Init::uniform(1.0), Init::normal(1.0, 0.5), Init::ones()}) {
    const HostVec full = fill<float>(n, init, 3, "w");
    const std::int64_t shards = 4, per = (n + shards - 1) / shards;
    for (std::int64_t s = 0; s < shards; ++s) {
      const std::int64_t first = s * per, len = std::min(per, n - first);
      const HostVec part = fill<float>(len, init, 3, "w", first);
      const HostVec want(full.begin() + first, full.begin() + first + len);
      BOOST_TEST(part == want, boost::test_tools::per_element());
    }
  }
}

BOOST_AUTO_TEST_CASE(golden_values_pin_the_generator) {
  // Computed once on the host; any backend or refactoring must reproduce them.
  // uniform is exact (one rounded multiply); normal goes through libm, which
  // may differ in the last ulp between host and device: 1e-15 relative.
  const HostVec u = fill<double>(4, Init::uniform(1.0), 42, "golden");
  const HostVec z = fill<double>(4, Init::normal(1.0), 42, "golden");
  const HostVec want_u{0.007575297300626449, -0.026469362673255281, -0.07840778069862564,
                       0.27249961369020848};
  const HostVec want_z{-1.1797600099944201, -0.72844610078605432, -1.4388168831054684,
                       -0.13982024462644782};
  BOOST_TEST(u == want_u, boost::test_tools::per_element());
  for (std::size_t i = 0; i < 4; ++i) BOOST_TEST(std::abs(z[i] - want_z[i]) <= 1e-15 * std::abs(want_z[i]));
  // The float fill is the double value rounded to float (uniform: bit-exact).
  const HostVec uf = fill<float>(4, Init::uniform(1.0), 42, "golden");
  for (std::size_t i = 0; i < 4; ++i) BOOST_TEST(uf[i] == static_cast<double>(static_cast<float>(u[i])));
}

BOOST_AUTO_TEST_CASE(distributions_have_the_requested_moments) {
  const std::int64_t n = 200000;
  // Sample-moment tolerances ~6 standard errors (se of a mean = sd / sqrt(n) = 0.0022 sd).
  const HostVec u = fill<double>(n, Init::uniform(0.5), 1, "u");
  double mu = 0, var = 0, lo = 1, hi = -1;
  for (double v : u) {
    mu += v;
    lo = std::min(lo, v);
    hi = std::max(hi, v);
  }
  mu /= n;
  for (double v : u) var += (v - mu) * (v - mu);
  var /= n;
  BOOST_TEST(lo >= -0.5);
  BOOST_TEST(hi < 0.5);
  BOOST_TEST(std::abs(mu) < 0.002);
  BOOST_TEST(std::abs(var - 0.25 / 3) < 0.002);

  const HostVec z = fill<double>(n, Init::normal(0.02, 1.0), 1, "z");
  mu = 0;
  var = 0;
  for (double v : z) mu += v;
  mu /= n;
  for (double v : z) var += (v - mu) * (v - mu);
  var /= n;
  BOOST_TEST(std::abs(mu - 1.0) < 6 * 0.02 / std::sqrt(double(n)));
  BOOST_TEST(std::abs(std::sqrt(var) - 0.02) < 0.02 * 0.01);

  const HostVec zero = fill<double>(10, Init::zeros(), 1, "a");
  const HostVec one = fill<double>(10, Init::ones(), 1, "a");
  BOOST_TEST(max_abs(zero) == 0.0);
  for (double v : one) BOOST_TEST(v == 1.0);
}

BOOST_AUTO_TEST_CASE(init_parameters_follows_the_specs_and_prefix) {
  TransformerLayer<float> block(8, 2, 16);
  auto a = allocate_parameters(block), b = allocate_parameters(block);
  init_parameters(block, a, 5, "layers.0.");
  init_parameters(block, b, 5, "layers.1.");
  const auto specs = block.param_specs();
  for (std::size_t i = 0; i < specs.size(); ++i) {
    const HostVec ha = to_host(a[i]), hb = to_host(b[i]);
    const HostVec want = fill<float>(specs[i].numel(), specs[i].init, 5,
                                     ("layers.0." + specs[i].name).c_str());
    BOOST_TEST(ha == want, boost::test_tools::per_element());
    if (specs[i].init.kind == Init::Kind::uniform) {
      BOOST_TEST(ha != hb);  // same local name, different layer: different values
      BOOST_TEST(max_abs(ha) <= specs[i].init.scale);
    }
  }
  BOOST_TEST(Init::uniform_fan_in(16).scale == 0.25);
  BOOST_CHECK_THROW(Init::uniform_fan_in(0), Error);
  BOOST_CHECK_THROW(init_parameters(block, std::vector<Kokkos::View<float*>>(3), 1), Error);
  Kokkos::View<float*> v("v", 3);
  BOOST_CHECK_THROW(fill_init<float>(v, Init::uniform(-1.0), 1, "k"), Error);
  BOOST_CHECK_THROW(fill_init<float>(v, Init::uniform(1.0), 1, "k", -1), Error);
}

BOOST_AUTO_TEST_SUITE_END()
