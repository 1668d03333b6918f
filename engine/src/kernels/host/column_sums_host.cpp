// Host backend of column_sums.hpp: the portable path (a GEMV against ones
// through OpenBLAS) is already one streaming pass on the host; the backend
// declines.
#include "../column_sums.hpp"

#include "kshard/numeric/compute.hpp"

namespace kshard::detail {

template <class U, class A>
bool column_sums_accumulate(const U*, std::int64_t, std::int64_t, A*) {
  return false;
}

KSHARD_FOR_EACH_COMPUTE_TYPE(KSHARD_INSTANTIATE_COLUMN_SUMS)

}  // namespace kshard::detail
