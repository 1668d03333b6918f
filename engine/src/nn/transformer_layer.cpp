#include "kshard/engine/nn/transformer_layer.hpp"

#include "pre_norm_block.hpp"

namespace kshard {

template <class T>
TransformerLayer<T>::TransformerLayer(std::int64_t d_model, std::int64_t heads,
                                      std::int64_t d_ff, double eps)
    : d_(d_model), ln1_(d_model, eps), attn_(d_model, heads), mlp_(d_model, d_ff, eps) {}

template <class T>
std::vector<ParamSpec> TransformerLayer<T>::param_specs() const {
  return subs_.specs();
}

template <class T>
detail::PreNormBlock<T> TransformerLayer<T>::block() {
  return {ln1_, attn_, mlp_, subs_, "ln1", "attn", "mlp"};
}

template <class T>
void TransformerLayer<T>::forward(Kokkos::View<const T*> x, ActShape shape,
                                  const ConstViews& params, Kokkos::View<T*> y) {
  detail::check_forward<T>(*this, x, shape, params, y);
  detail::ensure_size(x1_, shape.numel(), "kshard::TransformerLayer::x1");
  block().forward(x, shape, params, x1_, y);
  x_ = x;
  shape_ = shape;
  saved_ = true;
}

template <class T>
void TransformerLayer<T>::backward(Kokkos::View<const T*> dy, const ConstViews& params,
                                   const GradViews& grads, Kokkos::View<T*> dx) {
  detail::check_backward<T>(*this, saved_, shape_, dy, params, grads, dx);
  block().backward(x_, shape_, dy, params, grads, dx);
}

template <class T>
void TransformerLayer<T>::decode(Kokkos::View<const T*> x, ActShape shape,
                                 const ConstViews& params, Kokkos::View<T*> y,
                                 DecodeStep<T>& step) {
  detail::check_forward<T>(*this, x, shape, params, y);
  release();
  block().decode(x, shape, params, y, step);
}

template <class T>
void TransformerLayer<T>::release() {
  ln1_.release();
  attn_.release();
  mlp_.release();
  x_ = {};
  saved_ = false;
}

#define KSHARD_INSTANTIATE_LAYER(T) template class TransformerLayer<T>;
KSHARD_FOR_EACH_COMPUTE_TYPE(KSHARD_INSTANTIATE_LAYER)
#undef KSHARD_INSTANTIATE_LAYER

}  // namespace kshard
