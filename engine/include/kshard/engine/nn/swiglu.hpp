#pragma once
// SwiGLU activation (Llama's MLP): the input row is [a | b] (2 x features:
// the gate and up projections side by side, from one fused GEMM) and the
// output y = silu(a) * b has `features` columns. No parameters. The kernels
// are kshard/kernels/swiglu.hpp.
//
//   kshard::SwiGLU<bfloat16_t> act(11008);     // in 22016, out 11008
//   act.forward(gate_up, {batch, seq, 22016}, {}, h);
#include "kshard/engine/nn/layer.hpp"

namespace kshard {

template <class T>
class SwiGLU final : public Layer<T> {
 public:
  using typename Layer<T>::ConstViews;
  using typename Layer<T>::GradViews;

  /// features: the output width (the input has twice as many).
  explicit SwiGLU(std::int64_t features);

  std::string kind() const override { return "SwiGLU"; }
  std::vector<ParamSpec> param_specs() const override { return {}; }
  std::int64_t in_features() const override { return 2 * h_; }
  std::int64_t out_features() const override { return h_; }

  void forward(Kokkos::View<const T*> x, ActShape shape, const ConstViews& params,
               Kokkos::View<T*> y) override;
  void backward(Kokkos::View<const T*> dy, const ConstViews& params, const GradViews& grads,
                Kokkos::View<T*> dx) override;
  void release() override;
  bool rows_independent() const override { return true; }

 private:
  std::int64_t h_;
  bool saved_ = false;
  ActShape shape_{};
  Kokkos::View<const T*> x_;
};

#define KSHARD_EXTERN_LAYER(T) extern template class SwiGLU<T>;
KSHARD_FOR_EACH_COMPUTE_TYPE(KSHARD_EXTERN_LAYER)
#undef KSHARD_EXTERN_LAYER

}  // namespace kshard
