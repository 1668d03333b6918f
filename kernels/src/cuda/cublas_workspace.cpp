#include "cublas_workspace.hpp"

#include <cstdint>
#include <mutex>
#include <string>

#include <Kokkos_Core.hpp>

namespace kshard::detail {
namespace {

constexpr std::size_t kAlign = 256;

std::mutex g_mutex;
Kokkos::View<unsigned char*>* g_buffer = nullptr;

}  // namespace

void* cublas_workspace() {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (g_buffer == nullptr) {
    // A Kokkos allocation's data starts after its header, which is not always
    // 256-byte aligned: over-allocate and align the pointer up.
    g_buffer = new Kokkos::View<unsigned char*>(
        Kokkos::view_alloc(Kokkos::WithoutInitializing,
                           std::string("kshard.cache:workspace:cublas")),
        kCublasWorkspaceBytes + kAlign);
    Kokkos::push_finalize_hook([] {
      std::lock_guard<std::mutex> l(g_mutex);
      delete g_buffer;
      g_buffer = nullptr;
    });
  }
  const auto p = reinterpret_cast<std::uintptr_t>(g_buffer->data());
  return reinterpret_cast<void*>((p + kAlign - 1) / kAlign * kAlign);
}

}  // namespace kshard::detail
