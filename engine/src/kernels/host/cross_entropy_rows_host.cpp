// Host backend of cross_entropy_rows.hpp: the portable Kokkos kernel of
// loss.cpp serves the host; the backend declines.
#include "../cross_entropy_rows.hpp"

#include <cstdint>

#include "kshard/numeric/compute.hpp"

namespace kshard::detail {

template <class T, class Target>
bool cross_entropy_rows(const T*, std::int64_t, std::int64_t, const Target*, T*, double,
                        const double*, double*) {
  return false;
}

#define KSHARD_CE_ROWS_INSTANTIATE(T, Target)                                                  \
  template bool cross_entropy_rows<T, Target>(const T*, std::int64_t, std::int64_t,           \
                                              const Target*, T*, double, const double*, double*);
// The (logits, target) pairs loss.cpp instantiates.
KSHARD_CE_ROWS_INSTANTIATE(float, std::int32_t)
KSHARD_CE_ROWS_INSTANTIATE(float, std::int64_t)
KSHARD_CE_ROWS_INSTANTIATE(float, float)
KSHARD_CE_ROWS_INSTANTIATE(double, std::int32_t)
KSHARD_CE_ROWS_INSTANTIATE(double, std::int64_t)
KSHARD_CE_ROWS_INSTANTIATE(double, double)
KSHARD_CE_ROWS_INSTANTIATE(bfloat16_t, std::int32_t)
KSHARD_CE_ROWS_INSTANTIATE(float16_t, std::int32_t)
#undef KSHARD_CE_ROWS_INSTANTIATE

}  // namespace kshard::detail
