#include "kshard/engine/nn/layer_norm_linear.hpp"

namespace kshard {

template <class T>
LayerNormLinear<T>::LayerNormLinear(std::int64_t in_features, std::int64_t out_features,
                                    bool bias, double eps)
    : ln_(in_features, eps), fc_(in_features, out_features, bias) {}

template <class T>
std::vector<ParamSpec> LayerNormLinear<T>::param_specs() const {
  std::vector<ParamSpec> s;
  detail::append_prefixed(s, "ln.", ln_.param_specs());
  detail::append_prefixed(s, "", fc_.param_specs());
  return s;
}

template <class T>
void LayerNormLinear<T>::forward(Kokkos::View<const T*> x, ActShape shape,
                                 const ConstViews& params, Kokkos::View<T*> y) {
  detail::check_forward<T>(*this, x, shape, params, y);
  const std::size_t nfc = params.size() - 2;
  {
    // fc_'s input lives for this forward only; backward rebuilds it (the
    // same kernel on the same input: bitwise equal).
    auto h = detail::scratch<T>(shape.numel(), "kshard::LayerNormLinear::h");
    ln_.forward(x, shape, detail::slice(params, 0, 2), h.view);
    fc_.forward(h.view, shape, detail::slice(params, 2, nfc), y);
  }
  x_ = x;
  shape_ = shape;
  saved_ = true;
}

template <class T>
void LayerNormLinear<T>::backward(Kokkos::View<const T*> dy, const ConstViews& params,
                                  const GradViews& grads, Kokkos::View<T*> dx) {
  detail::check_backward<T>(*this, saved_, shape_, dy, params, grads, dx);
  const std::size_t nfc = params.size() - 2;
  // One buffer: the rebuilt LayerNorm output, then (fc_ reads its input
  // before writing dx) the gradient w.r.t. it.
  auto h = detail::scratch<T>(shape_.numel(), "kshard::LayerNormLinear::h");
  ln_.forward(x_, shape_, detail::slice(params, 0, 2), h.view);
  fc_.rebind_input(h.view);
  Kokkos::View<T*> dh = h.view;
  fc_.backward(dy, detail::slice(params, 2, nfc), detail::slice(grads, 2, nfc), dh);
  ln_.backward(dh, detail::slice(params, 0, 2), detail::slice(grads, 0, 2), dx);
}

template <class T>
void LayerNormLinear<T>::release() {
  ln_.release();
  fc_.release();
  x_ = {};
  saved_ = false;
}

#define KSHARD_INSTANTIATE_LAYER(T) template class LayerNormLinear<T>;
KSHARD_FOR_EACH_COMPUTE_TYPE(KSHARD_INSTANTIATE_LAYER)
#undef KSHARD_INSTANTIATE_LAYER

}  // namespace kshard
