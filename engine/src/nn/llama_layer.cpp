#include "kshard/engine/nn/llama_layer.hpp"

#include "pre_norm_block.hpp"

namespace kshard {

template <class T>
LlamaLayer<T>::LlamaLayer(const LlamaBlockConfig& c)
    : config_(c), d_(c.d_model), norm1_(c.d_model, c.norm_eps),
      attn_(c.d_model, c.heads, AttentionConfig{c.kv_heads, c.rope_theta, false}),
      mlp_(c.d_model, c.ffn, c.norm_eps) {}

template <class T>
detail::PreNormBlock<T> LlamaLayer<T>::block() {
  return {norm1_, attn_, mlp_, subs_, "norm1", "attn", "mlp"};
}

template <class T>
void LlamaLayer<T>::forward(Kokkos::View<const T*> x, ActShape shape, const ConstViews& params,
                            Kokkos::View<T*> y) {
  detail::check_forward<T>(*this, x, shape, params, y);
  detail::ensure_size(x1_, shape.numel(), "kshard::LlamaLayer::x1");
  block().forward(x, shape, params, x1_, y);
  x_ = x;
  shape_ = shape;
  saved_ = true;
}

template <class T>
void LlamaLayer<T>::backward(Kokkos::View<const T*> dy, const ConstViews& params,
                             const GradViews& grads, Kokkos::View<T*> dx) {
  detail::check_backward<T>(*this, saved_, shape_, dy, params, grads, dx);
  block().backward(x_, shape_, dy, params, grads, dx);
}

template <class T>
void LlamaLayer<T>::decode(Kokkos::View<const T*> x, ActShape shape, const ConstViews& params,
                           Kokkos::View<T*> y, DecodeStep<T>& step) {
  detail::check_forward<T>(*this, x, shape, params, y);
  release();
  block().decode(x, shape, params, y, step);
}

template <class T>
void LlamaLayer<T>::release() {
  norm1_.release();
  attn_.release();
  mlp_.release();
  x_ = {};
  saved_ = false;
}

#define KSHARD_INSTANTIATE_LAYER(T) template class LlamaLayer<T>;
KSHARD_FOR_EACH_COMPUTE_TYPE(KSHARD_INSTANTIATE_LAYER)
#undef KSHARD_INSTANTIATE_LAYER

}  // namespace kshard
