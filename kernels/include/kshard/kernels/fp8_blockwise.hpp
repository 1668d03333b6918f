#pragma once
// Block-scaled fp8 GEMM operands: TransformerEngine's Float8BlockScaling (the
// DeepSeek-V3 recipe), one f32 scale per block instead of one per tensor.
//
//   1x128    a scale per 128 consecutive elements along the reduction
//            dimension k of an operand [outer, k] (activations, gradients)
//   128x128  a scale per 128 x 128 tile (weights: the transposed weight the
//            backward needs is the same blocks transposed, so W^T is W's
//            bytes and scales moved, not a second quantization)
//
// Scales are dequantization multipliers s = 2^e, the smallest power of two
// with the block's amax <= 448 s (E4M3, the format of every operand here, as
// in TE's recipe), so x / s and q * s are exact and host and device agree bit
// for bit (fp8_scaling.hpp; amax 0 gives s = 1; non-finite values are kept
// and do not count towards the amax).
//
// Scale layouts are the ones cuBLASLt's VEC128_32F / BLK128x128_32F modes read
// (fp8_gemm.hpp's Fp8ScaleMode), for an operand [outer, k]:
//   1x128:   s[(c / 128) * outer + r]          (outer fastest)
//   128x128: s[(r / 128) * ld + c / 128]        (ld = fp8_block_scale_ld(k),
//                                                k-blocks rounded up to 4: 16-byte rows)
//
// Shapes: rows and cols multiples of 128 (fp8_blockwise_supported); the layers
// keep other shapes in bf16.
//
//   // activations x [rows, in]: q [rows, in] (1x128 along in) for the forward,
//   // qt [in, rows] (1x128 along rows) for the weight gradient
//   kshard::fp8_cast_1x128(x, rows, in, q, q_scales, qt, qt_scales);
//   // weight W [out, in]: q [out, in] and qt [in, out], 128x128 tiles
//   kshard::fp8_cast_128x128(w, out, in, q, q_scales, qt, qt_scales);
//
// Each cast is one kernel over 128 x 128 tiles; an output of extent 0 is not
// written (its scales may then be empty too). Errors (kshard::Error): shapes
// that are not multiples of 128, sizes that do not match, no output.
#include <cstdint>

#include <Kokkos_Core.hpp>

#include "kshard/kernels/fp8_input.hpp"
#include "kshard/numeric/types.hpp"

namespace kshard {

/// The block edge of both scalings.
constexpr std::int64_t kFp8Block = 128;

/// Whether [rows, cols] can be cast block-wise (both multiples of 128).
bool fp8_blockwise_supported(std::int64_t rows, std::int64_t cols) noexcept;

/// Row stride of a 128x128 scale grid for an operand with k columns:
/// ceil(k / 128) rounded up to a multiple of 4.
std::int64_t fp8_block_scale_ld(std::int64_t k) noexcept;

/// Floats of the scales of an operand [outer, k]: outer * k / 128 (1x128)
/// and ceil(outer / 128) * fp8_block_scale_ld(k) (128x128).
std::int64_t fp8_scales_1x128(std::int64_t outer, std::int64_t k) noexcept;
std::int64_t fp8_scales_128x128(std::int64_t outer, std::int64_t k) noexcept;

/// x [rows, cols] -> q [rows, cols] with 1x128 blocks along cols (scales
/// fp8_scales_1x128(rows, cols)) and/or qt = x^T [cols, rows] with 1x128
/// blocks along rows (scales fp8_scales_1x128(cols, rows)). When dbias is
/// not empty (cols floats) it also adds x's column sums to it (a Linear's
/// bias gradient from its dy cast), summed in a fixed order through
/// `partials` (rows / 128 * cols floats of workspace). With another
/// Fp8Input it casts gelu(x) (no dbias then) or x * gelu'(pre)
/// (fp8_input.hpp; pre of x's size, 16-byte aligned). assign_dbias: dbias =
/// the sums instead of +=.
void fp8_cast_1x128(Kokkos::View<const bfloat16_t*> x, std::int64_t rows, std::int64_t cols,
                    Kokkos::View<float8_e4m3_t*> q, Kokkos::View<float*> q_scales,
                    Kokkos::View<float8_e4m3_t*> qt, Kokkos::View<float*> qt_scales,
                    Kokkos::View<float*> dbias = {}, Kokkos::View<float*> partials = {},
                    Fp8Input in = Fp8Input::x, Kokkos::View<const bfloat16_t*> pre = {},
                    bool assign_dbias = false);

/// x [rows, cols] -> q [rows, cols] and/or qt = x^T [cols, rows], each
/// 128 x 128 tile with one scale (fp8_scales_128x128(rows, cols) and
/// fp8_scales_128x128(cols, rows) floats): qt is q's tiles transposed.
void fp8_cast_128x128(Kokkos::View<const bfloat16_t*> x, std::int64_t rows, std::int64_t cols,
                      Kokkos::View<float8_e4m3_t*> q, Kokkos::View<float*> q_scales,
                      Kokkos::View<float8_e4m3_t*> qt, Kokkos::View<float*> qt_scales);

}  // namespace kshard
