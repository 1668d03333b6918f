#pragma once
// Reference model of the storage formats, written from the format
// definitions and deliberately sharing nothing with kshard/numeric/convert.hpp:
// decoding is exact double arithmetic (std::ldexp) on the sign / exponent /
// mantissa fields, and encoding searches the sorted table of every finite
// value of the format, compares against the exact midpoint of the two
// neighbours (a double, so the comparison itself is exact), breaks ties
// towards the even bit pattern, and then applies the overflow rule:
// bf16/f16 round to inf exactly like IEEE (a virtual next value one ulp past
// the max stands for inf, so max + half ulp ties to the even inf pattern),
// fp8 saturates to the max finite value (also for +-inf).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

namespace kshard_test {

struct RefFormat {
  const char* name;
  int ebits;
  int mbits;
  bool fn;        // E4M3 "fn": no infinities, only S.1111.111 is NaN
  bool saturate;  // overflow (and inf) -> max finite instead of inf

  int width() const { return 1 + ebits + mbits; }
  std::uint32_t count() const { return 1u << width(); }
  std::uint32_t sign_bit() const { return 1u << (ebits + mbits); }
  int bias() const { return (1 << (ebits - 1)) - 1; }
  std::uint32_t exp_field(std::uint32_t p) const { return (p >> mbits) & ((1u << ebits) - 1); }
  std::uint32_t man_field(std::uint32_t p) const { return p & ((1u << mbits) - 1); }
  bool exp_all_ones(std::uint32_t p) const { return exp_field(p) == (1u << ebits) - 1; }

  bool is_nan(std::uint32_t p) const {
    if (fn) return exp_all_ones(p) && man_field(p) == (1u << mbits) - 1;
    return exp_all_ones(p) && man_field(p) != 0;
  }
  bool is_inf(std::uint32_t p) const { return !fn && exp_all_ones(p) && man_field(p) == 0; }
  /// A NaN whose quiet bit (top mantissa bit) is set; E4M3 has one NaN only.
  bool is_quiet_nan(std::uint32_t p) const {
    return is_nan(p) && (fn || ((man_field(p) >> (mbits - 1)) & 1u));
  }
  std::uint32_t inf_pattern() const { return ((1u << ebits) - 1) << mbits; }
};

inline const RefFormat ref_bf16{"bf16", 8, 7, false, false};
inline const RefFormat ref_f16{"f16", 5, 10, false, false};
inline const RefFormat ref_e4m3{"e4m3", 4, 3, true, true};
inline const RefFormat ref_e5m2{"e5m2", 5, 2, false, true};

/// Exact value of a bit pattern (NaN for NaN patterns, +-inf for infinities).
inline double ref_decode(const RefFormat& f, std::uint32_t p) {
  const bool neg = (p & f.sign_bit()) != 0;
  if (f.is_nan(p)) return neg ? -std::nan("") : std::nan("");
  if (f.is_inf(p)) return neg ? -HUGE_VAL : HUGE_VAL;
  const int ex = int(f.exp_field(p));
  const double m = double(f.man_field(p));
  double mag;
  if (ex == 0)  // subnormal: 0.m * 2^(1 - bias)
    mag = std::ldexp(m, 1 - f.bias() - f.mbits);
  else  // normal: 1.m * 2^(ex - bias)
    mag = std::ldexp(std::ldexp(1.0, f.mbits) + m, ex - f.bias() - f.mbits);
  return neg ? -mag : mag;
}

/// Sorted table of the non-negative finite values and their patterns.
struct RefTable {
  RefFormat fmt;
  std::vector<double> value;
  std::vector<std::uint32_t> pattern;
  double max_finite = 0;
  std::uint32_t max_pattern = 0;
  double min_subnormal = 0;
  double min_normal = 0;
  double overflow_value = 0;  // one ulp past max: stands for inf when rounding

  explicit RefTable(const RefFormat& f) : fmt(f) {
    std::vector<std::pair<double, std::uint32_t>> vp;
    for (std::uint32_t p = 0; p < f.sign_bit(); ++p) {
      const double v = ref_decode(f, p);
      if (std::isfinite(v)) vp.emplace_back(v, p);
    }
    std::sort(vp.begin(), vp.end());
    for (std::size_t i = 1; i < vp.size(); ++i)
      if (!(vp[i - 1].first < vp[i].first)) throw std::logic_error("reference table not strictly increasing");
    for (const auto& [v, p] : vp) {
      value.push_back(v);
      pattern.push_back(p);
    }
    max_finite = value.back();
    max_pattern = pattern.back();
    min_subnormal = value[1];
    min_normal = std::ldexp(1.0, 1 - f.bias());
    overflow_value = 2 * max_finite - value[value.size() - 2];
  }

  /// Neighbour pair for a finite magnitude a in [0, overflow_value): returns
  /// index i with value[i] <= a < value[i+1] (value[size] = overflow_value).
  std::size_t bracket_binary(double a) const {
    return std::size_t(std::upper_bound(value.begin(), value.end(), a) - value.begin()) - 1;
  }
  /// Same by linear scan (the brute force the binary search is checked against).
  std::size_t bracket_linear(double a) const {
    std::size_t i = 0;
    while (i + 1 < value.size() && value[i + 1] <= a) ++i;
    return i;
  }

  /// Expected encoding of a non-NaN value (a float, or any double: the fp8
  /// block tests encode x / scale exactly). linear: use the brute-force scan.
  std::uint32_t encode(double x, bool linear = false) const {
    const std::uint32_t sign = std::signbit(x) ? fmt.sign_bit() : 0u;
    const double a = std::fabs(x);
    const std::uint32_t overflow = fmt.saturate ? max_pattern : fmt.inf_pattern();
    if (std::isinf(a)) return sign | overflow;
    if (fmt.saturate && a >= max_finite) return sign | max_pattern;
    if (!fmt.saturate && a >= overflow_value) return sign | overflow;
    const std::size_t i = linear ? bracket_linear(a) : bracket_binary(a);
    const double lo = value[i];
    if (a == lo) return sign | pattern[i];
    const bool top = i + 1 == value.size();  // between max and the virtual inf
    const double hi = top ? overflow_value : value[i + 1];
    const std::uint32_t hi_pattern = top ? fmt.inf_pattern() : pattern[i + 1];
    const double mid = lo + (hi - lo) / 2;  // exact: few significant bits
    std::uint32_t r;
    if (a < mid)
      r = pattern[i];
    else if (a > mid)
      r = hi_pattern;
    else
      r = (hi_pattern & 1u) ? pattern[i] : hi_pattern;
    return sign | r;
  }

  /// Every finite value of the format with both signs (including -0).
  std::vector<float> all_finite_values() const {
    std::vector<float> out;
    for (double v : value) {
      out.push_back(float(v));
      out.push_back(-float(v));
    }
    return out;
  }
};

inline std::uint32_t float_bits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}
inline float bits_float(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

inline std::string hex(std::uint32_t v, int digits) {
  static const char* d = "0123456789abcdef";
  std::string s = "0x";
  for (int i = digits - 1; i >= 0; --i) s += d[(v >> (4 * i)) & 0xF];
  return s;
}

}  // namespace kshard_test
