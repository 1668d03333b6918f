#pragma once
// Power-of-two fp8 scaling shared by the quantizers: the flat buffer's blocks
// (fp8_block.cpp), per tensor (fp8_tensor.cpp) and the GEMM operands' 1x128 /
// 128x128 blocks (fp8_blockwise.cpp); and their eight-element vector helpers.
// Private to the engine.
//
// A scale is 2^k, the smallest power of two with amax <= finite_max * 2^k
// (finite_max = 1.75 * 2^max_exp: 448 for E4M3, 57344 for E5M2), found with
// integer exponent arithmetic so host and device compute bit-identical scales
// without ldexp/log2. x / 2^k and q * 2^k are exact, so the one fp8 rounding
// (round-to-nearest-even) of x / 2^k is the only error, and a finite x whose
// |x| <= amax never saturates. k >= -126 keeps the scale and its reciprocal
// normal floats.
#include <cstdint>

#include <type_traits>

#include <Kokkos_Core.hpp>
#if defined(KOKKOS_ENABLE_CUDA)
#include <cuda_fp8.h>
#endif

#include "kshard/compat/for_each.hpp"

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

/// fp8(f) of a finite f, RNE, saturating. On the GPU one cvt instruction
/// (sm_89+: cvt.rn.satfinite.{e4m3,e5m2}x2.f32, what cuda_fp8.h emits; its
/// own emulation below that) instead of convert.hpp's ~20 integer operations
/// with branches, which made the casts compute-bound; the same bits
/// (numeric_fp8_tensor / numeric_fp8_blockwise check them against the
/// reference on the device).
template <class Fp8>
KOKKOS_INLINE_FUNCTION Fp8 finite_to_fp8(float f) {
#if defined(__CUDA_ARCH__)
  Fp8 out;
  out.bits = std::uint8_t(__nv_cvt_float_to_fp8(
      f, __NV_SATFINITE, std::is_same<Fp8, float8_e4m3_t>::value ? __NV_E4M3 : __NV_E5M2));
  return out;
#else
  return from_float<Fp8>(f);
#endif
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
    out = finite_to_fp8<Fp8>(v * inv_scale);
  return out;
}

// Team shape of the fp8 cast kernels: explicit on CUDA (Kokkos 3.4's AUTO
// picks 64-thread teams on sm_90, compat/for_each.hpp), AUTO elsewhere so
// host kernels keep theirs.
inline Kokkos::TeamPolicy<> fp8_teams(std::int64_t league) {
#if defined(KOKKOS_ENABLE_CUDA)
  return Kokkos::TeamPolicy<>(static_cast<int>(league), 256);
#else
  return Kokkos::TeamPolicy<>(static_cast<int>(league), Kokkos::AUTO);
#endif
}

// Eight bf16 in one 16-byte load: the vector kernels move 16 bytes per load
// and 8 per store, twice the bytes in flight per thread of 8-byte loads (a
// streaming kernel needs ~20 KiB in flight per multiprocessor to cover HBM's
// latency).
struct alignas(16) Bf16x8 {
  std::uint64_t lo, hi;
};

KOKKOS_INLINE_FUNCTION float bf16_lane(const Bf16x8& v, int e) {
  const std::uint64_t w = e < 4 ? v.lo : v.hi;
  return numeric_detail::bits_float(std::uint32_t((w >> (16 * (e & 3))) & 0xFFFFu) << 16);
}

/// Encodes the eight values of v, folds their amax into m; bytes[e] = lane e.
template <class Fp8>
KOKKOS_INLINE_FUNCTION std::uint64_t encode8(const Bf16x8& v, float inv, float& m) {
  std::uint64_t packed = 0;
  for (int e = 0; e < 8; ++e) {
    const float f = bf16_lane(v, e);
    const float a = fp8_amax_term(f);
    if (a > m) m = a;
    packed |= std::uint64_t(fp8_encode_scaled<Fp8>(f, inv).bits) << (8 * e);
  }
  return packed;
}

/// dbias[c] += sum over t of partials[t * cols + c] in a fixed order:
/// the second stage of a cast's fused bias gradient (per-tile column sums
/// first, so the result does not depend on the thread count).
inline void add_column_partials(Kokkos::View<const float*> partials, std::int64_t tiles_r,
                                std::int64_t cols, Kokkos::View<float*> dbias) {
  compat::for_each_index(
      "kshard::fp8_dbias_partials", cols, KOKKOS_LAMBDA(const std::int64_t c) {
        // Eight running sums (t mod 8), added in a fixed order at the end:
        // eight independent loads in flight per thread instead of a chain of
        // dependent adds (only `cols` threads run; 63 us per call at
        // 64 x 8192 on the H100 with one sum).
        float s0 = 0, s1 = 0, s2 = 0, s3 = 0, s4 = 0, s5 = 0, s6 = 0, s7 = 0;
        std::int64_t t = 0;
        for (; t + 8 <= tiles_r; t += 8) {
          const float* p = partials.data() + t * cols + c;
          s0 += p[0];
          s1 += p[cols];
          s2 += p[2 * cols];
          s3 += p[3 * cols];
          s4 += p[4 * cols];
          s5 += p[5 * cols];
          s6 += p[6 * cols];
          s7 += p[7 * cols];
        }
        for (; t < tiles_r; ++t) s0 += partials(t * cols + c);
        dbias(c) += ((s0 + s1) + (s2 + s3)) + ((s4 + s5) + (s6 + s7));
      });
}

}  // namespace kshard::detail
