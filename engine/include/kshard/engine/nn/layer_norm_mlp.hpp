#pragma once
// LayerNormMLP: y = fc2(gelu(fc1(LayerNorm(x)))), d -> hidden -> d.
// No residual: the residual add belongs to TransformerLayer, so this layer
// stays a plain function of its input (and usable outside a transformer).
// Params, in order: "ln.gamma" [d], "ln.beta" [d], "fc1.weight" [hidden, d],
// "fc1.bias" [hidden], "fc2.weight" [d, hidden], "fc2.bias" [d].
//
//   kshard::LayerNormMLP<float> mlp(768, 3072);
//   mlp.forward(x, {batch, seq, 768}, params, y);
#include "kshard/engine/nn/layer_norm.hpp"
#include "kshard/engine/nn/linear.hpp"
#include "kshard/engine/nn/sub_layers.hpp"

namespace kshard {

template <class T>
class LayerNormMLP final : public Layer<T> {
 public:
  using typename Layer<T>::ConstViews;
  using typename Layer<T>::GradViews;

  LayerNormMLP(std::int64_t features, std::int64_t hidden, double eps = 1e-5);

  std::string kind() const override { return "LayerNormMLP"; }
  std::vector<ParamSpec> param_specs() const override;
  std::int64_t in_features() const override { return d_; }
  std::int64_t out_features() const override { return d_; }
  std::int64_t hidden_features() const { return hidden_; }

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

 private:
  std::int64_t d_, hidden_;
  LayerNorm<T> ln_;
  Linear<T> fc1_, fc2_;
  SubLayers<T> subs_{{"ln", &ln_}, {"fc1", &fc1_}, {"fc2", &fc2_}};
  bool saved_ = false;
  ActShape shape_{};
  // The forward input (the LayerNorm's, kept by the caller for its backward
  // anyway): the LayerNorm output is rebuilt from it in backward, not saved.
  Kokkos::View<const T*> x_;
  Kokkos::View<T*> a_;   // fc1 output, GELU input [rows, hidden]
  bool gelu_in_fc2_ = false;  // the forward's fc2 ran on fp8 with GELU in its casts
};

#define KSHARD_EXTERN_LAYER(T) extern template class LayerNormMLP<T>;
KSHARD_FOR_EACH_COMPUTE_TYPE(KSHARD_EXTERN_LAYER)
#undef KSHARD_EXTERN_LAYER

}  // namespace kshard
