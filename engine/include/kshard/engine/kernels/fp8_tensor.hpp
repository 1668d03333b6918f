#pragma once
// Per-tensor scaled fp8: the operands of kshard's fp8 GEMMs (fp8_gemm.hpp),
// TransformerEngine's Float8Tensor with one scale per tensor.
//
// A bf16 matrix x [rows, cols] (row-major) becomes q = fp8(x / s), x ~ q * s,
// with ONE power-of-two scale s = 2^k per tensor (the smallest with
// amax <= finite_max * s, as the block-scaled fp8 of fp8_block.hpp chooses
// per block; 448 for E4M3, 57344 for E5M2). Power-of-two scales make x / s
// and q * s exact, so the fp8 rounding (RNE, saturating) is the only error and
// host and device produce the same bits. NaN stays NaN, +-inf becomes +-inf
// (E5M2) or NaN (E4M3), and non-finite values do not count towards amax, so an
// overflow upstream reaches the loss (and the inf/NaN step skip) instead of
// hiding behind a plausible number.
//
// The scale lives in device memory (Fp8Scale), so nothing waits for the host:
//
//   kshard::Fp8Scale sx;
//   kshard::fp8_amax(x, sx);                              // current scaling: this tensor's amax
//   kshard::fp8_cast(x, rows, cols, sx, kshard::Fp8ScaleFrom::amax, q, qt);
//   // q [rows, cols] and/or qt [cols, rows] (the transposed copy a backward
//   // GEMM needs, written by the same kernel); sx.scale_inv() = s for the GEMM.
//
// Delayed scaling sets the scale first (from an amax history) and casts with
// Fp8ScaleFrom::scale; the cast then records this tensor's amax (max over the
// tensor, folded into sx.amax with a max, so several casts of one tensor
// within a step keep their maximum) for the next step's history.
//
// Errors (kshard::Error): sizes that do not match rows x cols, both outputs empty.
#include <cstdint>

#include <Kokkos_Core.hpp>

#include "kshard/numeric/types.hpp"

namespace kshard {

/// One tensor's scaling state in device memory: [0] scale_inv = s (the
/// dequantization multiplier the GEMM reads), [1] amax.
class Fp8Scale {
 public:
  /// scale_inv = 1, amax = 0.
  explicit Fp8Scale(const char* label = "kshard::Fp8Scale");
  const float* scale_inv() const { return v_.data(); }
  float* scale_inv() { return v_.data(); }
  float* amax() { return v_.data() + 1; }
  const float* amax() const { return v_.data() + 1; }
  Kokkos::View<float*> values() const { return v_; }
  /// Copies to the host (fences): for tests and diagnostics.
  float scale_inv_host() const;
  float amax_host() const;

 private:
  Kokkos::View<float*> v_;
};

/// Where a cast takes its scale from.
enum class Fp8ScaleFrom {
  amax,   ///< current scaling: s from the amax already in the Fp8Scale (fp8_amax), written to scale_inv
  scale,  ///< delayed scaling: s = scale_inv as set; the cast max-folds this tensor's amax into amax
};

/// scale.amax = max |x| over the finite elements (one reduction kernel).
void fp8_amax(Kokkos::View<const bfloat16_t*> x, Fp8Scale& scale);

/// Casts x [rows, cols] to fp8 with one kernel: q [rows, cols] (row-major
/// copy) and/or qt [cols, rows] (transposed copy); an output of extent 0 is
/// not written.
void fp8_cast(Kokkos::View<const bfloat16_t*> x, std::int64_t rows, std::int64_t cols,
              Fp8Scale& scale, Fp8ScaleFrom from, Kokkos::View<float8_e4m3_t*> q,
              Kokkos::View<float8_e4m3_t*> qt);
void fp8_cast(Kokkos::View<const bfloat16_t*> x, std::int64_t rows, std::int64_t cols,
              Fp8Scale& scale, Fp8ScaleFrom from, Kokkos::View<float8_e5m2_t*> q,
              Kokkos::View<float8_e5m2_t*> qt);

}  // namespace kshard
