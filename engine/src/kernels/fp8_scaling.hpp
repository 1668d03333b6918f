#pragma once
// Power-of-two fp8 scaling shared by the block-scaled (fp8_block.cpp) and the
// per-tensor (fp8_tensor.cpp) quantizers. Private to the engine.
//
// A scale is 2^k, the smallest power of two with amax <= finite_max * 2^k
// (finite_max = 1.75 * 2^max_exp: 448 for E4M3, 57344 for E5M2), found with
// integer exponent arithmetic so host and device compute bit-identical scales
// without ldexp/log2. x / 2^k and q * 2^k are exact, so the one fp8 rounding
// (round-to-nearest-even) of x / 2^k is the only error, and a finite x whose
// |x| <= amax never saturates. k >= -126 keeps the scale and its reciprocal
// normal floats.
#include <cstdint>

#include <Kokkos_Core.hpp>

#include "kshard/numeric/convert.hpp"
#include "kshard/numeric/types.hpp"

namespace kshard::detail {

template <class Fp8>
struct Fp8Traits;
template <>
struct Fp8Traits<float8_e4m3_t> {
  static constexpr int max_exp = 8;               // 448 = 1.75 * 2^8
  static constexpr std::uint8_t nan_bits = 0x7F;  // S.1111.111
  static constexpr std::uint8_t inf_bits = 0x7F;  // no infinity: NaN
  static constexpr const char* name = "e4m3";
};
template <>
struct Fp8Traits<float8_e5m2_t> {
  static constexpr int max_exp = 15;              // 57344 = 1.75 * 2^15
  static constexpr std::uint8_t nan_bits = 0x7E;  // quiet NaN S.11111.10
  static constexpr std::uint8_t inf_bits = 0x7C;  // S.11111.00
  static constexpr const char* name = "e5m2";
};

constexpr int fp8_min_scale_exp = -126;

KOKKOS_INLINE_FUNCTION bool fp8_is_finite_bits(std::uint32_t u) {
  return (u & 0x7F800000u) != 0x7F800000u;
}

/// |v| for finite v, 0 for inf/NaN: what an amax counts (a tensor of only
/// non-finite values gets amax 0, scale 1, and its NaN/inf stay visible in q).
KOKKOS_INLINE_FUNCTION float fp8_amax_term(float v) {
  const std::uint32_t a = numeric_detail::float_bits(v) & 0x7FFFFFFFu;
  return fp8_is_finite_bits(a) ? numeric_detail::bits_float(a) : 0.0f;
}

/// Exponent k of the smallest power of two with amax <= 1.75 * 2^(max_exp + k).
/// amax = m * 2^e, m in [1, 2): the bound holds iff e <= max_exp + k when
/// m <= 1.75, else iff e < max_exp + k. amax 0 (or not > 0) gives k = 0.
template <class Fp8>
KOKKOS_INLINE_FUNCTION int fp8_scale_exponent(float amax) {
  if (!(amax > 0.0f)) return 0;
  const std::uint32_t u = numeric_detail::float_bits(amax);
  if (u >= 0x7F800000u) return 0;                      // inf (NaN was caught above)
  if (u < 0x00800000u) return fp8_min_scale_exp;       // float subnormal amax
  const int e = int(u >> 23) - 127;
  int k = e - Fp8Traits<Fp8>::max_exp + ((u & 0x7FFFFFu) > 0x600000u ? 1 : 0);  // 1.75
  if (k < fp8_min_scale_exp) k = fp8_min_scale_exp;
  return k;
}

KOKKOS_INLINE_FUNCTION float fp8_pow2(int k) {
  return numeric_detail::bits_float(std::uint32_t(k + 127) << 23);
}

/// q = fp8(v * inv_scale) (RNE, saturating); NaN -> NaN, +-inf -> +-inf for
/// E5M2 and NaN for E4M3 (no infinity), so an overflow upstream stays visible.
template <class Fp8>
KOKKOS_INLINE_FUNCTION Fp8 fp8_encode_scaled(float v, float inv_scale) {
  const std::uint32_t u = numeric_detail::float_bits(v);
  const std::uint8_t sign = (u >> 31) ? 0x80u : 0u;
  Fp8 out;
  if ((u & 0x7FFFFFFFu) > 0x7F800000u)
    out.bits = std::uint8_t(sign | Fp8Traits<Fp8>::nan_bits);
  else if ((u & 0x7FFFFFFFu) == 0x7F800000u)
    out.bits = std::uint8_t(sign | Fp8Traits<Fp8>::inf_bits);
  else
    out = from_float<Fp8>(v * inv_scale);
  return out;
}

}  // namespace kshard::detail
