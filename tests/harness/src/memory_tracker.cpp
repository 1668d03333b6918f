// Counts live Kokkos allocations through Kokkos' tool callbacks, so the
// per-test fixture can tell whether a test leaked memory. Allocations whose
// label starts with "kshard.cache:" are long-lived caches (communicator
// staging buffers) and are not counted.
#include <Kokkos_Core.hpp>

#include <atomic>
#include <cstring>
#include <map>
#include <mutex>

#include "run_state.hpp"

namespace kshard::testing::detail {
namespace {

std::atomic<std::int64_t> g_bytes{0};
std::atomic<std::int64_t> g_allocs{0};
std::mutex g_mu;
struct Alloc {
  std::string label;
  std::uint64_t size;
  std::uint64_t seq;
};
std::uint64_t g_seq = 0;
std::map<const void*, Alloc>& live() {
  static auto* m = new std::map<const void*, Alloc>;
  return *m;
}

bool exempt(const char* label) { return std::strncmp(label, "kshard.cache:", 13) == 0; }

void on_alloc(Kokkos::Profiling::SpaceHandle, const char* label, const void* ptr,
              std::uint64_t size) {
  if (exempt(label)) return;
  g_bytes += std::int64_t(size);
  ++g_allocs;
  std::lock_guard<std::mutex> lock(g_mu);
  live()[ptr] = Alloc{label, size, ++g_seq};
}

void on_free(Kokkos::Profiling::SpaceHandle, const char* label, const void* ptr,
             std::uint64_t size) {
  if (exempt(label)) return;
  g_bytes -= std::int64_t(size);
  --g_allocs;
  std::lock_guard<std::mutex> lock(g_mu);
  live().erase(ptr);
}

}  // namespace

void install_memory_tracker() {
  Kokkos::Tools::Experimental::set_allocate_data_callback(&on_alloc);
  Kokkos::Tools::Experimental::set_deallocate_data_callback(&on_free);
}

std::int64_t tracked_live_bytes() { return g_bytes.load(); }
std::int64_t tracked_live_allocs() { return g_allocs.load(); }

std::uint64_t tracked_alloc_seq() {
  std::lock_guard<std::mutex> lock(g_mu);
  return g_seq;
}

std::string tracked_live_labels(std::uint64_t since, std::size_t max_items) {
  std::lock_guard<std::mutex> lock(g_mu);
  std::string out;
  std::size_t n = 0;
  for (const auto& [ptr, v] : live()) {
    if (v.seq <= since) continue;
    if (n++ == max_items) {
      out += ", ...";
      break;
    }
    out += (out.empty() ? "" : ", ") + ("'" + v.label + "' " + std::to_string(v.size) + " B");
  }
  return out;
}

}  // namespace kshard::testing::detail
