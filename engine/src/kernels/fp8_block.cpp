#include "kshard/engine/kernels/fp8_block.hpp"

#include <climits>
#include <cstdint>
#include <string>

#include "kshard/error.hpp"
#include "kshard/numeric/convert.hpp"

namespace kshard {
namespace {

// finite_max = 1.75 * 2^max_exp for both OCP fp8 formats; the power-of-two
// scale is derived from that shape with integer exponent arithmetic, so host
// and device compute bit-identical scales without ldexp/log2.
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
static_assert(finite_max<float8_e4m3_t>::value == 1.75f * 256.0f, "E4M3 max is 1.75 * 2^8");
static_assert(finite_max<float8_e5m2_t>::value == 1.75f * 32768.0f, "E5M2 max is 1.75 * 2^15");

constexpr int min_scale_exp = -126;  // scale and 1/scale stay normal floats
constexpr std::uint32_t mant_1_75 = 0x600000u;  // float mantissa field of 1.75

KOKKOS_INLINE_FUNCTION bool is_finite_bits(std::uint32_t u) {
  return (u & 0x7F800000u) != 0x7F800000u;
}

/// Exponent k of the smallest power of two with amax <= 1.75 * 2^(max_exp + k).
/// amax = m * 2^e, m in [1, 2): the bound holds iff e <= max_exp + k when
/// m <= 1.75, else iff e < max_exp + k.
template <class Fp8>
KOKKOS_INLINE_FUNCTION int scale_exponent(float amax) {
  const std::uint32_t u = numeric_detail::float_bits(amax);
  if (u == 0u) return 0;  // all-zero block: scale 1
  if (u < 0x00800000u) return min_scale_exp;  // float subnormal amax
  const int e = int(u >> 23) - 127;
  int k = e - Fp8Traits<Fp8>::max_exp + ((u & 0x7FFFFFu) > mant_1_75 ? 1 : 0);
  if (k < min_scale_exp) k = min_scale_exp;
  return k;
}

KOKKOS_INLINE_FUNCTION float pow2(int k) {
  return numeric_detail::bits_float(std::uint32_t(k + 127) << 23);
}

template <class Fp8>
struct QuantizeBlocks {
  using member_type = Kokkos::TeamPolicy<>::member_type;
  Kokkos::View<const float*> x;
  Kokkos::View<Fp8*> q;
  Kokkos::View<float*> scales;
  std::size_t n;
  std::size_t block;

  KOKKOS_INLINE_FUNCTION void operator()(const member_type& team) const {
    const std::size_t b = std::size_t(team.league_rank());
    const std::size_t begin = b * block;
    const std::size_t end = begin + block < n ? begin + block : n;
    const int len = int(end - begin);

    float amax = 0.0f;
    Kokkos::parallel_reduce(
        Kokkos::TeamThreadRange(team, len),
        [&](const int i, float& m) {
          // Non-finite elements count as 0, so a block of only NaN/inf gets
          // amax 0 (scale 1) rather than the reducer's initial -FLT_MAX.
          const std::uint32_t a = numeric_detail::float_bits(x(begin + i)) & 0x7FFFFFFFu;
          const float v = is_finite_bits(a) ? numeric_detail::bits_float(a) : 0.0f;
          if (v > m) m = v;
        },
        Kokkos::Max<float>(amax));

    if (!(amax > 0.0f)) amax = 0.0f;
    const int k = scale_exponent<Fp8>(amax);
    const float inv_scale = pow2(-k);
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, len), [&](const int i) {
      const float v = x(begin + i);
      const std::uint32_t u = numeric_detail::float_bits(v);
      const std::uint8_t sign = (u >> 31) ? 0x80u : 0u;
      Fp8 out;
      if ((u & 0x7FFFFFFFu) > 0x7F800000u)
        out.bits = std::uint8_t(sign | Fp8Traits<Fp8>::nan_bits);
      else if ((u & 0x7FFFFFFFu) == 0x7F800000u)
        out.bits = std::uint8_t(sign | Fp8Traits<Fp8>::inf_bits);
      else
        out = from_float<Fp8>(v * inv_scale);  // exact: power of two, no overflow
      q(begin + i) = out;
    });
    Kokkos::single(Kokkos::PerTeam(team), [&]() { scales(b) = pow2(k); });
  }
};

template <class Fp8, class Out = float>
struct DequantizeElements {
  Kokkos::View<const Fp8*> q;
  Kokkos::View<const float*> scales;
  Kokkos::View<Out*> x;
  std::size_t block;

  KOKKOS_INLINE_FUNCTION void operator()(const std::size_t i) const {
    x(i) = from_float<Out>(to_float(q(i)) * scales(i / block));
  }
};

void check_block(int block, const char* op) {
  if (block <= 0)
    throw Error(std::string(op) + ": block size " + std::to_string(block),
                "a positive number of elements per block (default 128)");
}

void check_extents(const char* op, const char* fp8_name, std::size_t n_float, std::size_t n_q,
                   std::size_t n_scales, int block) {
  check_block(block, op);
  if (n_q != n_float)
    throw Error(std::string(op) + ": fp8 (" + fp8_name + ") view has " + std::to_string(n_q) +
                    " elements but the float view has " + std::to_string(n_float),
                "q and x with the same number of elements");
  const std::size_t nb = fp8_num_blocks(n_float, block);
  if (n_scales != nb)
    throw Error(std::string(op) + ": scales view has " + std::to_string(n_scales) +
                    " elements for " + std::to_string(n_float) + " values in blocks of " +
                    std::to_string(block),
                "fp8_num_blocks(n, block) = " + std::to_string(nb) + " scales");
  if (nb > std::size_t(INT_MAX))
    throw Error(std::string(op) + ": " + std::to_string(nb) + " blocks",
                "at most " + std::to_string(INT_MAX) + " blocks per call");
}

template <class Fp8>
void quantize_impl(Kokkos::View<const float*> x, Kokkos::View<Fp8*> q, Kokkos::View<float*> scales,
                   int block) {
  check_extents("fp8_quantize", Fp8Traits<Fp8>::name, x.extent(0), q.extent(0),
                scales.extent(0), block);
  const std::size_t nb = scales.extent(0);
  if (nb == 0) return;
  QuantizeBlocks<Fp8> f{x, q, scales, x.extent(0), std::size_t(block)};
  Kokkos::parallel_for(std::string("kshard::fp8_quantize_") + Fp8Traits<Fp8>::name,
                       Kokkos::TeamPolicy<>(int(nb), Kokkos::AUTO), f);
}

template <class Fp8, class Out = float>
void dequantize_impl(Kokkos::View<const Fp8*> q, Kokkos::View<const float*> scales,
                     Kokkos::View<Out*> x, int block) {
  check_extents("fp8_dequantize", Fp8Traits<Fp8>::name, x.extent(0), q.extent(0),
                scales.extent(0), block);
  if (x.extent(0) == 0) return;
  DequantizeElements<Fp8, Out> f{q, scales, x, std::size_t(block)};
  Kokkos::parallel_for(std::string("kshard::fp8_dequantize_") + Fp8Traits<Fp8>::name,
                       Kokkos::RangePolicy<Kokkos::IndexType<std::size_t>>(0, x.extent(0)), f);
}

}  // namespace

std::size_t fp8_num_blocks(std::size_t n, int block) {
  check_block(block, "fp8_num_blocks");
  return n / std::size_t(block) + (n % std::size_t(block) ? 1 : 0);
}

void fp8_quantize(Kokkos::View<const float*> x, Kokkos::View<float8_e4m3_t*> q,
                  Kokkos::View<float*> scales, int block) {
  quantize_impl<float8_e4m3_t>(x, q, scales, block);
}
void fp8_quantize(Kokkos::View<const float*> x, Kokkos::View<float8_e5m2_t*> q,
                  Kokkos::View<float*> scales, int block) {
  quantize_impl<float8_e5m2_t>(x, q, scales, block);
}
void fp8_dequantize(Kokkos::View<const float8_e4m3_t*> q, Kokkos::View<const float*> scales,
                    Kokkos::View<float*> x, int block) {
  dequantize_impl<float8_e4m3_t>(q, scales, x, block);
}
void fp8_dequantize(Kokkos::View<const float8_e5m2_t*> q, Kokkos::View<const float*> scales,
                    Kokkos::View<float*> x, int block) {
  dequantize_impl<float8_e5m2_t>(q, scales, x, block);
}
void fp8_dequantize(Kokkos::View<const float8_e4m3_t*> q, Kokkos::View<const float*> scales,
                    Kokkos::View<bfloat16_t*> x, int block) {
  dequantize_impl<float8_e4m3_t, bfloat16_t>(q, scales, x, block);
}

}  // namespace kshard
