#pragma once
// Linear: y = x W^T + b, W [out, in], b [out] (PyTorch's nn.Linear layout and
// default init, U(-1/sqrt(in), 1/sqrt(in)) for both). Also the LM head
// (Linear(d_model, vocab, false) after the last layer).
//
//   kshard::Linear<float> fc(512, 2048);          // params: "weight" [2048, 512], "bias" [2048]
//   fc.forward(x, {batch, seq, 512}, params, y);  // y: [batch*seq, 2048]
//
// Backward: dx = dy W, dW += dy^T x, db += column sums of dy: three GEMMs.
#include <memory>

#include "kshard/kernels/fp8_gemm.hpp"
#include "kshard/engine/nn/layer.hpp"

namespace kshard {
namespace detail {
class Fp8Linear;
}

template <class T>
class Linear final : public Layer<T> {
 public:
  using typename Layer<T>::ConstViews;
  using typename Layer<T>::GradViews;

  Linear(std::int64_t in_features, std::int64_t out_features, bool bias = true);
  ~Linear() override;

  std::string kind() const override { return "Linear"; }
  std::vector<ParamSpec> param_specs() const override;
  std::int64_t in_features() const override { return in_; }
  std::int64_t out_features() const override { return out_; }
  bool has_bias() const { return bias_; }

  void forward(Kokkos::View<const T*> x, ActShape shape, const ConstViews& params,
               Kokkos::View<T*> y) override;
  void backward(Kokkos::View<const T*> dy, const ConstViews& params, const GradViews& grads,
                Kokkos::View<T*> dx) override;
  void release() override;
  bool rows_independent() const override { return true; }
  bool assigns_grads() const override { return true; }
  /// fp8 products (nn/fp8_policy.hpp) for bf16 T; other T ignore the policy
  /// (their recipes have no fp8 compute).
  void set_fp8_policy(const Fp8Policy& policy) override;
  void fp8_scales(std::vector<Fp8Scale*>& out) override;
  /// forward, then GELU (tanh): pre = x W^T + b (kept by the caller for
  /// GELU's backward), y = gelu(pre). Needs a bias. On CUDA with 16-bit T or f32 one
  /// cuBLASLt call (bias and GELU in the GEMM's epilogue); elsewhere the GEMM
  /// and two elementwise passes. backward() is the Linear's alone (dy w.r.t.
  /// pre): the caller applies GELU's backward first.
  void forward_gelu(Kokkos::View<const T*> x, ActShape shape, const ConstViews& params,
                    Kokkos::View<T*> pre, Kokkos::View<T*> y);
  /// Points the saved forward input at `x`, an equal recomputed copy (same
  /// size), before backward: lets the owner of a large input give its memory
  /// back after forward and rebuild it only for backward (LayerNormMLP does
  /// so with the GELU output and the LayerNorm output). backward() reads the
  /// saved input before it writes dx, so dx may be the saved input's memory
  /// when the input has in_features columns.
  void rebind_input(Kokkos::View<const T*> x);
  /// Whether a forward of `rows` rows runs on fp8 tensor cores: an fp8
  /// policy (bf16 T) and a shape the fp8 GEMMs take.
  bool fp8_runs(std::int64_t rows) const;
  /// y = gelu(pre) W^T + b on the fp8 path, GELU applied as `pre` is
  /// quantized: the GELU output is never written, in forward or in backward
  /// (which casts gelu(pre)^T from the saved pre, so pre must hold its
  /// values until then). For the second Linear of an MLP whose first wrote
  /// only its pre-activation. Only where fp8_runs(shape.rows()), else
  /// kshard::Error.
  void forward_fp8_of_gelu(Kokkos::View<const T*> pre, ActShape shape, const ConstViews& params,
                           Kokkos::View<T*> y);
  /// backward() of a Linear whose output went through GELU (the first of an
  /// MLP), given dg, the gradient w.r.t. gelu(y), and `pre` = y: the output
  /// gradient is dg * gelu'(pre). On the fp8 path the casts of the gradient
  /// apply GELU's backward as they load it (it is never written); elsewhere
  /// gelu_backward writes it over dg first, then backward() runs.
  void backward_through_gelu(Kokkos::View<T*> dg, Kokkos::View<const T*> pre,
                             const ConstViews& params, const GradViews& grads, Kokkos::View<T*> dx);

 private:
  // Saves the forward's input and runs it on the fp8 path when the policy
  // and the shape allow (bf16 T): true when it did.
  bool save_and_try_fp8(Kokkos::View<const T*> x, ActShape shape, const ConstViews& params,
                        Fp8Epilogue e, Kokkos::View<T*> y, T* pre,
                        Fp8Input input = Fp8Input::x);

  std::int64_t in_, out_;
  bool bias_;
  bool saved_ = false;
  ActShape shape_{};
  Kokkos::View<const T*> x_;  // handle to the forward input
  Kokkos::View<T*> ones_;     // for the bias gradient GEMM
  std::unique_ptr<detail::Fp8Linear> fp8_;  // set by an fp8 policy (bf16 T only)
  bool fp8_forward_ = false;                // the saved forward ran in fp8
  Fp8Input fp8_input_ = Fp8Input::x;        // ... on x or on gelu(x)
};

#define KSHARD_LINEAR_EXTERN(T) extern template class Linear<T>;
KSHARD_FOR_EACH_COMPUTE_TYPE(KSHARD_LINEAR_EXTERN)
#undef KSHARD_LINEAR_EXTERN

}  // namespace kshard
