#include "kshard/kernels/swiglu.hpp"

#include "kshard/compat/for_each.hpp"
#include "kshard/compat/kokkos.hpp"
#include "kshard/kernels/elementwise_stream.hpp"
#include "pointwise.hpp"

namespace kshard::detail {

template <class T>
void swiglu_forward(Kokkos::View<const T*> x, Kokkos::View<T*> y, std::int64_t rows,
                    std::int64_t h) {
  using A = accum_t<T>;
  // The backend's vectorized kernel where it has one (same formula, same bits).
  if (swiglu_forward_stream<T>(x.data(), y.data(), rows, h)) return;
  compat::for_each_index(
      "kshard::swiglu_forward", rows * h, KOKKOS_LAMBDA(std::int64_t i) {
        const std::int64_t r = i / h, j = i - r * h;
        const A a = to_accum(x(r * 2 * h + j)), b = to_accum(x(r * 2 * h + h + j));
        y(i) = from_accum<T>(pointwise::swiglu(a, b));
      });
}

template <class T>
void swiglu_backward(Kokkos::View<const T*> x, Kokkos::View<const T*> dy, Kokkos::View<T*> dx,
                     std::int64_t rows, std::int64_t h) {
  using A = accum_t<T>;
  if (swiglu_backward_stream<T>(x.data(), dy.data(), dx.data(), rows, h)) return;
  compat::for_each_index(
      "kshard::swiglu_backward", rows * h, KOKKOS_LAMBDA(std::int64_t i) {
        const std::int64_t r = i / h, j = i - r * h;
        const std::int64_t ia = r * 2 * h + j, ib = ia + h;
        const A a = to_accum(x(ia)), b = to_accum(x(ib)), g = to_accum(dy(i));
        A da, db;
        pointwise::swiglu_grads(a, b, g, da, db);
        dx(ia) = from_accum<T>(da);
        dx(ib) = from_accum<T>(db);
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
