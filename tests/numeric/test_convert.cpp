// Exhaustive checks of kshard/numeric/convert.hpp against the independent
// reference model of reference.hpp. Every conversion runs inside a Kokkos
// kernel on the default execution space (device_convert.hpp), so a CUDA build
// checks the device code path with the same test.
#include <boost/mpl/list.hpp>
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "checker.hpp"
#include "device_convert.hpp"
#include "kshard/dtype.hpp"
#include "kshard/numeric/convert.hpp"
#include "reference.hpp"

using namespace kshard_test;

namespace {

template <class T>
const RefFormat& ref_format();
template <>
const RefFormat& ref_format<kshard::bfloat16_t>() {
  return ref_bf16;
}
template <>
const RefFormat& ref_format<kshard::float16_t>() {
  return ref_f16;
}
template <>
const RefFormat& ref_format<kshard::float8_e4m3_t>() {
  return ref_e4m3;
}
template <>
const RefFormat& ref_format<kshard::float8_e5m2_t>() {
  return ref_e5m2;
}

template <class T>
const RefTable& ref_table() {
  static const RefTable t(ref_format<T>());
  return t;
}

template <class T>
std::string dname() {
  return kshard::dtype_name(kshard::dtype_of<T>::value);
}

std::string describe_float(float x) {
  char buf[96];
  std::snprintf(buf, sizeof buf, "%.9g (%a, bits %s)", double(x), double(x),
                hex(float_bits(x), 8).c_str());
  return buf;
}

template <class T>
int digits() {
  return ref_format<T>().width() / 4;
}

/// Encodes xs on the device and compares with the reference; NaN inputs must
/// give a quiet NaN of the format. fp8 always uses the brute-force scan.
template <class T>
void check_encode(const std::vector<float>& xs, Checker& c) {
  const RefFormat& f = ref_format<T>();
  const RefTable& t = ref_table<T>();
  const bool linear = f.width() == 8;
  const std::vector<std::uint32_t> got = device_encode<T>(xs);
  for (std::size_t i = 0; i < xs.size(); ++i) {
    const float x = xs[i];
    if (std::isnan(x)) {
      c.check(got[i] < f.count() && f.is_quiet_nan(got[i]), [&] {
        return "NaN " + describe_float(x) + " -> " + hex(got[i], digits<T>()) + ", want quiet NaN";
      });
      continue;
    }
    const std::uint32_t want = t.encode(x, linear);
    c.check(got[i] == want, [&] {
      return describe_float(x) + " -> " + hex(got[i], digits<T>()) + ", want " +
             hex(want, digits<T>());
    });
  }
}

float next_up(float x) { return std::nextafter(x, std::numeric_limits<float>::infinity()); }
float next_down(float x) { return std::nextafter(x, -std::numeric_limits<float>::infinity()); }

void push_both_signs(std::vector<float>& v, float x) {
  v.push_back(x);
  v.push_back(-x);
}

/// Every float pattern in [lo, hi) visited with the given stride, both signs.
std::vector<float> float_sweep(std::uint32_t lo, std::uint32_t hi, std::uint32_t stride) {
  std::vector<float> v;
  for (std::uint64_t p = lo; p < hi; p += stride) push_both_signs(v, bits_float(std::uint32_t(p)));
  return v;
}

using Formats = boost::mpl::list<kshard::bfloat16_t, kshard::float16_t, kshard::float8_e4m3_t,
                                 kshard::float8_e5m2_t>;

}  // namespace

BOOST_AUTO_TEST_SUITE(numeric_convert)

BOOST_AUTO_TEST_CASE(reference_model_sanity) {
  BOOST_TEST_MESSAGE("conversions run on " << Kokkos::DefaultExecutionSpace::name());
  // The reference itself, against facts from the format definitions.
  BOOST_CHECK(ref_table<kshard::bfloat16_t>().max_finite == std::ldexp(255.0, 120));
  BOOST_CHECK(ref_table<kshard::bfloat16_t>().min_subnormal == std::ldexp(1.0, -133));
  BOOST_CHECK(ref_table<kshard::bfloat16_t>().overflow_value == std::ldexp(1.0, 128));
  BOOST_CHECK(ref_table<kshard::float16_t>().max_finite == 65504.0);
  BOOST_CHECK(ref_table<kshard::float16_t>().min_subnormal == std::ldexp(1.0, -24));
  BOOST_CHECK(ref_table<kshard::float16_t>().min_normal == std::ldexp(1.0, -14));
  BOOST_CHECK(ref_table<kshard::float16_t>().overflow_value == 65536.0);
  BOOST_CHECK(ref_table<kshard::float8_e4m3_t>().max_finite == 448.0);
  BOOST_CHECK(ref_table<kshard::float8_e4m3_t>().min_subnormal == std::ldexp(1.0, -9));
  BOOST_CHECK(ref_table<kshard::float8_e4m3_t>().min_normal == std::ldexp(1.0, -6));
  BOOST_CHECK(ref_table<kshard::float8_e5m2_t>().max_finite == 57344.0);
  BOOST_CHECK(ref_table<kshard::float8_e5m2_t>().min_subnormal == std::ldexp(1.0, -16));
  BOOST_CHECK(ref_table<kshard::float8_e4m3_t>().value.size() == 127u);  // 0 .. 0x7E
  BOOST_CHECK(ref_table<kshard::float8_e5m2_t>().value.size() == 124u);  // 0 .. 0x7B
  BOOST_CHECK(ref_table<kshard::float16_t>().value.size() == 31744u);
  BOOST_CHECK(ref_table<kshard::bfloat16_t>().value.size() == 32640u);
  BOOST_CHECK(kshard::finite_max<kshard::float8_e4m3_t>::value ==
             float(ref_table<kshard::float8_e4m3_t>().max_finite));
  BOOST_CHECK(kshard::finite_max<kshard::float8_e5m2_t>::value ==
             float(ref_table<kshard::float8_e5m2_t>().max_finite));
  BOOST_CHECK(kshard::finite_max<kshard::float16_t>::value ==
             float(ref_table<kshard::float16_t>().max_finite));
  // Hand-checked encodings (OCP FP8 spec tables, IEEE 754 binary16).
  BOOST_CHECK(ref_table<kshard::float8_e4m3_t>().encode(1.0f) == 0x38u);
  BOOST_CHECK(ref_table<kshard::float8_e4m3_t>().encode(-448.0f) == 0xFEu);
  BOOST_CHECK(ref_table<kshard::float8_e4m3_t>().encode(1e9f) == 0x7Eu);
  BOOST_CHECK(ref_table<kshard::float8_e5m2_t>().encode(1.0f) == 0x3Cu);
  BOOST_CHECK(ref_table<kshard::float16_t>().encode(65520.0f) == 0x7C00u);  // max + half ulp
  BOOST_CHECK(ref_table<kshard::float16_t>().encode(65519.996f) == 0x7BFFu);
  BOOST_CHECK(ref_table<kshard::float16_t>().encode(1.0f + 0x1p-11f) == 0x3C00u);  // tie, even
  BOOST_CHECK(ref_table<kshard::float16_t>().encode(1.0f + 0x3p-11f) == 0x3C02u);  // tie, even
  BOOST_CHECK(ref_table<kshard::float16_t>().encode(0x1p-25f) == 0x0000u);  // tie to zero
  BOOST_CHECK(ref_table<kshard::float16_t>().encode(-0x1.000002p-25f) == 0x8001u);
  BOOST_CHECK(ref_table<kshard::bfloat16_t>().encode(FLT_MAX) == 0x7F80u);
}

BOOST_AUTO_TEST_CASE(reference_binary_search_matches_brute_force) {
  // The 16-bit encoders use a binary search of the sorted table for speed;
  // check it against the linear scan on a sample spread over the whole range.
  std::mt19937 rng(7);
  for (const RefTable* t : {&ref_table<kshard::bfloat16_t>(), &ref_table<kshard::float16_t>()}) {
    Checker c(std::string("bracket search ") + t->fmt.name);
    for (int i = 0; i < 8000; ++i) {
      float x = bits_float(rng() & 0x7FFFFFFFu);
      if (!std::isfinite(x) || double(x) >= t->overflow_value) continue;
      c.check(t->encode(x, false) == t->encode(x, true), [&] { return describe_float(x); });
    }
    c.report();
  }
}

BOOST_AUTO_TEST_CASE_TEMPLATE(decode_every_pattern, T, Formats) {
  const RefFormat& f = ref_format<T>();
  std::vector<std::uint32_t> pats(f.count());
  for (std::uint32_t p = 0; p < f.count(); ++p) pats[p] = p;
  const std::vector<float> got = device_decode<T>(pats);
  Checker c("decode every " + dname<T>() + " pattern");
  for (std::uint32_t p = 0; p < f.count(); ++p) {
    const double want = ref_decode(f, p);
    if (std::isnan(want)) {
      c.check(std::isnan(got[p]) && (float_bits(got[p]) & 0x00400000u), [&] {
        return hex(p, digits<T>()) + " -> " + describe_float(got[p]) + ", want quiet NaN";
      });
      continue;
    }
    // Every value of these formats is a float, so the comparison is bitwise
    // (and tells -0 from +0).
    c.check(double(float(want)) == want && float_bits(got[p]) == float_bits(float(want)), [&] {
      return hex(p, digits<T>()) + " -> " + describe_float(got[p]) + ", want " +
             describe_float(float(want));
    });
  }
  c.report();
}

BOOST_AUTO_TEST_CASE_TEMPLATE(decode_encode_round_trip, T, Formats) {
  // Identity for every non-NaN pattern, with the one documented exception:
  // E5M2 +-inf encode back to +-max finite (satfinite).
  const RefFormat& f = ref_format<T>();
  std::vector<std::uint32_t> pats;
  for (std::uint32_t p = 0; p < f.count(); ++p)
    if (!f.is_nan(p)) pats.push_back(p);
  const std::vector<std::uint32_t> back = device_encode<T>(device_decode<T>(pats));
  Checker c(dname<T>() + " decode -> encode round trip");
  for (std::size_t i = 0; i < pats.size(); ++i) {
    std::uint32_t want = pats[i];
    if (f.saturate && f.is_inf(want)) want = (want & f.sign_bit()) | ref_table<T>().max_pattern;
    c.check(back[i] == want, [&] {
      return hex(pats[i], digits<T>()) + " -> " + hex(back[i], digits<T>()) + ", want " +
             hex(want, digits<T>());
    });
  }
  c.report();
}

BOOST_AUTO_TEST_CASE_TEMPLATE(nan_stays_nan, T, Formats) {
  const RefFormat& f = ref_format<T>();
  // Every NaN pattern decodes to NaN (checked above) and encodes back to NaN.
  std::vector<std::uint32_t> pats;
  for (std::uint32_t p = 0; p < f.count(); ++p)
    if (f.is_nan(p)) pats.push_back(p);
  BOOST_CHECK(pats.size() == (f.fn ? 2u : 2u * ((1u << f.mbits) - 1)));
  const std::vector<float> dec = device_decode<T>(pats);
  Checker c(dname<T>() + " NaN patterns and float NaNs encode to quiet NaN");
  std::vector<float> nans(dec);
  // Float NaNs: quiet and signalling, assorted payloads (including payloads
  // whose top bits would look like a finite value if naively truncated), both signs.
  for (std::uint32_t payload : {0x400000u, 0x000001u, 0x200000u, 0x7FFFFFu, 0x00FFFFu, 0x000100u,
                                0x400001u, 0x3FFFFFu, 0x010000u, 0x008000u})
    push_both_signs(nans, bits_float(0x7F800000u | payload));
  check_encode<T>(nans, c);
  c.report();
}

BOOST_AUTO_TEST_CASE_TEMPLATE(encode_exact_values, T, Formats) {
  const RefTable& t = ref_table<T>();
  std::vector<float> xs;
  std::vector<std::uint32_t> want;
  for (std::size_t i = 0; i < t.value.size(); ++i) {
    xs.push_back(float(t.value[i]));
    want.push_back(t.pattern[i]);
    xs.push_back(-float(t.value[i]));
    want.push_back(t.pattern[i] | t.fmt.sign_bit());
  }
  const std::vector<std::uint32_t> got = device_encode<T>(xs);
  Checker c("encode every finite " + dname<T>() + " value");
  for (std::size_t i = 0; i < xs.size(); ++i)
    c.check(got[i] == want[i], [&] {
      return describe_float(xs[i]) + " -> " + hex(got[i], digits<T>()) + ", want " +
             hex(want[i], digits<T>());
    });
  c.report();
  Checker r("encode exact values vs reference " + dname<T>());
  check_encode<T>(xs, r);
  r.report();
}

BOOST_AUTO_TEST_CASE_TEMPLATE(encode_midpoints_and_neighbours, T, Formats) {
  // Ties between every pair of neighbours (0 and the smallest subnormal, the
  // subnormal/normal boundary, max and the value one ulp past it) and the
  // floats one ulp on either side of each tie; also one ulp around each value.
  const RefTable& t = ref_table<T>();
  std::vector<float> xs;
  std::size_t ties = 0;
  Checker exact("midpoints of " + dname<T>() + " neighbours are floats");
  for (std::size_t i = 0; i < t.value.size(); ++i) {
    const double lo = t.value[i];
    const double hi = i + 1 < t.value.size() ? t.value[i + 1] : t.overflow_value;
    const float mid = float(lo + (hi - lo) / 2);
    exact.check(double(mid) == lo + (hi - lo) / 2, [&] { return describe_float(mid); });
    for (float x : {mid, next_down(mid), next_up(mid), next_down(float(lo)), next_up(float(lo))})
      push_both_signs(xs, x);
    ++ties;
  }
  exact.report();
  Checker c("encode " + std::to_string(ties) + " " + dname<T>() +
            " midpoints (ties) +- 1 float ulp, values +- 1 ulp");
  check_encode<T>(xs, c);
  c.report();
}

BOOST_AUTO_TEST_CASE_TEMPLATE(encode_overflow_and_specials, T, Formats) {
  const RefTable& t = ref_table<T>();
  const float inf = std::numeric_limits<float>::infinity();
  const float max = float(t.max_finite);
  const float ulp_at_max = float(t.overflow_value - t.max_finite);
  std::vector<float> xs{0.0f, -0.0f, inf, -inf, FLT_MAX, -FLT_MAX, FLT_MIN, -FLT_MIN};
  for (float x : {max, next_up(max), max + ulp_at_max / 4, max + ulp_at_max / 2,
                  next_down(max + ulp_at_max / 2), next_up(max + ulp_at_max / 2),
                  max + ulp_at_max, max * 2, max * 1024, 1e30f, next_down(FLT_MAX)})
    if (std::isfinite(x)) push_both_signs(xs, x);
  // Dense sweep from the max up to 4x the max (or FLT_MAX for bf16) and
  // beyond, every float pattern with a stride.
  const std::uint32_t from = float_bits(max);
  const std::uint32_t to =
      t.max_finite * 4 < double(FLT_MAX) ? float_bits(max * 4) : float_bits(FLT_MAX) + 1;
  const std::vector<float> sweep = float_sweep(from, to, std::max(1u, (to - from) / 200000u) | 1u);
  xs.insert(xs.end(), sweep.begin(), sweep.end());
  const std::vector<float> far = float_sweep(float_bits(max), 0x7F800000u, 9973u);
  xs.insert(xs.end(), far.begin(), far.end());

  Checker c("encode " + dname<T>() + " signed zeros, +-inf, overflow region");
  check_encode<T>(xs, c);
  c.report();

  // The documented rules, stated directly (not only through the reference).
  const std::vector<std::uint32_t> got = device_encode<T>({0.0f, -0.0f, inf, -inf, FLT_MAX});
  const std::uint32_t sign = t.fmt.sign_bit();
  BOOST_CHECK(got[0] == 0u);
  BOOST_CHECK(got[1] == sign);
  const std::uint32_t over = t.fmt.saturate ? t.max_pattern : t.fmt.inf_pattern();
  BOOST_CHECK(got[2] == over);
  BOOST_CHECK(got[3] == (over | sign));
  BOOST_CHECK(got[4] == over);
}

BOOST_AUTO_TEST_CASE_TEMPLATE(encode_subnormal_range, T, Formats) {
  // Every float from 0 up to twice the format's smallest normal (about 1M of
  // them with a stride), including float subnormals, both signs.
  const RefTable& t = ref_table<T>();
  const std::uint32_t to = float_bits(float(2 * t.min_normal));
  std::vector<float> xs = float_sweep(0, to, std::max(1u, to / 500000u) | 1u);
  const std::vector<float> tiny = float_sweep(0, 0x00800000u, 4099u);  // float subnormals
  xs.insert(xs.end(), tiny.begin(), tiny.end());
  Checker c("encode " + dname<T>() + " subnormal range");
  check_encode<T>(xs, c);
  c.report();
}

BOOST_AUTO_TEST_CASE_TEMPLATE(encode_random_floats, T, Formats) {
  // 4M random floats (fixed seed): 1M uniform random bit patterns, 3M with
  // an exponent spread over the format's range (two binades beyond either
  // end) and a random 23-bit mantissa.
  const RefFormat& f = ref_format<T>();
  std::mt19937 rng(20261202u + std::uint32_t(f.width() * 131 + f.mbits));
  const int emin = 1 - f.bias() - f.mbits - 2;  // below the smallest subnormal
  const int emax = ((1 << f.ebits) - 1) - f.bias() + 2;
  std::vector<float> xs;
  xs.reserve(4u << 20);
  for (int i = 0; i < (1 << 20); ++i) xs.push_back(bits_float(rng()));  // includes NaN/inf
  for (int i = 0; i < 3 << 20; ++i) {
    const std::uint32_t r = rng();
    int e = emin + int(rng() % std::uint32_t(emax - emin + 1));
    if (e < -149) e = -149;
    if (e > 127) e = 127;
    const float mag = float(std::ldexp(1.0 + std::ldexp(double(r & 0x7FFFFFu), -23), e));
    xs.push_back((r >> 31) ? -mag : mag);
  }
  Checker c("encode " + std::to_string(xs.size()) + " random floats to " + dname<T>());
  check_encode<T>(xs, c);
  c.report();
}

BOOST_AUTO_TEST_CASE_TEMPLATE(encode_strided_sweep_of_all_floats, T, Formats) {
  // A strided walk over all 2^32 float patterns (NaNs included): 2^32/127
  // ~ 34M floats for bf16 (an odd stride, so the 16 rounded-away bits take
  // every residue), 2^32/4093 ~ 1M for the others.
  const std::uint32_t stride = std::is_same<T, kshard::bfloat16_t>::value ? 127u : 4093u;
  Checker c("encode strided sweep of all float patterns to " + dname<T>());
  const std::uint64_t chunk = std::uint64_t(1) << 22;
  std::vector<float> xs;
  xs.reserve(chunk);
  for (std::uint64_t p = 0; p < (std::uint64_t(1) << 32); p += stride) {
    xs.push_back(bits_float(std::uint32_t(p)));
    if (xs.size() == chunk) {
      check_encode<T>(xs, c);
      xs.clear();
    }
  }
  check_encode<T>(xs, c);
  c.report();
}

BOOST_AUTO_TEST_CASE(float_identity_conversions) {
  for (float x : {0.0f, -0.0f, 1.5f, -FLT_MAX, FLT_MIN, 1e-45f}) {
    BOOST_CHECK(float_bits(kshard::to_float(x)) == float_bits(x));
    BOOST_CHECK(float_bits(kshard::from_float<float>(x)) == float_bits(x));
  }
}

BOOST_AUTO_TEST_SUITE_END()
