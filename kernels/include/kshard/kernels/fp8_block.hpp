#pragma once
// Block-scaled fp8 for the flat parameter buffer.
//
// An fp8 all-gather moves one byte per parameter plus one float per block of
// `block` consecutive elements of the flat buffer. Because a shard is a whole
// number of blocks, each rank quantizes only its own shard and the gathered
// q / scales are simply the concatenation of every rank's q / scales: no
// block straddles two ranks and nothing has to be re-scaled after the gather.
//
//   const std::size_t nb = kshard::fp8_num_blocks(shard.extent(0));
//   Kokkos::View<kshard::float8_e4m3_t*> q("q", shard.extent(0));
//   Kokkos::View<float*> scales("scales", nb);
//   kshard::fp8_quantize(shard, q, scales);          // one kernel
//   // ... all_gather(q), all_gather(scales) ...
//   kshard::fp8_dequantize(q_full, scales_full, full); // one kernel
//
// Scale choice: per block, amax = max |x| over the block's finite elements,
// and the scale is the smallest power of two s with amax <= finite_max * s
// (finite_max = 448 for E4M3, 57344 for E5M2), i.e. amax / finite_max rounded
// UP to a power of two, as MXFP8-style recipes do. Power-of-two scales make
// x / s and q * s exact, so the only error is the one fp8 rounding
// (round-to-nearest-even) of x / s, and every finite x / s is <= finite_max, so
// finite values never saturate. All-zero blocks (and blocks with no finite
// non-zero element) get scale 1. Scales are at least 2^-126 so a scale and its
// reciprocal are normal floats; blocks with amax below 448 * 2^-126 (about
// 2^-117) therefore keep only the fp8 precision relative to 2^-126.
//
// Non-finite values stay non-finite, so an overflow upstream is not hidden
// behind a plausible finite number: NaN -> NaN; +-inf -> +-inf for E5M2, and
// for E4M3 (which has no infinity) -> its NaN pattern. Non-finite elements do
// not contribute to amax. Dequantization is x' = to_float(q) * scale; only for
// |x| within a factor 1/(1 + 2^-4) of FLT_MAX can the rounding of q push x'
// to inf.
//
// Errors (kshard::Error): block <= 0, q / x extents that differ, or a scales
// extent other than fp8_num_blocks(n, block).
#include <cstddef>

#include <Kokkos_Core.hpp>

#include "kshard/numeric/types.hpp"

namespace kshard {

inline constexpr int fp8_default_block = 128;

/// Number of blocks for n elements: ceil(n / block); the last may be partial.
std::size_t fp8_num_blocks(std::size_t n, int block = fp8_default_block);

void fp8_quantize(Kokkos::View<const float*> x, Kokkos::View<float8_e4m3_t*> q,
                  Kokkos::View<float*> scales, int block = fp8_default_block);
void fp8_quantize(Kokkos::View<const float*> x, Kokkos::View<float8_e5m2_t*> q,
                  Kokkos::View<float*> scales, int block = fp8_default_block);

void fp8_dequantize(Kokkos::View<const float8_e4m3_t*> q, Kokkos::View<const float*> scales,
                    Kokkos::View<float*> x, int block = fp8_default_block);
void fp8_dequantize(Kokkos::View<const float8_e5m2_t*> q, Kokkos::View<const float*> scales,
                    Kokkos::View<float*> x, int block = fp8_default_block);
/// Straight into bf16, the fp8 recipe's compute dtype: to_float(q) * scale
/// is exact in f32 and then rounded once (RNE) to bf16.
void fp8_dequantize(Kokkos::View<const float8_e4m3_t*> q, Kokkos::View<const float*> scales,
                    Kokkos::View<bfloat16_t*> x, int block = fp8_default_block);

}  // namespace kshard
