// kshard/kernels/fp8_block.hpp against a scalar reference written here from
// the documented recipe: power-of-two scale = smallest 2^k (k >= -126) with
// amax <= finite_max * 2^k, found by a plain loop over k in exact double
// arithmetic; q = nearest fp8 value of x / scale by the reference model's
// table search (reference.hpp, independent of convert.hpp); x' = q * scale.
#include <boost/mpl/list.hpp>
#include <boost/test/unit_test.hpp>

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <algorithm>
#include <utility>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include <Kokkos_Core.hpp>

#include "checker.hpp"
#include "kshard/kernels/fp8_block.hpp"
#include "kshard/error.hpp"
#include "fp8_reference.hpp"

using namespace kshard_test;

namespace {

// ---- device plumbing -------------------------------------------------------

Kokkos::View<float*> to_device(const std::vector<float>& h) {
  Kokkos::View<float*> d(Kokkos::view_alloc(Kokkos::WithoutInitializing, "x"), h.size());
  Kokkos::deep_copy(d, Kokkos::View<const float*, Kokkos::HostSpace, Kokkos::MemoryUnmanaged>(
                           h.data(), h.size()));
  return d;
}

template <class T>
std::vector<T> to_host(const Kokkos::View<T*>& d) {
  std::vector<T> h(d.extent(0));
  Kokkos::deep_copy(Kokkos::View<T*, Kokkos::HostSpace, Kokkos::MemoryUnmanaged>(h.data(), h.size()),
                    d);
  return h;
}

template <class Fp8>
struct DeviceQuant {
  Kokkos::View<Fp8*> q;
  Kokkos::View<float*> scales;
  Kokkos::View<float*> x;  // dequantized
};

template <class Fp8>
DeviceQuant<Fp8> device_round_trip(const std::vector<float>& xs, int block, bool default_block) {
  const std::size_t nb = kshard::fp8_num_blocks(xs.size(), block);
  DeviceQuant<Fp8> d{Kokkos::View<Fp8*>("q", xs.size()), Kokkos::View<float*>("scales", nb),
                     Kokkos::View<float*>("x'", xs.size())};
  const Kokkos::View<float*> x = to_device(xs);
  if (default_block) {
    kshard::fp8_quantize(x, d.q, d.scales);
    kshard::fp8_dequantize(d.q, d.scales, d.x);
  } else {
    kshard::fp8_quantize(x, d.q, d.scales, block);
    kshard::fp8_dequantize(d.q, d.scales, d.x, block);
  }
  return d;
}

// ---- comparison ------------------------------------------------------------

template <class Fp8>
std::string fmt_name() {
  return table<Fp8>().fmt.name;
}

std::string show(float v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%a", double(v));
  return buf;
}

bool same_float(float a, float b) {
  return (std::isnan(a) && std::isnan(b)) || float_bits(a) == float_bits(b);
}

/// Device result == scalar reference, bit for bit, for q, scales and x'.
template <class Fp8>
void check_against_reference(const std::vector<float>& xs, int block, const std::string& what,
                             bool default_block = false) {
  const DeviceQuant<Fp8> d = device_round_trip<Fp8>(xs, block, default_block);
  const RefQuant r = ref_quantize<Fp8>(xs, block);
  const std::vector<Fp8> q = to_host(d.q);
  const std::vector<float> s = to_host(d.scales);
  const std::vector<float> x = to_host(d.x);
  Checker c(fmt_name<Fp8>() + " " + what + " (n=" + std::to_string(xs.size()) +
            ", block=" + std::to_string(block) + ")");
  BOOST_CHECK(s.size() == r.scales.size());
  for (std::size_t b = 0; b < std::min(s.size(), r.scales.size()); ++b)
    c.check(float_bits(s[b]) == float_bits(r.scales[b]), [&] {
      return "scale[" + std::to_string(b) + "] = " + show(s[b]) + ", want " + show(r.scales[b]);
    });
  for (std::size_t i = 0; i < xs.size(); ++i) {
    c.check(q[i].bits == r.q[i], [&] {
      return "q[" + std::to_string(i) + "] of " + show(xs[i]) + " = " + hex(q[i].bits, 2) +
             ", want " + hex(r.q[i], 2);
    });
    c.check(same_float(x[i], r.x[i]), [&] {
      return "x'[" + std::to_string(i) + "] of " + show(xs[i]) + " = " + show(x[i]) + ", want " +
             show(r.x[i]);
    });
  }
  c.report();
}

/// Random data whose magnitude changes from block to block (so every block
/// gets its own scale), with zeros, negatives and exact ties sprinkled in.
std::vector<float> varied_blocks(std::size_t n, int block, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<float> v(n);
  int e = 0;
  for (std::size_t i = 0; i < n; ++i) {
    if (i % std::size_t(block) == 0) e = int(rng() % 61) - 30;
    const std::uint32_t r = rng();
    float x = float(std::ldexp(double(r & 0xFFFFFF) / double(1 << 24), e));
    if ((r >> 24) % 16 == 0) x = 0.0f;
    if ((r >> 28) & 1) x = -x;
    v[i] = x;
  }
  return v;
}

using Fp8Types = boost::mpl::list<kshard::float8_e4m3_t, kshard::float8_e5m2_t>;

}  // namespace

BOOST_AUTO_TEST_SUITE(numeric_fp8_block)

BOOST_AUTO_TEST_CASE(num_blocks) {
  BOOST_CHECK(kshard::fp8_num_blocks(0) == 0u);
  BOOST_CHECK(kshard::fp8_num_blocks(1) == 1u);
  BOOST_CHECK(kshard::fp8_num_blocks(128) == 1u);
  BOOST_CHECK(kshard::fp8_num_blocks(129) == 2u);
  BOOST_CHECK(kshard::fp8_num_blocks(1000, 7) == 143u);
  BOOST_CHECK(kshard::fp8_num_blocks(1001, 7) == 143u);
  BOOST_CHECK(kshard::fp8_num_blocks(5, 1) == 5u);
  BOOST_CHECK(kshard::fp8_default_block == 128);
  BOOST_CHECK_THROW(kshard::fp8_num_blocks(10, 0), kshard::Error);
  BOOST_CHECK_THROW(kshard::fp8_num_blocks(10, -128), kshard::Error);
}

BOOST_AUTO_TEST_CASE_TEMPLATE(random_blocks_match_scalar_reference, Fp8, Fp8Types) {
  // 1000 = 7 full blocks of 128 + a partial block of 104.
  check_against_reference<Fp8>(varied_blocks(1000, 128, 11), 128, "random, default block", true);
  for (int block : {1, 7, 32, 128, 1000, 4096})
    check_against_reference<Fp8>(varied_blocks(1000, block, 12 + block), block, "random");
  check_against_reference<Fp8>(varied_blocks(1 << 18, 128, 5), 128, "random, large");
}

BOOST_AUTO_TEST_CASE_TEMPLATE(error_bound_per_element, Fp8, Fp8Types) {
  // |x - x'| <= scale * half an fp8 ulp at |x| / scale: relative 2^-(M+1)
  // for normals (2^-4 for E4M3), and half the smallest subnormal absolute.
  const RefTable& t = table<Fp8>();
  const int m = t.fmt.mbits;
  const std::vector<float> xs = varied_blocks(1 << 16, 128, 99);
  const DeviceQuant<Fp8> d = device_round_trip<Fp8>(xs, 128, false);
  const std::vector<float> s = to_host(d.scales);
  const std::vector<float> x = to_host(d.x);
  Checker c(fmt_name<Fp8>() + " |x - x'| <= scale * half ulp");
  Checker rel(fmt_name<Fp8>() + " relative error <= 2^-(M+1) for normals");
  Checker fit(fmt_name<Fp8>() + " power-of-two scales with amax <= max * scale < 2 amax");
  for (std::size_t b = 0; b < s.size(); ++b) {
    double amax = 0;
    for (std::size_t i = b * 128; i < (b + 1) * 128; ++i) amax = std::max(amax, std::fabs(double(xs[i])));
    int e;
    const double frac = std::frexp(double(s[b]), &e);
    fit.check(frac == 0.5 && amax <= t.max_finite * s[b] &&
                  (amax == 0 || s[b] == std::ldexp(1.0, -126) || t.max_finite * s[b] < 2 * amax),
              [&] { return "block " + std::to_string(b) + " scale " + show(s[b]); });
  }
  for (std::size_t i = 0; i < xs.size(); ++i) {
    const double scale = s[i / 128];
    const double y = std::fabs(double(xs[i])) / scale;
    const double half_ulp = y >= t.min_normal ? std::ldexp(1.0, std::ilogb(y) - m - 1)
                                              : t.min_subnormal / 2;
    const double err = std::fabs(double(xs[i]) - double(x[i]));
    c.check(err <= scale * half_ulp, [&] {
      return show(xs[i]) + " -> " + show(x[i]) + " (scale " + show(float(scale)) + ")";
    });
    if (y >= t.min_normal)
      rel.check(err <= std::ldexp(std::fabs(double(xs[i])), -m - 1),
                [&] { return show(xs[i]) + " -> " + show(x[i]); });
  }
  c.report();
  rel.report();
  fit.report();
}

BOOST_AUTO_TEST_CASE_TEMPLATE(representable_values_are_exact, Fp8, Fp8Types) {
  // Blocks of fp8 values times 2^j, each block holding +-max * 2^j so the
  // scale is exactly 2^j: dequantization must give back every x exactly,
  // subnormal fp8 values included.
  const RefTable& t = table<Fp8>();
  std::mt19937 rng(3);
  std::vector<float> xs;
  for (int j = -120; j <= 100; j += 11) {
    xs.push_back(float(std::ldexp((j & 1) ? -t.max_finite : t.max_finite, j)));
    for (int i = 1; i < 64; ++i) {
      const double v = t.value[rng() % t.value.size()];
      xs.push_back(float(std::ldexp((rng() & 1) ? -v : v, j)));
    }
  }
  const DeviceQuant<Fp8> d = device_round_trip<Fp8>(xs, 64, false);
  const std::vector<float> x = to_host(d.x);
  const std::vector<float> s = to_host(d.scales);
  Checker c(fmt_name<Fp8>() + " representable values round-trip exactly");
  int j = -120;
  for (std::size_t b = 0; b < s.size(); ++b, j += 11)
    c.check(s[b] == float(std::ldexp(1.0, j)), [&] { return "scale " + show(s[b]); });
  for (std::size_t i = 0; i < xs.size(); ++i)
    c.check(float_bits(x[i]) == float_bits(xs[i]), [&] { return show(xs[i]) + " -> " + show(x[i]); });
  c.report();
  check_against_reference<Fp8>(xs, 64, "representable values");
}

BOOST_AUTO_TEST_CASE_TEMPLATE(zero_blocks_and_partial_last_block, Fp8, Fp8Types) {
  // Block 1 all +0, block 2 all -0, the rest random; then a partial last block
  // of 5 elements whose scale must come from those 5 alone.
  std::vector<float> xs = varied_blocks(4 * 128, 128, 21);
  for (int i = 0; i < 128; ++i) xs[128 + i] = 0.0f;
  for (int i = 0; i < 128; ++i) xs[256 + i] = -0.0f;
  for (float v : {1e-3f, -2e-3f, 0.0f, 3e-3f, -1e-4f}) xs.push_back(v);
  const DeviceQuant<Fp8> d = device_round_trip<Fp8>(xs, 128, false);
  const std::vector<Fp8> q = to_host(d.q);
  const std::vector<float> s = to_host(d.scales);
  const std::vector<float> x = to_host(d.x);
  BOOST_REQUIRE(s.size() == 5u);
  BOOST_CHECK(s[1] == 1.0f);
  BOOST_CHECK(s[2] == 1.0f);
  for (int i = 0; i < 128; ++i) {
    BOOST_CHECK(q[128 + i].bits == 0x00u);
    BOOST_CHECK(q[256 + i].bits == 0x80u);
    BOOST_CHECK(float_bits(x[128 + i]) == 0x00000000u);
    BOOST_CHECK(float_bits(x[256 + i]) == 0x80000000u);
  }
  // amax of the last block is 3e-3: the scale is the power of two that puts it
  // in (max/2, max].
  const double fmax = table<Fp8>().max_finite;
  BOOST_CHECK(3e-3f <= fmax * s[4]);
  BOOST_CHECK(3e-3f > fmax * s[4] / 2);
  check_against_reference<Fp8>(xs, 128, "zero blocks + partial last block");
  // Fewer elements than one block, and an all-zero input.
  check_against_reference<Fp8>(std::vector<float>{0.5f, -7.0f, 1e-6f}, 128, "single partial block");
  check_against_reference<Fp8>(std::vector<float>(300, 0.0f), 128, "all zero");
}

BOOST_AUTO_TEST_CASE_TEMPLATE(scale_edge_cases, Fp8, Fp8Types) {
  // amax exactly max * 2^j, one float ulp above it, float-subnormal and tiny
  // amax (scale clamped at 2^-126), amax near FLT_MAX; block size 1 so each
  // value is its own block.
  const float fmax = float(table<Fp8>().max_finite);
  std::vector<float> xs{fmax, std::nextafter(fmax, 0.0f), std::nextafter(fmax, FLT_MAX),
                        fmax / 2, std::nextafter(fmax / 2, FLT_MAX), 1.0f, -1.0f,
                        1e-40f, -1e-45f, FLT_MIN, 1e-36f, 1e30f, -1e38f, 3e38f,
                        fmax * 0x1p-60f, std::nextafter(fmax * 0x1p-60f, FLT_MAX)};
  check_against_reference<Fp8>(xs, 1, "scale edge cases");
  const DeviceQuant<Fp8> d = device_round_trip<Fp8>(xs, 1, false);
  const std::vector<float> s = to_host(d.scales);
  BOOST_CHECK(s[0] == 1.0f);
  BOOST_CHECK(s[1] == 1.0f);
  BOOST_CHECK(s[2] == 2.0f);
  BOOST_CHECK(s[3] == 0.5f);
  BOOST_CHECK(s[4] == 1.0f);
  BOOST_CHECK(s[7] == 0x1p-126f);  // clamped
  BOOST_CHECK(s[8] == 0x1p-126f);
}

BOOST_AUTO_TEST_CASE_TEMPLATE(nan_and_inf_stay_non_finite, Fp8, Fp8Types) {
  // Documented: non-finite values do not enter amax; NaN -> NaN; +-inf ->
  // +-inf for E5M2 and NaN for E4M3 (no infinity); blocks of only NaN/inf
  // get scale 1.
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> xs{1.0f, nan, 2.0f, inf, -inf, -nan, 3.0f, 0.25f,  // block 0
                        nan, inf, -inf, nan, nan, inf, -inf, nan};      // block 1
  const bool e4m3 = std::is_same<Fp8, kshard::float8_e4m3_t>::value;
  const DeviceQuant<Fp8> d = device_round_trip<Fp8>(xs, 8, false);
  const std::vector<Fp8> q = to_host(d.q);
  const std::vector<float> s = to_host(d.scales);
  const std::vector<float> x = to_host(d.x);
  BOOST_CHECK(s[0] == float(ref_scale(3.0, table<Fp8>().max_finite)));
  BOOST_CHECK(s[1] == 1.0f);
  for (std::size_t i = 0; i < xs.size(); ++i) {
    if (std::isnan(xs[i])) {
      BOOST_CHECK_MESSAGE(std::isnan(x[i]), "element " << i);
      BOOST_CHECK_MESSAGE(table<Fp8>().fmt.is_nan(q[i].bits), "element " << i);
    } else if (std::isinf(xs[i])) {
      if (e4m3) {
        BOOST_CHECK_MESSAGE(std::isnan(x[i]), "element " << i);
      } else {
        BOOST_CHECK_MESSAGE(float_bits(x[i]) == float_bits(xs[i]), "element " << i);
      }
    } else {
      BOOST_CHECK_MESSAGE(x[i] == xs[i], "element " << i);  // small integers and 1/4 are exact
    }
  }
  check_against_reference<Fp8>(xs, 8, "NaN/inf");
}

BOOST_AUTO_TEST_CASE_TEMPLATE(shards_concatenate, Fp8, Fp8Types) {
  // The FSDP use: 4 ranks, each quantizing its own shard (3 blocks of 128);
  // the concatenation of their q / scales equals quantizing the whole buffer,
  // and dequantizing that concatenation gives the full buffer's result.
  const int block = 128, blocks_per_shard = 3, ranks = 4;
  const std::size_t shard = std::size_t(block) * blocks_per_shard;
  const std::vector<float> xs = varied_blocks(shard * ranks, block, 77);
  const DeviceQuant<Fp8> whole = device_round_trip<Fp8>(xs, block, false);
  Kokkos::View<Fp8*> q_cat("q_cat", xs.size());
  Kokkos::View<float*> s_cat("s_cat", std::size_t(blocks_per_shard) * ranks);
  const Kokkos::View<float*> x = to_device(xs);
  for (int r = 0; r < ranks; ++r) {
    const auto elems = std::make_pair(r * shard, (r + 1) * shard);
    const auto blks = std::make_pair(std::size_t(r) * blocks_per_shard,
                                     std::size_t(r + 1) * blocks_per_shard);
    kshard::fp8_quantize(Kokkos::subview(x, elems), Kokkos::subview(q_cat, elems),
                         Kokkos::subview(s_cat, blks), block);
  }
  Kokkos::View<float*> x_cat("x_cat", xs.size());
  kshard::fp8_dequantize(q_cat, s_cat, x_cat, block);
  const auto qw = to_host(whole.q), qc = to_host(q_cat);
  const auto sw = to_host(whole.scales), sc = to_host(s_cat);
  const auto xw = to_host(whole.x), xc = to_host(x_cat);
  Checker c(fmt_name<Fp8>() + " per-shard quantization concatenates");
  for (std::size_t i = 0; i < xs.size(); ++i) {
    c.check(qw[i].bits == qc[i].bits && same_float(xw[i], xc[i]),
            [&] { return "element " + std::to_string(i); });
  }
  for (std::size_t b = 0; b < sw.size(); ++b)
    c.check(float_bits(sw[b]) == float_bits(sc[b]), [&] { return "scale " + std::to_string(b); });
  c.report();
}

BOOST_AUTO_TEST_CASE_TEMPLATE(bad_sizes_throw, Fp8, Fp8Types) {
  Kokkos::View<float*> x("x", 300);
  Kokkos::View<Fp8*> q("q", 300), q_short("q", 299);
  Kokkos::View<float*> s("s", 3), s_short("s", 2), s_long("s", 4);
  auto expect_error = [](auto&& call, const std::string& needle) {
    try {
      call();
      BOOST_ERROR("no kshard::Error for " << needle);
    } catch (const kshard::Error& e) {
      BOOST_CHECK(!e.expected().empty());
      BOOST_CHECK_MESSAGE(e.problem().find(needle) != std::string::npos, e.what());
    }
  };
  kshard::fp8_quantize(x, q, s, 128);  // the valid call
  kshard::fp8_dequantize(q, s, x, 128);
  expect_error([&] { kshard::fp8_quantize(x, q_short, s, 128); }, "299");
  expect_error([&] { kshard::fp8_quantize(x, q, s_short, 128); }, "scales");
  expect_error([&] { kshard::fp8_quantize(x, q, s_long, 128); }, "scales");
  expect_error([&] { kshard::fp8_quantize(x, q, s, 0); }, "block size 0");
  expect_error([&] { kshard::fp8_quantize(x, q, s, -5); }, "block size -5");
  expect_error([&] { kshard::fp8_quantize(x, q, s, 64); }, "scales");  // 300 / 64 needs 5
  expect_error([&] { kshard::fp8_dequantize(q_short, s, x, 128); }, "299");
  expect_error([&] { kshard::fp8_dequantize(q, s_short, x, 128); }, "scales");
  expect_error([&] { kshard::fp8_dequantize(q, s, x, 0); }, "block size");
  // Empty buffers are fine and do nothing.
  kshard::fp8_quantize(Kokkos::View<float*>("e", 0), Kokkos::View<Fp8*>("eq", 0),
                       Kokkos::View<float*>("es", 0));
  kshard::fp8_dequantize(Kokkos::View<Fp8*>("eq", 0), Kokkos::View<float*>("es", 0),
                         Kokkos::View<float*>("e", 0));
}

BOOST_AUTO_TEST_SUITE_END()
