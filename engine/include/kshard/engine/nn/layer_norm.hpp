#pragma once
// LayerNorm over the last dimension: y = (x - mean) / sqrt(var + eps) * gamma + beta,
// with the biased variance (PyTorch's nn.LayerNorm). gamma starts at ones, beta at zeros.
//
//   kshard::LayerNorm<float> ln(768);             // params: "gamma" [768], "beta" [768]
//   ln.forward(x, {batch, seq, 768}, params, y);
//
// One Kokkos team per row computes the row statistics (in accum_t<T>: f32
// for 16-bit T); backward writes dx per row and reduces dgamma/dbeta over rows
// with ones-vector GEMMs into the f32 gradients.
#include "kshard/engine/nn/layer.hpp"

namespace kshard {

template <class T>
class LayerNorm final : public Layer<T> {
 public:
  using typename Layer<T>::ConstViews;
  using typename Layer<T>::GradViews;

  explicit LayerNorm(std::int64_t features, double eps = 1e-5);

  std::string kind() const override { return "LayerNorm"; }
  std::vector<ParamSpec> param_specs() const override;
  std::int64_t in_features() const override { return d_; }
  std::int64_t out_features() const override { return d_; }
  double eps() const { return eps_; }

  void forward(Kokkos::View<const T*> x, ActShape shape, const ConstViews& params,
               Kokkos::View<T*> y) override;
  void backward(Kokkos::View<const T*> dy, const ConstViews& params, const GradViews& grads,
                Kokkos::View<T*> dx) override;
  void release() override;
  bool rows_independent() const override { return true; }
  bool assigns_grads() const override { return true; }

 private:
  std::int64_t d_;
  double eps_;
  bool saved_ = false;
  ActShape shape_{};
  Kokkos::View<const T*> x_;
  using A = accum_t<T>;
  Kokkos::View<A*> mean_, rstd_;  // [rows], row statistics in the accumulation type
  Kokkos::View<T*> ones_;         // for the dbeta column sums of dy (T)
  Kokkos::View<A*> ones_acc_;     // for the dgamma column sums of dy_xhat (A)
};

#define KSHARD_EXTERN_LAYER(T) extern template class LayerNorm<T>;
KSHARD_FOR_EACH_COMPUTE_TYPE(KSHARD_EXTERN_LAYER)
#undef KSHARD_EXTERN_LAYER

}  // namespace kshard
