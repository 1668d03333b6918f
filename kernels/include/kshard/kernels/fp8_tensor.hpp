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
// Fp8AmaxHistory keeps the histories of many tensors in one device buffer
// (one all-reduce makes their amaxes agree across ranks, one kernel rolls
// them and sets every next scale):
//
//   kshard::Fp8AmaxHistory h({&sx, &sw, &sdy}, 1024, kshard::Fp8AmaxAlgo::max);
//   ... casts with Fp8ScaleFrom::scale during the step ...
//   comm.all_reduce(h.amax_and_scales(), kshard::ReduceOp::max);
//   h.update();  // s = the smallest power of two holding max(history)
//
// Errors (kshard::Error): sizes that do not match rows x cols, both outputs empty.
#include <cstdint>
#include <vector>

#include <Kokkos_Core.hpp>

#include "kshard/kernels/fp8_input.hpp"
#include "kshard/numeric/types.hpp"

namespace kshard {

enum class Fp8Format { e4m3, e5m2 };

/// Floats of one tensor's scaling state (Fp8Scale).
constexpr std::size_t kFp8ScaleFloats = 3;

/// One tensor's scaling state in device memory: [0] scale_inv = s (the
/// dequantization multiplier the GEMM reads), [1] amax: the running max of
/// every amax and cast since the last history update (what delayed scaling
/// records; several micro-batches of a step fold into it), [2] the amax of
/// the last fp8_amax alone (what a current-scaling cast derives s from).
class Fp8Scale {
 public:
  /// scale_inv = 1, amax = 0; `format` is the fp8 format the tensor is cast
  /// to (what a scale computed from an amax history is for).
  explicit Fp8Scale(const char* label = "kshard::Fp8Scale", Fp8Format format = Fp8Format::e4m3);
  Fp8Format format() const noexcept { return format_; }
  /// Moves the values into `slot` (kFp8ScaleFloats floats of a larger
  /// buffer) and uses it from now on (Fp8AmaxHistory's shared buffer).
  void bind(Kokkos::View<float*> slot);
  /// Whether a delayed-scaling history has set scale_inv (host-side flag,
  /// set by Fp8AmaxHistory::update and set_state). Until then a delayed cast
  /// takes this step's amax like current scaling rather than TE's initial
  /// scale of 1, which would put small gradients into E5M2's subnormals.
  bool calibrated() const noexcept { return calibrated_; }
  void set_calibrated(bool c) noexcept { calibrated_ = c; }
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
  Fp8Format format_;
  bool calibrated_ = false;
};

enum class Fp8AmaxAlgo {
  max,          ///< the scale holds the largest amax of the history (TE's default)
  most_recent,  ///< the scale holds the last step's amax
};

/// Delayed scaling of a set of tensors (TransformerEngine's DelayedScaling):
/// each tensor's amax of the last `length` steps and the scale derived from
/// them, in device memory. The constructor binds the tensors' Fp8Scales into
/// its buffer (they must outlive it); scales start at 1 with an empty (zero)
/// history.
class Fp8AmaxHistory {
 public:
  Fp8AmaxHistory(const std::vector<Fp8Scale*>& scales, int length, Fp8AmaxAlgo algo);
  std::size_t size() const noexcept { return formats_.size(); }
  int length() const noexcept { return length_; }

  /// Every tensor's values, in 16-byte slots (kFp8ScaleFloats used: cuBLASLt
  /// wants 16-byte aligned scale pointers), contiguous: an all-reduce
  /// with max makes the amaxes agree across ranks (the scales already do,
  /// once calibrated; update() overwrites them anyway).
  Kokkos::View<float*> amax_and_scales() const { return values_; }
  /// Records each tensor's amax of this step in its history, resets it to 0,
  /// sets scale_inv from the history and marks the scales calibrated. One
  /// kernel, nothing waits.
  void update();

  /// Everything, for checkpoints: the slots (4 floats x size), the histories
  /// (size x length), the next history slot and whether an update ran (1/0).
  /// Fences.
  std::vector<float> state() const;
  /// The inverse of state(); kshard::Error if `s` is not of this set's size.
  void set_state(const std::vector<float>& s);

 private:
  Kokkos::View<float*> values_, history_;
  Kokkos::View<std::uint8_t*> is_e5m2_;
  std::vector<Fp8Format> formats_;
  std::vector<Fp8Scale*> scales_;
  bool updated_ = false;
  int length_;
  Fp8AmaxAlgo algo_;
  int pos_ = 0;
};

/// Where a cast takes its scale from.
enum class Fp8ScaleFrom {
  amax,   ///< current scaling: s from the last fp8_amax of this Fp8Scale, written to scale_inv
  scale,  ///< delayed scaling: s = scale_inv as set; the cast max-folds this tensor's amax into amax
};

/// The amax of x (max |x| over the finite elements) into scale's [2], and
/// max-folded into its running amax [1]. A reset and a reduction kernel.
/// With another Fp8Input: the amax of gelu(x) or of x * gelu'(pre)
/// (fp8_input.hpp; pre only for gelu_grad, x's size).
void fp8_amax(Kokkos::View<const bfloat16_t*> x, Fp8Scale& scale, Fp8Input in = Fp8Input::x,
              Kokkos::View<const bfloat16_t*> pre = {});

/// Casts x [rows, cols] to fp8 with one kernel: q [rows, cols] (row-major
/// copy) and/or qt [cols, rows] (transposed copy); an output of extent 0 is
/// not written. With another Fp8Input it casts gelu(x) or x * gelu'(pre),
/// which is not written anywhere (fp8_input.hpp).
void fp8_cast(Kokkos::View<const bfloat16_t*> x, std::int64_t rows, std::int64_t cols,
              Fp8Scale& scale, Fp8ScaleFrom from, Kokkos::View<float8_e4m3_t*> q,
              Kokkos::View<float8_e4m3_t*> qt, Fp8Input in = Fp8Input::x,
              Kokkos::View<const bfloat16_t*> pre = {});
void fp8_cast(Kokkos::View<const bfloat16_t*> x, std::int64_t rows, std::int64_t cols,
              Fp8Scale& scale, Fp8ScaleFrom from, Kokkos::View<float8_e5m2_t*> q,
              Kokkos::View<float8_e5m2_t*> qt, Fp8Input in = Fp8Input::x,
              Kokkos::View<const bfloat16_t*> pre = {});

/// A Linear's backward cast of its output gradient dy [rows, cols] (E5M2, q
/// and/or qt as fp8_cast) that also adds dy's column sums, the bias gradient,
/// to dbias [cols] (f32) from the same read of dy (TransformerEngine's
/// cast_transpose_dbias): each 64-row tile sums its columns into `partials`
/// (fp8_column_sum_partials(rows, cols) floats of workspace), then one small
/// kernel adds them up tile by tile. The order is fixed, so the result does
/// not depend on the backend's thread count (and differs from a GEMM's
/// column sum only in rounding order). With Fp8Input::gelu_grad the
/// gradient is dy * gelu'(pre) (TE's cast_transpose_dbias_dgelu): cast and
/// summed, never written. assign_dbias: dbias = the sums (its old values are
/// not read) instead of +=.
std::int64_t fp8_column_sum_partials(std::int64_t rows, std::int64_t cols);
void fp8_cast_dbias(Kokkos::View<const bfloat16_t*> dy, std::int64_t rows, std::int64_t cols,
                    Fp8Scale& scale, Fp8ScaleFrom from, Kokkos::View<float8_e5m2_t*> q,
                    Kokkos::View<float8_e5m2_t*> qt, Kokkos::View<float*> dbias,
                    Kokkos::View<float*> partials, Fp8Input in = Fp8Input::x,
                    Kokkos::View<const bfloat16_t*> pre = {}, bool assign_dbias = false);

}  // namespace kshard
