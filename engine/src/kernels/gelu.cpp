#include "kshard/engine/kernels/gelu.hpp"
#include "kshard/compat/for_each.hpp"
#include "kshard/compat/kokkos.hpp"
#include "elementwise_stream.hpp"

namespace kshard {

namespace detail {

// tanh approximation (GPT-2's, PyTorch's approximate="tanh"), in accum_t<T>.
template <class T>
void gelu_forward(Kokkos::View<const T*> x, Kokkos::View<T*> y) {
  using A = accum_t<T>;
  if (gelu_forward_stream<T>(x.data(), y.data(), std::int64_t(y.extent(0)))) return;
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
  if (gelu_backward_stream<T>(x.data(), dy.data(), dx.data(), std::int64_t(dx.extent(0)))) return;
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

}  // namespace kshard
