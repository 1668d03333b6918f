#include "kshard/engine/nn/transformer_layer.hpp"

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
void TransformerLayer<T>::forward(Kokkos::View<const T*> x, ActShape shape,
                                  const ConstViews& params, Kokkos::View<T*> y) {
  detail::check_forward<T>(*this, x, shape, params, y);
  const std::int64_t n = shape.numel();
  detail::ensure_size(x1_, n, "kshard::TransformerLayer::x1");
  {
    // LN1's output (the qkv projection's input) and the attention output
    // (needed only for the residual sum) live in pool scratch for this
    // forward only; backward rebuilds LN1's output (see backward).
    auto h1 = detail::scratch<T>(n, "kshard::TransformerLayer::h1");
    ln1_.forward(x, shape, subs_.params("ln1", params), h1.view);
    auto a = detail::scratch<T>(n, "kshard::TransformerLayer::a");
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
void TransformerLayer<T>::backward(Kokkos::View<const T*> dy, const ConstViews& params,
                                   const GradViews& grads, Kokkos::View<T*> dx) {
  detail::check_backward<T>(*this, saved_, shape_, dy, params, grads, dx);
  const std::int64_t n = shape_.numel();
  auto dx1s = detail::scratch<T>(n, "kshard::TransformerLayer::dx1");
  auto dhs = detail::scratch<T>(n, "kshard::TransformerLayer::dh");
  Kokkos::View<T*> dx1 = dx1s.view, dh = dhs.view;
  // y = x1 + mlp(x1): dx1 = dy + mlp'(dy)
  mlp_.backward(dy, subs_.params("mlp", params), subs_.grads("mlp", grads), dx1);
  detail::add<T>(dx1, dy, dx1);
  // x1 = x + attn(ln1(x)): dx = dx1 + ln1'(attn'(dx1)). LN1's output again,
  // by the same kernel on the same input: bitwise the forward's.
  auto h1 = detail::scratch<T>(n, "kshard::TransformerLayer::h1");
  ln1_.forward(x_, shape_, subs_.params("ln1", params), h1.view);
  attn_.rebind_input(h1.view);
  attn_.backward(dx1, subs_.params("attn", params), subs_.grads("attn", grads), dh);
  ln1_.backward(dh, subs_.params("ln1", params), subs_.grads("ln1", grads), dx);
  detail::add<T>(dx, dx1, dx);
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
