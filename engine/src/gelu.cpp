#include "kshard/engine/gelu.hpp"
#include "kshard/compat/kokkos.hpp"

#include "kshard/error.hpp"

namespace kshard {

namespace detail {

template <class T>
void gelu_forward(Kokkos::View<const T*> x, Kokkos::View<T*> y) {
  Kokkos::parallel_for(
      "kshard::gelu_forward", Kokkos::RangePolicy<>(0, static_cast<std::int64_t>(y.extent(0))),
      KOKKOS_LAMBDA(std::int64_t i) {
        const T c = T(0.7978845608028654);  // sqrt(2 / pi)
        const T v = x(i);
        const T t = compat::tanh(c * (v + T(0.044715) * v * v * v));
        y(i) = T(0.5) * v * (T(1) + t);
      });
}

template <class T>
void gelu_backward(Kokkos::View<const T*> x, Kokkos::View<const T*> dy, Kokkos::View<T*> dx) {
  Kokkos::parallel_for(
      "kshard::gelu_backward", Kokkos::RangePolicy<>(0, static_cast<std::int64_t>(dx.extent(0))),
      KOKKOS_LAMBDA(std::int64_t i) {
        const T c = T(0.7978845608028654);
        const T v = x(i);
        const T t = compat::tanh(c * (v + T(0.044715) * v * v * v));
        // d/dv [0.5 v (1 + t)] = 0.5 (1 + t) + 0.5 v (1 - t^2) c (1 + 3 * 0.044715 v^2)
        const T g = T(0.5) * (T(1) + t) +
                    T(0.5) * v * (T(1) - t * t) * c * (T(1) + T(3 * 0.044715) * v * v);
        dx(i) = dy(i) * g;
      });
}

template void gelu_forward<float>(Kokkos::View<const float*>, Kokkos::View<float*>);
template void gelu_forward<double>(Kokkos::View<const double*>, Kokkos::View<double*>);
template void gelu_backward<float>(Kokkos::View<const float*>, Kokkos::View<const float*>,
                                   Kokkos::View<float*>);
template void gelu_backward<double>(Kokkos::View<const double*>, Kokkos::View<const double*>,
                                    Kokkos::View<double*>);

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
void Gelu<T>::backward(Kokkos::View<const T*> dy, const ConstViews& params, const Views& grads,
                       Kokkos::View<T*> dx) {
  detail::check_backward<T>(*this, saved_, shape_, dy, params, grads, dx);
  detail::gelu_backward<T>(x_, dy, dx);
}

template <class T>
void Gelu<T>::release() {
  x_ = {};
  saved_ = false;
}

template class Gelu<float>;
template class Gelu<double>;

}  // namespace kshard
