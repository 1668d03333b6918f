#include "kshard/engine/nn/swiglu.hpp"

#include "kshard/error.hpp"
#include "kshard/kernels/swiglu.hpp"

namespace kshard {

template <class T>
SwiGLU<T>::SwiGLU(std::int64_t features) : h_(features) {
  if (h_ <= 0) throw Error("SwiGLU(" + std::to_string(h_) + ")", "features > 0");
}

template <class T>
void SwiGLU<T>::forward(Kokkos::View<const T*> x, ActShape shape, const ConstViews& params,
                        Kokkos::View<T*> y) {
  detail::check_forward<T>(*this, x, shape, params, y);
  detail::swiglu_forward<T>(x, y, shape.rows(), h_);
  x_ = x;
  shape_ = shape;
  saved_ = true;
}

template <class T>
void SwiGLU<T>::backward(Kokkos::View<const T*> dy, const ConstViews& params,
                         const GradViews& grads, Kokkos::View<T*> dx) {
  detail::check_backward<T>(*this, saved_, shape_, dy, params, grads, dx);
  detail::swiglu_backward<T>(x_, dy, dx, shape_.rows(), h_);
}

template <class T>
void SwiGLU<T>::release() {
  x_ = {};
  saved_ = false;
}

#define KSHARD_INSTANTIATE_LAYER(T) template class SwiGLU<T>;
KSHARD_FOR_EACH_COMPUTE_TYPE(KSHARD_INSTANTIATE_LAYER)
#undef KSHARD_INSTANTIATE_LAYER

}  // namespace kshard
