#pragma once
// The host emulation's stand-in for kernels/src/cuda/cp_async.hpp
// (found first on the include path): the same names, copying synchronously.
#include <cstring>

namespace kshard::detail::ptx {

inline void cp_async16(void* dst, const void* src, bool valid) {
  if (valid) std::memcpy(dst, src, 16); else std::memset(dst, 0, 16);
}
inline void cp_async4(void* dst, const void* src, bool valid) {
  if (valid) std::memcpy(dst, src, 4); else std::memset(dst, 0, 4);
}
inline void cp_async_commit() {}
template <int N> inline void cp_async_wait() {}

}  // namespace kshard::detail::ptx
