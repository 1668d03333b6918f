#include "kshard/kernels/gelu.hpp"
#include "kshard/compat/for_each.hpp"
#include "kshard/compat/kokkos.hpp"
#include "kshard/kernels/elementwise_stream.hpp"
#include "pointwise.hpp"

namespace kshard {

namespace detail {

// tanh approximation (GPT-2's, PyTorch's approximate="tanh"), in accum_t<T>.
template <class T>
void gelu_forward(Kokkos::View<const T*> x, Kokkos::View<T*> y) {
  using A = accum_t<T>;
  if (gelu_forward_stream<T>(x.data(), y.data(), std::int64_t(y.extent(0)))) return;
  compat::for_each_index(
      "kshard::gelu_forward", static_cast<std::int64_t>(y.extent(0)),
      KOKKOS_LAMBDA(std::int64_t i) { y(i) = from_accum<T>(pointwise::gelu<A>(to_accum(x(i)))); });
}

template <class T>
void gelu_backward(Kokkos::View<const T*> x, Kokkos::View<const T*> dy, Kokkos::View<T*> dx) {
  using A = accum_t<T>;
  if (gelu_backward_stream<T>(x.data(), dy.data(), dx.data(), std::int64_t(dx.extent(0)))) return;
  compat::for_each_index(
      "kshard::gelu_backward", static_cast<std::int64_t>(dx.extent(0)),
      KOKKOS_LAMBDA(std::int64_t i) {
        dx(i) = from_accum<T>(to_accum(dy(i)) * pointwise::gelu_slope<A>(to_accum(x(i))));
      });
}

#define KSHARD_GELU_INSTANTIATE(T)                                                  \
  template void gelu_forward<T>(Kokkos::View<const T*>, Kokkos::View<T*>);         \
  template void gelu_backward<T>(Kokkos::View<const T*>, Kokkos::View<const T*>,   \
                                 Kokkos::View<T*>);
KSHARD_FOR_EACH_COMPUTE_TYPE(KSHARD_GELU_INSTANTIATE)
#undef KSHARD_GELU_INSTANTIATE

}  // namespace detail

}  // namespace kshard
