// Host backend of elementwise_stream.hpp: the portable kernels already stream
// each array through the cache with the compiler free to vectorize the plain
// loops of Kokkos' host backends, so there is no second implementation here;
// the backend declines and the caller runs the portable kernel.
#include "kshard/kernels/elementwise_stream.hpp"

#include "kshard/numeric/compute.hpp"

namespace kshard::detail {

template <class T>
bool cast_from_f32_stream(const float*, T*, std::int64_t) {
  return false;
}
template <class T>
bool gelu_forward_stream(const T*, T*, std::int64_t) {
  return false;
}
template <class T>
bool gelu_backward_stream(const T*, const T*, T*, std::int64_t) {
  return false;
}
template <class T>
bool swiglu_forward_stream(const T*, T*, std::int64_t, std::int64_t) {
  return false;
}
template <class T>
bool swiglu_backward_stream(const T*, const T*, T*, std::int64_t, std::int64_t) {
  return false;
}
template <class T>
bool add_stream(const T*, const T*, T*, std::int64_t) {
  return false;
}
template <class T>
bool accumulate_with_stats_stream(const T*, float*, double*, std::int64_t, GradWrite) {
  return false;
}

KSHARD_FOR_EACH_COMPUTE_TYPE(KSHARD_INSTANTIATE_STREAM_COMPUTE)
KSHARD_INSTANTIATE_STREAM_STORAGE(float)
KSHARD_INSTANTIATE_STREAM_STORAGE(bfloat16_t)
KSHARD_INSTANTIATE_STREAM_STORAGE(float16_t)

}  // namespace kshard::detail
