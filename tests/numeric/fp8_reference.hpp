#pragma once
// The scalar reference of power-of-two fp8 scaling, written from the
// documented recipe (kernels/fp8_block.hpp, kernels/fp8_tensor.hpp): scale =
// smallest 2^k (k >= -126) with amax <= finite_max * 2^k, found by a plain
// loop over k in exact double arithmetic; q = nearest fp8 value of x / scale
// by the reference model's table search (reference.hpp, independent of
// convert.hpp); x' = q * scale. A per-tensor scale is one block of the whole
// tensor.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "kshard/numeric/types.hpp"
#include "reference.hpp"

namespace kshard_test {

template <class Fp8>
inline const RefTable& table() {
  static const RefTable e4m3(ref_e4m3);
  static const RefTable e5m2(ref_e5m2);
  return std::is_same<Fp8, kshard::float8_e4m3_t>::value ? e4m3 : e5m2;
}

// ---- scalar reference ------------------------------------------------------

struct RefQuant {
  std::vector<std::uint32_t> q;
  std::vector<float> scales;
  std::vector<float> x;  // dequantized
};

inline double ref_scale(double amax, double fmax) {
  if (amax == 0) return 1.0;
  int k = -126;
  while (amax > fmax * std::ldexp(1.0, k)) ++k;
  return std::ldexp(1.0, k);
}

template <class Fp8>
inline RefQuant ref_quantize(const std::vector<float>& x, int block) {
  const RefTable& t = table<Fp8>();
  const RefFormat& f = t.fmt;
  RefQuant r;
  const std::size_t n = x.size();
  for (std::size_t b = 0; b * block < n; ++b) {
    const std::size_t lo = b * block, hi = std::min(n, lo + std::size_t(block));
    double amax = 0;
    for (std::size_t i = lo; i < hi; ++i)
      if (std::isfinite(x[i])) amax = std::max(amax, std::fabs(double(x[i])));
    const double s = ref_scale(amax, t.max_finite);
    r.scales.push_back(float(s));
    for (std::size_t i = lo; i < hi; ++i) {
      const std::uint32_t sign = std::signbit(x[i]) ? f.sign_bit() : 0u;
      std::uint32_t q;
      if (std::isnan(x[i]))
        q = sign | (f.fn ? 0x7Fu : 0x7Eu);  // the format's (quiet) NaN
      else if (std::isinf(x[i]))
        q = f.fn ? (sign | 0x7Fu) : (sign | f.inf_pattern());  // E4M3 has no inf
      else
        q = t.encode(double(x[i]) / s, true);  // exact division by a power of two
      r.q.push_back(q);
      r.x.push_back(float(ref_decode(f, q) * s));  // exact: few bits times 2^k
    }
  }
  return r;
}


}  // namespace kshard_test
