#include "kshard/kernels/swiglu.hpp"

#include "kshard/compat/for_each.hpp"
#include "kshard/compat/kokkos.hpp"

namespace kshard::detail {
namespace {

template <class A>
KOKKOS_INLINE_FUNCTION A sigmoid(A a) {
  return A(1) / (A(1) + compat::exp(-a));
}

}  // namespace

template <class T>
void swiglu_forward(Kokkos::View<const T*> x, Kokkos::View<T*> y, std::int64_t rows,
                    std::int64_t h) {
  using A = accum_t<T>;
  compat::for_each_index(
      "kshard::swiglu_forward", rows * h, KOKKOS_LAMBDA(std::int64_t i) {
        const std::int64_t r = i / h, j = i - r * h;
        const A a = to_accum(x(r * 2 * h + j)), b = to_accum(x(r * 2 * h + h + j));
        y(i) = from_accum<T>(a * sigmoid(a) * b);
      });
}

template <class T>
void swiglu_backward(Kokkos::View<const T*> x, Kokkos::View<const T*> dy, Kokkos::View<T*> dx,
                     std::int64_t rows, std::int64_t h) {
  using A = accum_t<T>;
  compat::for_each_index(
      "kshard::swiglu_backward", rows * h, KOKKOS_LAMBDA(std::int64_t i) {
        const std::int64_t r = i / h, j = i - r * h;
        const std::int64_t ia = r * 2 * h + j, ib = ia + h;
        const A a = to_accum(x(ia)), b = to_accum(x(ib)), g = to_accum(dy(i));
        const A s = sigmoid(a);
        dx(ia) = from_accum<T>(g * b * s * (A(1) + a * (A(1) - s)));
        dx(ib) = from_accum<T>(g * a * s);
      });
}

#define KSHARD_SWIGLU_INSTANTIATE(T)                                                           \
  template void swiglu_forward<T>(Kokkos::View<const T*>, Kokkos::View<T*>, std::int64_t,      \
                                  std::int64_t);                                               \
  template void swiglu_backward<T>(Kokkos::View<const T*>, Kokkos::View<const T*>,             \
                                   Kokkos::View<T*>, std::int64_t, std::int64_t);
KSHARD_FOR_EACH_COMPUTE_TYPE(KSHARD_SWIGLU_INSTANTIATE)
#undef KSHARD_SWIGLU_INSTANTIATE

}  // namespace kshard::detail
