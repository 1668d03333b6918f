#include "kshard/engine/gelu.hpp"
#include "kshard/compat/for_each.hpp"
#include "kshard/compat/kokkos.hpp"

#include "kshard/error.hpp"

namespace kshard {

namespace detail {

// tanh approximation (GPT-2's, PyTorch's approximate="tanh"), in accum_t<T>.
template <class T>
void gelu_forward(Kokkos::View<const T*> x, Kokkos::View<T*> y) {
  using A = accum_t<T>;
  compat::for_each_index(
      "kshard::gelu_forward", static_cast<std::int64_t>(y.extent(0)),
      KOKKOS_LAMBDA(std::int64_t i) {
        const A c = A(0.7978845608028654);  // sqrt(2 / pi)
        const A v = to_accum(x(i));
        const A t = compat::tanh(c * (v + A(0.044715) * v * v * v));
        y(i) = from_accum<T>(A(0.5) * v * (A(1) + t));
      });
}

template <class T>
void gelu_backward(Kokkos::View<const T*> x, Kokkos::View<const T*> dy, Kokkos::View<T*> dx) {
  using A = accum_t<T>;
  compat::for_each_index(
      "kshard::gelu_backward", static_cast<std::int64_t>(dx.extent(0)),
      KOKKOS_LAMBDA(std::int64_t i) {
        const A c = A(0.7978845608028654);
        const A v = to_accum(x(i));
        const A t = compat::tanh(c * (v + A(0.044715) * v * v * v));
        // d/dv [0.5 v (1 + t)] = 0.5 (1 + t) + 0.5 v (1 - t^2) c (1 + 3 * 0.044715 v^2)
        const A g = A(0.5) * (A(1) + t) +
                    A(0.5) * v * (A(1) - t * t) * c * (A(1) + A(3 * 0.044715) * v * v);
        dx(i) = from_accum<T>(to_accum(dy(i)) * g);
      });
}

#define KSHARD_GELU_INSTANTIATE(T)                                                  \
  template void gelu_forward<T>(Kokkos::View<const T*>, Kokkos::View<T*>);         \
  template void gelu_backward<T>(Kokkos::View<const T*>, Kokkos::View<const T*>,   \
                                 Kokkos::View<T*>);
KSHARD_FOR_EACH_COMPUTE_TYPE(KSHARD_GELU_INSTANTIATE)
#undef KSHARD_GELU_INSTANTIATE

}  // namespace detail

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
