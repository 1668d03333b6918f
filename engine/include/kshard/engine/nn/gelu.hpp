#pragma once
// GELU, tanh approximation (PyTorch's approximate="tanh", GPT-2's):
//   y = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
// No parameters; in_features == out_features == features. The kernels are
// kshard/kernels/gelu.hpp.
//
//   kshard::Gelu<float> act(3072);
//   act.forward(h, {batch, seq, 3072}, {}, g);
#include "kshard/engine/nn/layer.hpp"

namespace kshard {

template <class T>
class Gelu final : public Layer<T> {
 public:
  using typename Layer<T>::ConstViews;
  using typename Layer<T>::GradViews;

  explicit Gelu(std::int64_t features);

  std::string kind() const override { return "Gelu"; }
  std::vector<ParamSpec> param_specs() const override { return {}; }
  std::int64_t in_features() const override { return d_; }
  std::int64_t out_features() const override { return d_; }

  void forward(Kokkos::View<const T*> x, ActShape shape, const ConstViews& params,
               Kokkos::View<T*> y) override;
  void backward(Kokkos::View<const T*> dy, const ConstViews& params, const GradViews& grads,
                Kokkos::View<T*> dx) override;
  void release() override;
  bool rows_independent() const override { return true; }

 private:
  std::int64_t d_;
  bool saved_ = false;
  ActShape shape_{};
  Kokkos::View<const T*> x_;
};

#define KSHARD_EXTERN_LAYER(T) extern template class Gelu<T>;
KSHARD_FOR_EACH_COMPUTE_TYPE(KSHARD_EXTERN_LAYER)
#undef KSHARD_EXTERN_LAYER

}  // namespace kshard
