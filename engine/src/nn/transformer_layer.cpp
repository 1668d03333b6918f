#include "kshard/engine/nn/transformer_layer.hpp"

namespace kshard {

// Parameter slices of the three sub-layers, in spec order.
namespace {
constexpr std::size_t kLn1 = 0, kLn1N = 2, kAttn = 2, kAttnN = 4, kMlp = 6, kMlpN = 6;
}

template <class T>
TransformerLayer<T>::TransformerLayer(std::int64_t d_model, std::int64_t heads,
                                      std::int64_t d_ff, double eps)
    : d_(d_model), ln1_(d_model, eps), attn_(d_model, heads), mlp_(d_model, d_ff, eps) {}

template <class T>
std::vector<ParamSpec> TransformerLayer<T>::param_specs() const {
  std::vector<ParamSpec> s;
  detail::append_prefixed(s, "ln1.", ln1_.param_specs());
  detail::append_prefixed(s, "attn.", attn_.param_specs());
  detail::append_prefixed(s, "mlp.", mlp_.param_specs());
  return s;
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
    ln1_.forward(x, shape, detail::slice(params, kLn1, kLn1N), h1.view);
    auto a = detail::scratch<T>(n, "kshard::TransformerLayer::a");
    attn_.forward(h1.view, shape, detail::slice(params, kAttn, kAttnN), a.view);
    detail::add<T>(x, a.view, x1_);
  }
  x_ = x;
  mlp_.forward(x1_, shape, detail::slice(params, kMlp, kMlpN), y);
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
  mlp_.backward(dy, detail::slice(params, kMlp, kMlpN), detail::slice(grads, kMlp, kMlpN), dx1);
  detail::add<T>(dx1, dy, dx1);
  // x1 = x + attn(ln1(x)): dx = dx1 + ln1'(attn'(dx1)). LN1's output again,
  // by the same kernel on the same input: bitwise the forward's.
  auto h1 = detail::scratch<T>(n, "kshard::TransformerLayer::h1");
  ln1_.forward(x_, shape_, detail::slice(params, kLn1, kLn1N), h1.view);
  attn_.rebind_input(h1.view);
  attn_.backward(dx1, detail::slice(params, kAttn, kAttnN), detail::slice(grads, kAttn, kAttnN),
                 dh);
  ln1_.backward(dh, detail::slice(params, kLn1, kLn1N), detail::slice(grads, kLn1, kLn1N), dx);
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
