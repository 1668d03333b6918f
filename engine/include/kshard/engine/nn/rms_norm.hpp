#pragma once
// RMSNorm over the last dimension (Llama's normalization; PyTorch's
// nn.RMSNorm): y = x / sqrt(mean(x^2) + eps) * gamma. No mean subtraction,
// no bias. gamma starts at ones.
//
//   kshard::RMSNorm<bfloat16_t> norm(4096, 1e-5);   // params: "gamma" [4096]
//   norm.forward(x, {batch, seq, 4096}, params, y);
//
// Each row's rstd is computed in accum_t<T> (f32 for 16-bit T) and kept for
// backward; backward writes dx per row and reduces dgamma = sum over rows of
// dy * xhat with a ones-vector GEMM into the f32 gradient, as LayerNorm does.
// On CUDA one warp per row with the row in registers
// (kernels/rms_norm_rows.hpp) where the width allows, else (and on the host)
// one Kokkos team per row.
#include "kshard/engine/nn/layer.hpp"

namespace kshard {

template <class T>
class RMSNorm final : public Layer<T> {
 public:
  using typename Layer<T>::ConstViews;
  using typename Layer<T>::GradViews;

  /// eps is added to mean(x^2) inside the square root (Llama: 1e-5 or 1e-6).
  explicit RMSNorm(std::int64_t features, double eps = 1e-5);

  std::string kind() const override { return "RMSNorm"; }
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
  Kokkos::View<A*> rstd_;       // [rows]
  Kokkos::View<A*> ones_acc_;   // for the dgamma column sums of dy * xhat
};

#define KSHARD_EXTERN_LAYER(T) extern template class RMSNorm<T>;
KSHARD_FOR_EACH_COMPUTE_TYPE(KSHARD_EXTERN_LAYER)
#undef KSHARD_EXTERN_LAYER

}  // namespace kshard
