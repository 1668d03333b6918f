#include "kshard/engine/nn/llama_layer.hpp"

namespace kshard {

template <class T>
LlamaLayer<T>::LlamaLayer(const LlamaBlockConfig& c)
    : config_(c), d_(c.d_model), norm1_(c.d_model, c.norm_eps),
      attn_(c.d_model, c.heads, AttentionConfig{c.kv_heads, c.rope_theta, false}),
      mlp_(c.d_model, c.ffn, c.norm_eps) {}

template <class T>
void LlamaLayer<T>::forward(Kokkos::View<const T*> x, ActShape shape, const ConstViews& params,
                            Kokkos::View<T*> y) {
  detail::check_forward<T>(*this, x, shape, params, y);
  const std::int64_t n = shape.numel();
  detail::ensure_size(x1_, n, "kshard::LlamaLayer::x1");
  {
    auto h1 = detail::scratch<T>(n, "kshard::LlamaLayer::h1");
    norm1_.forward(x, shape, subs_.params("norm1", params), h1.view);
    auto a = detail::scratch<T>(n, "kshard::LlamaLayer::a");
    attn_.forward(h1.view, shape, subs_.params("attn", params), a.view);
    detail::add<T>(x, a.view, x1_);
  }
  x_ = x;
  mlp_.forward(x1_, shape, subs_.params("mlp", params), y);
  detail::add<T>(x1_, y, y);
  shape_ = shape;
  saved_ = true;
}

template <class T>
void LlamaLayer<T>::backward(Kokkos::View<const T*> dy, const ConstViews& params,
                             const GradViews& grads, Kokkos::View<T*> dx) {
  detail::check_backward<T>(*this, saved_, shape_, dy, params, grads, dx);
  const std::int64_t n = shape_.numel();
  auto dx1 = detail::scratch<T>(n, "kshard::LlamaLayer::dx1");
  auto dh = detail::scratch<T>(n, "kshard::LlamaLayer::dh");
  // y = x1 + mlp(x1): dx1 = dy + mlp'(dy)
  mlp_.backward(dy, subs_.params("mlp", params), subs_.grads("mlp", grads), dx1.view);
  detail::add<T>(dx1.view, dy, dx1.view);
  // x1 = x + attn(norm1(x)): norm1's output rebuilt (bitwise the forward's).
  auto h1 = detail::scratch<T>(n, "kshard::LlamaLayer::h1");
  norm1_.forward(x_, shape_, subs_.params("norm1", params), h1.view);
  attn_.rebind_input(h1.view);
  attn_.backward(dx1.view, subs_.params("attn", params), subs_.grads("attn", grads), dh.view);
  norm1_.backward(dh.view, subs_.params("norm1", params), subs_.grads("norm1", grads), dx);
  detail::add<T>(dx, dx1.view, dx);
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
