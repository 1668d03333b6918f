#pragma once
// The fp8 products of a bf16 Linear (nn/fp8_policy.hpp): quantize the operands
// per tensor (kernels/fp8_tensor.hpp) and run the three GEMMs on fp8 tensor
// cores (kernels/fp8_gemm.hpp). Private to the engine: Linear owns one when
// its policy asks for fp8.
//
// forward:  x [rows, in] -> xq (E4M3, own amax), W [out, in] -> wq (E4M3, own
//           amax); y = xq . wq^T (+ bias, GELU in the epilogue), FAST_ACCUM.
// Current scaling takes each operand's amax first (one reduction kernel);
// delayed scaling casts with the scale its history set and the cast records
// the amax (kernels/fp8_tensor.hpp); before its first history update it
// scales like current scaling.
// backward: dy -> dyq [rows, out] and dyq^T [out, rows] (E5M2, one kernel,
//           which also sums dy's columns for the bias gradient);
//           W^T and x^T cast with the forward's scales (same values: the
//           caller hands backward the forward's parameter values and input);
//           dW += dyq^T . (x^T)^T (f32, beta 1), dx = dyq . (W^T)^T.
// Block scaling (Fp8Scaling::block): every operand E4M3; x, dy and their
// transposes with 1x128 scales along the product's reduction dimension, W
// and W^T with 128x128 tiles (kernels/fp8_blockwise.hpp), each cast from this
// call's values (no state); exact accumulation in every GEMM (cuBLASLt has no
// FAST_ACCUM for block scales). The dy cast also sums dy's columns (bias).
// The fp8 copies are pool scratch for the duration of one call: nothing is
// kept between forward and backward but the three per-tensor scales
// (kFp8ScaleFloats floats each; none for block scaling).
// Fp8Input::gelu_of_x (fc2 of LayerNormMLP): x is fc1's pre-activation and
// every cast of x (forward q, backward x^T, current scaling's amax) applies
// GELU as it loads, so the GELU output is never written. A backward with
// `gelu_pre` (fc1 of LayerNormMLP): dy is the gradient w.r.t. GELU's output
// and dy's casts apply GELU's backward, dy * gelu'(gelu_pre), as they load
// (fp8_input.hpp), so that gradient is never written either.
#include <cstdint>

#include <Kokkos_Core.hpp>

#include "kshard/kernels/fp8_gemm.hpp"
#include "kshard/kernels/fp8_tensor.hpp"
#include "kshard/engine/nn/fp8_policy.hpp"
#include "kshard/kernels/grad_write.hpp"

namespace kshard::detail {

class Fp8Linear {
 public:
  explicit Fp8Linear(Fp8Policy policy);
  const Fp8Policy& policy() const { return policy_; }
  /// x, W, dy: the order Fp8AmaxHistory keeps them in (none for block scaling).
  void scales(std::vector<Fp8Scale*>& out) {
    if (policy_.scaling != Fp8Scaling::block) out.insert(out.end(), {&sx_, &sw_, &sdy_});
  }

  /// Whether the three products of a [rows, in] -> [rows, out] Linear fit the
  /// fp8 GEMM (multiples of 16; of 128 for block scaling).
  bool fits(std::int64_t rows, std::int64_t in, std::int64_t out) const noexcept;

  /// y = x W^T (+ bias; + GELU with `pre` the pre-activation when e is
  /// bias_gelu); x is gelu(x) when `input` says so.
  void forward(Kokkos::View<const bfloat16_t*> x, std::int64_t rows, std::int64_t in,
               std::int64_t out, Kokkos::View<const bfloat16_t*> w, const bfloat16_t* bias,
               Fp8Epilogue e, bfloat16_t* y, bfloat16_t* pre, Fp8Input input = Fp8Input::x);
  /// dW += dy^T x (f32), dx = dy W, and db += column sums of dy when db is
  /// not empty (from the cast's read of dy); dW = and db = with
  /// GradWrite::assign. x and w hold the forward's values, `input` the
  /// forward's. With gelu_pre (rows x out) the output gradient is
  /// dy * gelu'(gelu_pre).
  void backward(Kokkos::View<const bfloat16_t*> dy, Kokkos::View<const bfloat16_t*> x,
                std::int64_t rows, std::int64_t in, std::int64_t out,
                Kokkos::View<const bfloat16_t*> w, float* dw, Kokkos::View<float*> db,
                bfloat16_t* dx, GradWrite write, Fp8Input input = Fp8Input::x,
                Kokkos::View<const bfloat16_t*> gelu_pre = {});

 private:
  // Current scaling: the amax of t into s, cast from it; delayed: the scale as set.
  Fp8ScaleFrom prepare(Kokkos::View<const bfloat16_t*> t, Fp8Scale& s,
                       Fp8Input input = Fp8Input::x, Kokkos::View<const bfloat16_t*> pre = {});
  void forward_blocks(Kokkos::View<const bfloat16_t*> x, std::int64_t rows, std::int64_t in,
                      std::int64_t out, Kokkos::View<const bfloat16_t*> w, Fp8GemmOptions o,
                      bfloat16_t* y, Fp8Input input);
  void backward_blocks(Kokkos::View<const bfloat16_t*> dy, Kokkos::View<const bfloat16_t*> x,
                       std::int64_t rows, std::int64_t in, std::int64_t out,
                       Kokkos::View<const bfloat16_t*> w, float* dw, Kokkos::View<float*> db,
                       bfloat16_t* dx, GradWrite write, Fp8Input input,
                       Kokkos::View<const bfloat16_t*> gelu_pre);

  Fp8Policy policy_;
  Fp8Scale sx_, sw_, sdy_;
};

}  // namespace kshard::detail
