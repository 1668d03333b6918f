// Host backend of cross_entropy_rows.hpp: the portable Kokkos kernel of
// loss.cpp serves the host; the backend declines.
#include "kshard/kernels/cross_entropy_rows.hpp"

#include <cstdint>

#include "kshard/numeric/compute.hpp"

namespace kshard::detail {

template <class T, class Target>
bool cross_entropy_rows(const T*, std::int64_t, std::int64_t, const Target*, T*, double,
                        const double*, double*) {
  return false;
}

KSHARD_FOR_EACH_CE_PAIR(KSHARD_INSTANTIATE_CE_ROWS)

}  // namespace kshard::detail
