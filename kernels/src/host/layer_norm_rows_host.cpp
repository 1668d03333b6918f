// Host backend of layer_norm_rows.hpp: the portable Kokkos kernels of
// layer_norm.cpp already stream each row through the cache once per pass on
// the host, so there is no second implementation here; the backend declines.
#include "kshard/kernels/layer_norm_rows.hpp"

#include "kshard/numeric/compute.hpp"

namespace kshard::detail {

template <class T, class A>
bool layer_norm_forward_rows(const T*, const T*, const T*, T*, A*, A*, std::int64_t,
                             std::int64_t, double) {
  return false;
}

template <class T, class A>
bool layer_norm_backward_rows(const T*, const T*, const T*, const A*, const A*, T*, A*,
                              std::int64_t, std::int64_t) {
  return false;
}

KSHARD_FOR_EACH_COMPUTE_TYPE(KSHARD_INSTANTIATE_LN_ROWS)

}  // namespace kshard::detail
