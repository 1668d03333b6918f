#pragma once
// Exact, round-to-nearest-even conversions between float and the storage
// types of kshard/numeric/types.hpp, usable in Kokkos kernels on host and
// device.
//
//   kshard::bfloat16_t b = kshard::from_float<kshard::bfloat16_t>(x);
//   float y = kshard::to_float(b);
//
// Overflow: bf16/fp16 go to +-inf (IEEE). The fp8 formats saturate to their
// largest finite value (+-448 for E4M3, +-57344 for E5M2) for finite overflow
// and for +-inf — the "satfinite" behaviour of scaled fp8 casts, since an fp8
// tensor is always paired with a scale chosen to avoid overflow. NaN stays NaN
// (quiet) in every format. Inputs that are float subnormals convert exactly
// like any other value.
#include <cstdint>

#include <Kokkos_Macros.hpp>

#include "kshard/numeric/types.hpp"

namespace kshard {
namespace detail {

KOKKOS_INLINE_FUNCTION std::uint32_t float_bits(float f) {
  std::uint32_t u;
  __builtin_memcpy(&u, &f, sizeof u);
  return u;
}
KOKKOS_INLINE_FUNCTION float bits_float(std::uint32_t u) {
  float f;
  __builtin_memcpy(&f, &u, sizeof f);
  return f;
}

/// A small binary float format: EBITS exponent bits, MBITS mantissa bits.
/// FN: "finite, NaN" (E4M3): no infinities, the all-ones exponent is normal
/// except its all-ones mantissa, which is NaN; saturating overflow.
template <int EBITS, int MBITS, bool FN, bool SATURATE>
struct Format {
  static constexpr int bias = (1 << (EBITS - 1)) - 1;
  static constexpr int emin = 1 - bias;  // exponent of the smallest normal
  static constexpr std::uint32_t exp_mask = (1u << EBITS) - 1;
  static constexpr std::uint32_t man_mask = (1u << MBITS) - 1;
  static constexpr std::uint32_t sign_bit = 1u << (EBITS + MBITS);
  // Largest finite magnitude pattern and the patterns for inf / NaN.
  static constexpr std::uint32_t max_finite =
      FN ? ((exp_mask << MBITS) | (man_mask - 1)) : (((exp_mask - 1) << MBITS) | man_mask);
  static constexpr std::uint32_t inf = FN ? 0 : (exp_mask << MBITS);
  static constexpr std::uint32_t qnan =
      FN ? ((exp_mask << MBITS) | man_mask) : ((exp_mask << MBITS) | (1u << (MBITS - 1)));

  KOKKOS_INLINE_FUNCTION static std::uint32_t encode(float f) {
    const std::uint32_t u = float_bits(f);
    const std::uint32_t sign = (u >> 31) ? sign_bit : 0u;
    const std::uint32_t a = u & 0x7FFFFFFFu;
    if (a > 0x7F800000u) return sign | qnan;            // NaN
    if (a == 0x7F800000u) return sign | (SATURATE ? max_finite : inf);
    if (a < 0x00800000u) return sign;                   // float zero/subnormal: < 2^-126
    const int e = int(a >> 23) - 127;
    const std::uint32_t mant = (a & 0x7FFFFFu) | 0x800000u;  // 24-bit significand
    int shift = 23 - MBITS;
    if (e < emin) shift += emin - e;                    // target subnormal
    if (shift > 24) return sign;                        // below half the smallest subnormal
    std::uint32_t r = mant >> shift;
    const std::uint32_t rem = mant & ((1u << shift) - 1u);
    const std::uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (r & 1u))) ++r;   // ties to even
    // Normal: r holds the implicit bit, which adds the exponent's last step;
    // a carry out of the mantissa correctly bumps the exponent.
    const std::uint32_t out =
        (e < emin) ? r : ((std::uint32_t(e + bias - 1) << MBITS) + r);
    if (out > max_finite) return sign | (SATURATE ? max_finite : inf);
    return sign | out;
  }

  KOKKOS_INLINE_FUNCTION static float decode(std::uint32_t b) {
    const std::uint32_t sign = (b & sign_bit) ? 0x80000000u : 0u;
    const std::uint32_t ex = (b >> MBITS) & exp_mask;
    const std::uint32_t m = b & man_mask;
    if (FN) {
      if (ex == exp_mask && m == man_mask) return bits_float(sign | 0x7FC00000u);
    } else if (ex == exp_mask) {
      return bits_float(sign | (m ? 0x7FC00000u : 0x7F800000u));
    }
    if (ex == 0) {
      // Subnormal: m * 2^(emin - MBITS), exact in float.
      const float mag = float(m) * bits_float(std::uint32_t(emin - MBITS + 127) << 23);
      return bits_float(sign | float_bits(mag));
    }
    return bits_float(sign | (std::uint32_t(int(ex) - bias + 127) << 23) | (m << (23 - MBITS)));
  }
};

using F16 = Format<5, 10, false, false>;
using E4M3 = Format<4, 3, true, true>;
using E5M2 = Format<5, 2, false, true>;

}  // namespace detail

KOKKOS_INLINE_FUNCTION float to_float(bfloat16_t v) {
  std::uint32_t u = std::uint32_t(v.bits) << 16;
  // A signalling bf16 NaN would otherwise widen to a signalling float NaN;
  // set the quiet bit (payload and sign kept), as the other formats do.
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) u |= 0x00400000u;
  return detail::bits_float(u);
}
KOKKOS_INLINE_FUNCTION float to_float(float16_t v) { return detail::F16::decode(v.bits); }
KOKKOS_INLINE_FUNCTION float to_float(float8_e4m3_t v) {
  return detail::E4M3::decode(v.bits);
}
KOKKOS_INLINE_FUNCTION float to_float(float8_e5m2_t v) {
  return detail::E5M2::decode(v.bits);
}
KOKKOS_INLINE_FUNCTION float to_float(float v) { return v; }

template <class T>
KOKKOS_INLINE_FUNCTION T from_float(float f);

template <>
KOKKOS_INLINE_FUNCTION float from_float<float>(float f) {
  return f;
}
template <>
KOKKOS_INLINE_FUNCTION bfloat16_t from_float<bfloat16_t>(float f) {
  const std::uint32_t u = detail::float_bits(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return bfloat16_t{std::uint16_t((u >> 16) | 0x40u)};
  const std::uint32_t rounded = u + 0x7FFFu + ((u >> 16) & 1u);  // ties to even
  return bfloat16_t{std::uint16_t(rounded >> 16)};
}
template <>
KOKKOS_INLINE_FUNCTION float16_t from_float<float16_t>(float f) {
  return float16_t{std::uint16_t(detail::F16::encode(f))};
}
template <>
KOKKOS_INLINE_FUNCTION float8_e4m3_t from_float<float8_e4m3_t>(float f) {
  return float8_e4m3_t{std::uint8_t(detail::E4M3::encode(f))};
}
template <>
KOKKOS_INLINE_FUNCTION float8_e5m2_t from_float<float8_e5m2_t>(float f) {
  return float8_e5m2_t{std::uint8_t(detail::E5M2::encode(f))};
}

/// Largest finite value of each format (for fp8 scaling).
template <class T>
struct finite_max;
template <>
struct finite_max<float8_e4m3_t> {
  static constexpr float value = 448.0f;
};
template <>
struct finite_max<float8_e5m2_t> {
  static constexpr float value = 57344.0f;
};
template <>
struct finite_max<float16_t> {
  static constexpr float value = 65504.0f;
};

}  // namespace kshard
