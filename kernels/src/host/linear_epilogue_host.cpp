// Host backend of linear_epilogue.hpp: CBLAS has no GEMM epilogue, so the
// layer runs the GEMM and then its bias (+ GELU) kernel.
#include "kshard/kernels/linear_epilogue.hpp"

#include "kshard/numeric/compute.hpp"

namespace kshard::detail {

template <class T>
bool linear_epilogue_backend(std::int64_t, std::int64_t, std::int64_t, const T*, const T*,
                             const T*, T*, LinearEpilogue, T*) {
  return false;
}

#define KSHARD_LINEAR_EPILOGUE_INSTANTIATE(T)                                                  \
  template bool linear_epilogue_backend<T>(std::int64_t, std::int64_t, std::int64_t, const T*, \
                                           const T*, const T*, T*, LinearEpilogue, T*);
KSHARD_FOR_EACH_COMPUTE_TYPE(KSHARD_LINEAR_EPILOGUE_INSTANTIATE)
#undef KSHARD_LINEAR_EPILOGUE_INSTANTIATE

}  // namespace kshard::detail
