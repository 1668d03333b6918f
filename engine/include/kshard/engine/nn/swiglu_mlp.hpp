#pragma once
// SwiGLUMLP: Llama's MLP with its pre-norm, y = down(swiglu(gate_up(RMSNorm(x)))),
// d -> 2 x ffn (gate and up in ONE GEMM) -> ffn -> d, no biases (TE's
// LayerNormMLP with normalization="RMSNorm", activation="swiglu", bias=False).
// No residual (the block adds it). Params, in order: "norm.gamma" [d],
// "gate_up.weight" [2 ffn, d] (rows 0..ffn-1 the gate, ffn..2ffn-1 the up
// projection), "down.weight" [d, ffn].
//
//   kshard::SwiGLUMLP<bfloat16_t> mlp(2048, 5632);
//   mlp.forward(x, {batch, seq, 2048}, params, y);
//
// Saved for backward: the gate/up output [rows, 2 ffn]; the RMSNorm output
// and the SwiGLU output are rebuilt from the input and from it (the same
// kernels, bitwise the forward's values) instead of kept.
#include "kshard/engine/nn/linear.hpp"
#include "kshard/engine/nn/rms_norm.hpp"
#include "kshard/engine/nn/sub_layers.hpp"
#include "kshard/engine/nn/swiglu.hpp"

namespace kshard {

template <class T>
class SwiGLUMLP final : public Layer<T> {
 public:
  using typename Layer<T>::ConstViews;
  using typename Layer<T>::GradViews;

  SwiGLUMLP(std::int64_t features, std::int64_t ffn, double eps = 1e-5);

  std::string kind() const override { return "SwiGLUMLP"; }
  std::vector<ParamSpec> param_specs() const override { return subs_.specs(); }
  std::int64_t in_features() const override { return d_; }
  std::int64_t out_features() const override { return d_; }
  std::int64_t ffn_features() const { return ffn_; }

  void forward(Kokkos::View<const T*> x, ActShape shape, const ConstViews& params,
               Kokkos::View<T*> y) override;
  void backward(Kokkos::View<const T*> dy, const ConstViews& params, const GradViews& grads,
                Kokkos::View<T*> dx) override;
  void release() override;
  void set_fp8_policy(const Fp8Policy& p) override { subs_.set_fp8_policy(p); }
  bool assigns_grads() const override { return subs_.assigns_grads(); }
  void set_grad_write(GradWrite w) override { subs_.set_grad_write(w); }
  void fp8_scales(std::vector<Fp8Scale*>& out) override { subs_.fp8_scales(out); }
  bool rows_independent() const override { return true; }
  double saved_elements_per_row() const override { return 2.0 * double(d_) + 2.0 * double(ffn_); }

 private:
  std::int64_t d_, ffn_;
  RMSNorm<T> norm_;
  Linear<T> gate_up_, down_;
  SwiGLU<T> act_;
  SubLayers<T> subs_{{"norm", &norm_}, {"gate_up", &gate_up_}, {"down", &down_}};
  bool saved_ = false;
  ActShape shape_{};
  Kokkos::View<const T*> x_;  // the input (the caller keeps it)
  Kokkos::View<T*> a_;        // gate_up's output [rows, 2 ffn]
};

#define KSHARD_EXTERN_LAYER(T) extern template class SwiGLUMLP<T>;
KSHARD_FOR_EACH_COMPUTE_TYPE(KSHARD_EXTERN_LAYER)
#undef KSHARD_EXTERN_LAYER

}  // namespace kshard
