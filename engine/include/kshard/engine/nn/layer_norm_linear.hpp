#pragma once
// LayerNormLinear: y = Linear(LayerNorm(x)) as one layer (one FSDP unit's
// worth of parameters, like TransformerEngine's LayerNormLinear).
// Params, in order: "ln.gamma" [in], "ln.beta" [in], "weight" [out, in], "bias" [out].
//
//   kshard::LayerNormLinear<float> lnl(768, 2304);
//   lnl.forward(x, {batch, seq, 768}, params, y);
#include "kshard/engine/nn/layer_norm.hpp"
#include "kshard/engine/nn/linear.hpp"
#include "kshard/engine/nn/sub_layers.hpp"

namespace kshard {

template <class T>
class LayerNormLinear final : public Layer<T> {
 public:
  using typename Layer<T>::ConstViews;
  using typename Layer<T>::GradViews;

  LayerNormLinear(std::int64_t in_features, std::int64_t out_features, bool bias = true,
                  double eps = 1e-5);

  std::string kind() const override { return "LayerNormLinear"; }
  std::vector<ParamSpec> param_specs() const override;
  std::int64_t in_features() const override { return ln_.in_features(); }
  std::int64_t out_features() const override { return fc_.out_features(); }

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
  LayerNorm<T> ln_;
  Linear<T> fc_;
  // The Linear's names unprefixed ("weight", "bias"), as TE's LayerNormLinear.
  SubLayers<T> subs_{{"ln", &ln_}, {"", &fc_}};
  bool saved_ = false;
  ActShape shape_{};
  // The forward input (the LayerNorm's, kept by the caller for its backward
  // anyway): the LayerNorm output is rebuilt from it in backward, not saved.
  Kokkos::View<const T*> x_;
};

#define KSHARD_EXTERN_LAYER(T) extern template class LayerNormLinear<T>;
KSHARD_FOR_EACH_COMPUTE_TYPE(KSHARD_EXTERN_LAYER)
#undef KSHARD_EXTERN_LAYER

}  // namespace kshard
