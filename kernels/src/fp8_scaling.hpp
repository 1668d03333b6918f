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
#include <string>
#include <type_traits>

#include <Kokkos_Core.hpp>
#if defined(KOKKOS_ENABLE_CUDA)
#include <cuda_fp8.h>
#endif

#include "kshard/compat/for_each.hpp"
#include "kshard/kernels/fp8_input.hpp"
#include "kshard/error.hpp"
#include "kshard/numeric/convert.hpp"
#include "kshard/numeric/types.hpp"
#include "pointwise.hpp"

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
  const std::uint32_t a = detail::float_bits(v) & 0x7FFFFFFFu;
  return fp8_is_finite_bits(a) ? detail::bits_float(a) : 0.0f;
}

/// Exponent k of the smallest power of two with amax <= 1.75 * 2^(max_exp + k).
/// amax = m * 2^e, m in [1, 2): the bound holds iff e <= max_exp + k when
/// m <= 1.75, else iff e < max_exp + k. amax 0 (or not > 0) gives k = 0.
template <class Fp8>
KOKKOS_INLINE_FUNCTION int fp8_scale_exponent(float amax) {
  if (!(amax > 0.0f)) return 0;
  const std::uint32_t u = detail::float_bits(amax);
  if (u >= 0x7F800000u) return 0;                      // inf (NaN was caught above)
  if (u < 0x00800000u) return fp8_min_scale_exp;       // float subnormal amax
  const int e = int(u >> 23) - 127;
  int k = e - Fp8Traits<Fp8>::max_exp + ((u & 0x7FFFFFu) > 0x600000u ? 1 : 0);  // 1.75
  if (k < fp8_min_scale_exp) k = fp8_min_scale_exp;
  return k;
}

KOKKOS_INLINE_FUNCTION float fp8_pow2(int k) {
  return detail::bits_float(std::uint32_t(k + 127) << 23);
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
  const std::uint32_t u = detail::float_bits(v);
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
  return detail::bits_float(std::uint32_t(b) << 16);
}

KOKKOS_INLINE_FUNCTION float bf16_lane(const Bf16x8& v, int e) {
  const std::uint64_t w = e < 4 ? v.lo : v.hi;
  return bf16_bits_float(std::uint16_t(w >> (16 * (e & 3))));
}

/// One value through a GELU step of Fp8Input (pre: GELU's input, for
/// gelu_grad), rounded to bf16: exactly what gelu_forward / gelu_backward
/// write for bf16 inputs (the same formulas, pointwise::gelu / gelu_slope, and
/// the same RNE), so a cast with the step on load quantizes the bits a cast of
/// the written tensor would.
template <Fp8Input kIn>
KOKKOS_INLINE_FUNCTION bfloat16_t gelu_step(float v, float pre) {
  static_assert(kIn != Fp8Input::x, "a GELU step");
  if constexpr (kIn == Fp8Input::gelu_of_x) {
    (void)pre;
    return from_float<bfloat16_t>(pointwise::gelu<float>(v));
  } else {
    return from_float<bfloat16_t>(v * pointwise::gelu_slope<float>(pre));
  }
}

KOKKOS_INLINE_FUNCTION float bf16_word_lane(std::uint64_t w, int e) {
  return to_float(bfloat16_t{std::uint16_t(w >> (16 * e))});
}

/// The eight lanes of v through the input step kIn (pre: GELU's input, for
/// gelu_grad).
template <Fp8Input kIn>
KOKKOS_INLINE_FUNCTION Bf16x8 cast_input(const Bf16x8& v, const Bf16x8* pre) {
  if constexpr (kIn == Fp8Input::x) {
    (void)pre;
    return v;
  } else {
    const std::uint64_t w[2] = {v.lo, v.hi};
    std::uint64_t out[2] = {0, 0};
    for (int h = 0; h < 2; ++h)
      for (int e = 0; e < 4; ++e) {
        const float p = kIn == Fp8Input::gelu_grad ? bf16_word_lane(h ? pre->hi : pre->lo, e) : 0.0f;
        out[h] |= std::uint64_t(gelu_step<kIn>(bf16_word_lane(w[h], e), p).bits) << (16 * e);
      }
    return {out[0], out[1]};
  }
}

/// The same with the step chosen at run time (the kernels that stage a tile
/// or take an amax, where one branch per vector costs nothing).
KOKKOS_INLINE_FUNCTION Bf16x8 cast_input(Fp8Input in, const Bf16x8& v, const Bf16x8* pre) {
  switch (in) {
    case Fp8Input::gelu_of_x: return cast_input<Fp8Input::gelu_of_x>(v, pre);
    case Fp8Input::gelu_grad: return cast_input<Fp8Input::gelu_grad>(v, pre);
    default: return v;
  }
}

/// Calls f(std::integral_constant<Fp8Input, in>{}): a kernel templated on
/// its input step, launched for a step known at run time.
template <class F>
void with_fp8_input(Fp8Input in, F&& f) {
  switch (in) {
    case Fp8Input::gelu_of_x: f(std::integral_constant<Fp8Input, Fp8Input::gelu_of_x>{}); break;
    case Fp8Input::gelu_grad: f(std::integral_constant<Fp8Input, Fp8Input::gelu_grad>{}); break;
    default: f(std::integral_constant<Fp8Input, Fp8Input::x>{});
  }
}

/// Kernel-name suffix of an input step (profiles tell the fused casts apart).
inline const char* fp8_input_suffix(Fp8Input in) {
  return in == Fp8Input::gelu_of_x ? "_gelu" : in == Fp8Input::gelu_grad ? "_dgelu" : "";
}

/// The arguments of an input step: gelu_grad needs GELU's input, as many
/// values as x (`pre`), the others none; a bias gradient (dbias sums) comes
/// with a gradient's cast, so not with gelu_of_x.
inline void check_fp8_input(const std::string& who, Fp8Input in, std::int64_t n,
                            std::size_t pre, bool sums) {
  if (in == Fp8Input::gelu_grad && std::int64_t(pre) != n)
    throw Error(who + " of x * gelu'(pre) with pre of " + std::to_string(pre) + " elements",
                "pre with x's " + std::to_string(n) + " elements");
  if (in != Fp8Input::gelu_grad && pre != 0)
    throw Error(who + " with pre (" + std::to_string(pre) + " elements) but no gelu_grad input",
                "pre only with Fp8Input::gelu_grad");
  if (sums && in == Fp8Input::gelu_of_x)
    throw Error(who + " with a bias gradient of gelu(x)",
                "dbias with a gradient's cast (Fp8Input::x or gelu_grad)");
}

/// One value through the input step (the element-wise kernels).
KOKKOS_INLINE_FUNCTION float cast_input(Fp8Input in, float v, float pre) {
  if (in == Fp8Input::gelu_of_x) return to_float(gelu_step<Fp8Input::gelu_of_x>(v, pre));
  if (in == Fp8Input::gelu_grad) return to_float(gelu_step<Fp8Input::gelu_grad>(v, pre));
  return v;
}

/// Whether any of the four bf16 lanes of w is inf or NaN (exponent all
/// ones): a lane of z is 0 exactly then, and (z - 1) & ~z & top finds a zero
/// lane (a borrow can only mark lanes above a zero one, so "any" is exact).
KOKKOS_INLINE_FUNCTION bool bf16x4_any_nonfinite(std::uint64_t w) {
  constexpr std::uint64_t kExp = 0x7F807F807F807F80ull;
  constexpr std::uint64_t kOne = 0x0001000100010001ull, kTop = 0x8000800080008000ull;
  const std::uint64_t z = (w & kExp) ^ kExp;
  return ((z - kOne) & ~z & kTop) != 0;
}

/// max |lane| of eight finite bf16 as bf16 bits: finite non-negative values
/// order like their bit patterns, so an integer max is exact (on the GPU two
/// lanes per instruction).
KOKKOS_INLINE_FUNCTION std::uint16_t bf16x8_abs_max_bits(const Bf16x8& v) {
  constexpr std::uint32_t kAbs = 0x7FFF7FFFu;
  const std::uint32_t w[4] = {std::uint32_t(v.lo) & kAbs, std::uint32_t(v.lo >> 32) & kAbs,
                              std::uint32_t(v.hi) & kAbs, std::uint32_t(v.hi >> 32) & kAbs};
#if defined(__CUDA_ARCH__)
  const std::uint32_t m = __vmaxu2(__vmaxu2(w[0], w[1]), __vmaxu2(w[2], w[3]));
  return std::uint16_t((m & 0xFFFFu) > (m >> 16) ? (m & 0xFFFFu) : (m >> 16));
#else
  std::uint32_t m = 0;
  for (std::uint32_t x : w) {
    const std::uint32_t a = x & 0xFFFFu, b = x >> 16;
    m = a > m ? a : m;
    m = b > m ? b : m;
  }
  return std::uint16_t(m);
#endif
}

/// Per 16-bit lane of w: max(m, |lane|) over the lanes that are finite bf16
/// (inf/NaN count as 0, as fp8_amax_term), as bf16 bits; two lanes per
/// instruction on the GPU. The column amaxes of the block casts keep a
/// column pair in one word.
KOKKOS_INLINE_FUNCTION std::uint32_t bf16x2_amax_bits(std::uint32_t m, std::uint32_t w) {
  const std::uint32_t a = w & 0x7FFF7FFFu;
#if defined(__CUDA_ARCH__)
  return __vmaxu2(m, a & __vcmpltu2(a, 0x7F807F80u));
#else
  std::uint32_t out = 0;
  for (int h = 0; h < 2; ++h) {
    const std::uint32_t l = (a >> (16 * h)) & 0xFFFFu, ml = (m >> (16 * h)) & 0xFFFFu;
    out |= ((l < 0x7F80u && l > ml) ? l : ml) << (16 * h);
  }
  return out;
#endif
}

/// The eight finite values of v times inv, encoded (RNE, saturating); on the
/// GPU one cvt per pair of values.
template <class Fp8>
KOKKOS_INLINE_FUNCTION std::uint64_t encode8_finite(const Bf16x8& v, float inv) {
  std::uint64_t packed = 0;
#if defined(__CUDA_ARCH__)
  constexpr __nv_fp8_interpretation_t kind =
      std::is_same<Fp8, float8_e4m3_t>::value ? __NV_E4M3 : __NV_E5M2;
  for (int p = 0; p < 4; ++p) {
    const float2 f = make_float2(bf16_lane(v, 2 * p) * inv, bf16_lane(v, 2 * p + 1) * inv);
    packed |= std::uint64_t(__nv_cvt_float2_to_fp8x2(f, __NV_SATFINITE, kind)) << (16 * p);
  }
#else
  for (int e = 0; e < 8; ++e)
    packed |= std::uint64_t(finite_to_fp8<Fp8>(bf16_lane(v, e) * inv).bits) << (8 * e);
#endif
  return packed;
}

/// Encodes the eight values of v, folds their amax into m; bytes[e] = lane e.
/// Vectors without inf/NaN (all but a diverging step's) take the integer
/// amax and the paired encode; the others go value by value.
template <class Fp8>
KOKKOS_INLINE_FUNCTION std::uint64_t encode8(const Bf16x8& v, float inv, float& m) {
  if (!bf16x4_any_nonfinite(v.lo) && !bf16x4_any_nonfinite(v.hi)) {
    const float a = bf16_bits_float(bf16x8_abs_max_bits(v));
    if (a > m) m = a;
    return encode8_finite<Fp8>(v, inv);
  }
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
                                std::int64_t cols, Kokkos::View<float*> dbias,
                                bool assign = false) {
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
          dbias(c0 + cl) = assign ? sum : dbias(c0 + cl) + sum;
        });
      });
}

}  // namespace kshard::detail
