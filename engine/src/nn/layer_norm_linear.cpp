#include "kshard/engine/nn/layer_norm_linear.hpp"

namespace kshard {

template <class T>
LayerNormLinear<T>::LayerNormLinear(std::int64_t in_features, std::int64_t out_features,
                                    bool bias, double eps)
    : ln_(in_features, eps), fc_(in_features, out_features, bias) {}

template <class T>
std::vector<ParamSpec> LayerNormLinear<T>::param_specs() const {
  return subs_.specs();
}

template <class T>
void LayerNormLinear<T>::forward(Kokkos::View<const T*> x, ActShape shape,
                                 const ConstViews& params, Kokkos::View<T*> y) {
  detail::check_forward<T>(*this, x, shape, params, y);
  {
    // fc_'s input lives for this forward only; backward rebuilds it (the
    // same kernel on the same input: bitwise equal).
    auto h = detail::scratch<T>(shape.numel(), "kshard::LayerNormLinear::h");
    ln_.forward(x, shape, subs_.params("ln", params), h.view);
    fc_.forward(h.view, shape, subs_.params("", params), y);
  }
  x_ = x;
  shape_ = shape;
  saved_ = true;
}

template <class T>
void LayerNormLinear<T>::backward(Kokkos::View<const T*> dy, const ConstViews& params,
                                  const GradViews& grads, Kokkos::View<T*> dx) {
  detail::check_backward<T>(*this, saved_, shape_, dy, params, grads, dx);
  // One buffer: the rebuilt LayerNorm output, then (fc_ reads its input
  // before writing dx) the gradient w.r.t. it.
  auto h = detail::scratch<T>(shape_.numel(), "kshard::LayerNormLinear::h");
  ln_.forward(x_, shape_, subs_.params("ln", params), h.view);
  fc_.rebind_input(h.view);
  Kokkos::View<T*> dh = h.view;
  fc_.backward(dy, subs_.params("", params), subs_.grads("", grads), dh);
  ln_.backward(dh, subs_.params("ln", params), subs_.grads("ln", grads), dx);
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
