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

/// The float of a bf16 bit pattern (exact: bf16 is float's upper half).
KOKKOS_INLINE_FUNCTION float bf16_bits_float(std::uint16_t b) {
  return numeric_detail::bits_float(std::uint32_t(b) << 16);
}

KOKKOS_INLINE_FUNCTION float bf16_lane(const Bf16x8& v, int e) {
  const std::uint64_t w = e < 4 ? v.lo : v.hi;
  return bf16_bits_float(std::uint16_t(w >> (16 * (e & 3))));
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
/// first, so the result does not depend on the thread count). A team per 32
/// columns: 8 threads a column, each summing every eighth tile row, then the
/// 8 sums in order. (compat::for_each_index gives each thread 8 columns, which
/// left a 2048-column gradient to one block: 46 us a call on the H100.)
inline void add_column_partials(Kokkos::View<const float*> partials, std::int64_t tiles_r,
                                std::int64_t cols, Kokkos::View<float*> dbias) {
  constexpr int kCols = 32, kGroups = 8;
  using Member = Kokkos::TeamPolicy<>::member_type;
  using Scratch = Kokkos::View<float*, Kokkos::DefaultExecutionSpace::scratch_memory_space,
                               Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
  if (cols <= 0) return;
  Kokkos::parallel_for(
      "kshard::fp8_dbias_partials",
      fp8_teams((cols + kCols - 1) / kCols)
          .set_scratch_size(0, Kokkos::PerTeam(Scratch::shmem_size(kCols * kGroups))),
      KOKKOS_LAMBDA(const Member& team) {
        Scratch part(team.team_scratch(0), kCols * kGroups);
        const std::int64_t c0 = std::int64_t(team.league_rank()) * kCols;
        Kokkos::parallel_for(Kokkos::TeamThreadRange(team, kCols * kGroups), [&](const int i) {
          const int cl = i % kCols, g = i / kCols;
          float sum = 0.0f;
          if (c0 + cl < cols)
            for (std::int64_t t = g; t < tiles_r; t += kGroups) sum += partials(t * cols + c0 + cl);
          part(i) = sum;
        });
        team.team_barrier();
        Kokkos::parallel_for(Kokkos::TeamThreadRange(team, kCols), [&](const int cl) {
          if (c0 + cl >= cols) return;
          float sum = 0.0f;
          for (int g = 0; g < kGroups; ++g) sum += part(g * kCols + cl);
          dbias(c0 + cl) += sum;
        });
      });
}

}  // namespace kshard::detail
