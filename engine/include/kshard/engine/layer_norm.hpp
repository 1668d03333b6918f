#pragma once
// LayerNorm over the last dimension: y = (x - mean) / sqrt(var + eps) * gamma + beta,
// with the biased variance (PyTorch's nn.LayerNorm). gamma starts at ones, beta at zeros.
//
//   kshard::LayerNorm<float> ln(768);             // params: "gamma" [768], "beta" [768]
//   ln.forward(x, {batch, seq, 768}, params, y);
//
// One Kokkos team per row computes the row statistics; backward writes
// dx per row and reduces dgamma/dbeta over rows with ones-vector GEMMs.
#include "kshard/engine/layer.hpp"

namespace kshard {

template <class T>
class LayerNorm final : public Layer<T> {
 public:
  using typename Layer<T>::ConstViews;
  using typename Layer<T>::Views;

  explicit LayerNorm(std::int64_t features, double eps = 1e-5);

  std::string kind() const override { return "LayerNorm"; }
  std::vector<ParamSpec> param_specs() const override;
  std::int64_t in_features() const override { return d_; }
  std::int64_t out_features() const override { return d_; }
  double eps() const { return eps_; }

  void forward(Kokkos::View<const T*> x, ActShape shape, const ConstViews& params,
               Kokkos::View<T*> y) override;
  void backward(Kokkos::View<const T*> dy, const ConstViews& params, const Views& grads,
                Kokkos::View<T*> dx) override;
  void release() override;

 private:
  std::int64_t d_;
  double eps_;
  bool saved_ = false;
  ActShape shape_{};
  Kokkos::View<const T*> x_;
  Kokkos::View<T*> mean_, rstd_;  // [rows]
  Kokkos::View<T*> dy_xhat_;      // backward workspace [rows, d]
  Kokkos::View<T*> ones_;
};

extern template class LayerNorm<float>;
extern template class LayerNorm<double>;

}  // namespace kshard
