#include "kshard/engine/nn/gelu.hpp"
#include "kshard/kernels/gelu.hpp"

#include "kshard/error.hpp"

namespace kshard {

template <class T>
Gelu<T>::Gelu(std::int64_t features) : d_(features) {
  if (d_ <= 0) throw Error("Gelu(" + std::to_string(d_) + ")", "features > 0");
}

template <class T>
void Gelu<T>::forward(Kokkos::View<const T*> x, ActShape shape, const ConstViews& params,
                      Kokkos::View<T*> y) {
  detail::check_forward<T>(*this, x, shape, params, y);
  detail::gelu_forward<T>(x, y);
  x_ = x;
  shape_ = shape;
  saved_ = true;
}

template <class T>
void Gelu<T>::backward(Kokkos::View<const T*> dy, const ConstViews& params, const GradViews& grads,
                       Kokkos::View<T*> dx) {
  detail::check_backward<T>(*this, saved_, shape_, dy, params, grads, dx);
  detail::gelu_backward<T>(x_, dy, dx);
}

template <class T>
void Gelu<T>::release() {
  x_ = {};
  saved_ = false;
}

#define KSHARD_INSTANTIATE_LAYER(T) template class Gelu<T>;
KSHARD_FOR_EACH_COMPUTE_TYPE(KSHARD_INSTANTIATE_LAYER)
#undef KSHARD_INSTANTIATE_LAYER

}  // namespace kshard
