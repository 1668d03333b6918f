#include "kshard/kernels/fp8_block.hpp"

#include <climits>
#include <cstdint>
#include <string>

#include "kshard/error.hpp"
#include "kshard/numeric/convert.hpp"
#include "fp8_scaling.hpp"

namespace kshard {
namespace {

using detail::Fp8Traits;
static_assert(finite_max<float8_e4m3_t>::value == 1.75f * 256.0f, "E4M3 max is 1.75 * 2^8");
static_assert(finite_max<float8_e5m2_t>::value == 1.75f * 32768.0f, "E5M2 max is 1.75 * 2^15");

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
          const float v = detail::fp8_amax_term(x(begin + i));
          if (v > m) m = v;
        },
        Kokkos::Max<float>(amax));

    const int k = detail::fp8_scale_exponent<Fp8>(amax);
    const float inv_scale = detail::fp8_pow2(-k);
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, len), [&](const int i) {
      q(begin + i) = detail::fp8_encode_scaled<Fp8>(x(begin + i), inv_scale);
    });
    Kokkos::single(Kokkos::PerTeam(team), [&]() { scales(b) = detail::fp8_pow2(k); });
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
