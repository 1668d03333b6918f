// Host fused-attention backend: the portable Kokkos kernel for every type
// (there are no tensor cores to dispatch to).
#include "kshard/engine/flash_attention.hpp"

namespace kshard::detail {

template <class T>
void flash_attention_forward_backend(const FlashArgs<T>& a) {
  flash_attention_forward_portable<T>(a);
}

template <class T>
void flash_attention_backward_backend(const FlashArgs<T>& a) {
  flash_attention_backward_portable<T>(a);
}

template <class T>
bool flash_attention_uses_tensor_cores(const FlashArgs<T>&) {
  return false;
}

#define KSHARD_FLASH_HOST_INSTANTIATE(T)                                      \
  template void flash_attention_forward_backend<T>(const FlashArgs<T>&);      \
  template void flash_attention_backward_backend<T>(const FlashArgs<T>&);     \
  template bool flash_attention_uses_tensor_cores<T>(const FlashArgs<T>&);
KSHARD_FLASH_HOST_INSTANTIATE(float)
KSHARD_FLASH_HOST_INSTANTIATE(double)
KSHARD_FLASH_HOST_INSTANTIATE(bfloat16_t)
KSHARD_FLASH_HOST_INSTANTIATE(float16_t)
#undef KSHARD_FLASH_HOST_INSTANTIATE

}  // namespace kshard::detail
