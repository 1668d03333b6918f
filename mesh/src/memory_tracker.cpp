#include "kshard/mesh/memory_tracker.hpp"

#include <Kokkos_Core.hpp>

#include <atomic>
#include <cstring>
#include <map>
#include <mutex>

namespace kshard::memory {
namespace {

struct Alloc {
  std::string label;
  std::uint64_t size;
  std::uint64_t seq;
};

struct Registry {
  std::mutex mu;
  std::map<const void*, Alloc> live;
  std::uint64_t seq = 0;
  Stats s;
  bool installed = false;
};
Registry& reg() {
  static Registry* r = new Registry;  // never destroyed: Views may die after static destructors
  return *r;
}

// Long-lived caches: ours, and Kokkos' own internal buffers (team scratch,
// reduction scratch), which it keeps from the first kernel that needs them.
bool is_cache(const char* label) {
  return std::strncmp(label, "kshard.cache:", 13) == 0 || std::strncmp(label, "Kokkos::", 8) == 0;
}

void add_live(Registry& r, const char* label, const void* ptr, std::uint64_t size) {
  r.s.live_bytes += std::int64_t(size);
  ++r.s.live_allocs;
  if (r.s.live_bytes > r.s.peak_bytes) r.s.peak_bytes = r.s.live_bytes;
  r.live[ptr] = Alloc{label, size, ++r.seq};
}

void remove_live(Registry& r, const void* ptr, std::uint64_t size) {
  if (r.live.erase(ptr) == 0) return;  // allocated before install()
  r.s.live_bytes -= std::int64_t(size);
  --r.s.live_allocs;
}

void on_alloc(Kokkos::Profiling::SpaceHandle, const char* label, const void* ptr,
              std::uint64_t size) {
  Registry& r = reg();
  std::lock_guard<std::mutex> lock(r.mu);
  if (is_cache(label)) {
    r.s.cache_bytes += std::int64_t(size);
    return;
  }
  add_live(r, label, ptr, size);
}

void on_free(Kokkos::Profiling::SpaceHandle, const char* label, const void* ptr,
             std::uint64_t size) {
  Registry& r = reg();
  std::lock_guard<std::mutex> lock(r.mu);
  if (is_cache(label)) {
    r.s.cache_bytes -= std::int64_t(size);
    return;
  }
  remove_live(r, ptr, size);
}

}  // namespace

void install() {
  Registry& r = reg();
  std::lock_guard<std::mutex> lock(r.mu);
  if (r.installed) return;
  Kokkos::Tools::Experimental::set_allocate_data_callback(&on_alloc);
  Kokkos::Tools::Experimental::set_deallocate_data_callback(&on_free);
  r.installed = true;
}

bool installed() noexcept { return reg().installed; }

void note_acquire(const char* label, const void* ptr, std::uint64_t size) {
  Registry& r = reg();
  std::lock_guard<std::mutex> lock(r.mu);
  if (r.installed) add_live(r, label, ptr, size);
}

void note_release(const void* ptr, std::uint64_t size) {
  Registry& r = reg();
  std::lock_guard<std::mutex> lock(r.mu);
  remove_live(r, ptr, size);
}

Stats stats() noexcept {
  Registry& r = reg();
  std::lock_guard<std::mutex> lock(r.mu);
  return r.s;
}

void reset_peak() noexcept {
  Registry& r = reg();
  std::lock_guard<std::mutex> lock(r.mu);
  r.s.peak_bytes = r.s.live_bytes;
}

std::uint64_t allocation_count() noexcept {
  Registry& r = reg();
  std::lock_guard<std::mutex> lock(r.mu);
  return r.seq;
}

std::string live_labels_since(std::uint64_t since, std::size_t max_items) {
  Registry& r = reg();
  std::lock_guard<std::mutex> lock(r.mu);
  std::string out;
  std::size_t n = 0;
  for (const auto& [ptr, a] : r.live) {
    if (a.seq <= since) continue;
    if (n++ == max_items) {
      out += ", ...";
      break;
    }
    out += (out.empty() ? "" : ", ") + ("'" + a.label + "' " + std::to_string(a.size) + " B");
  }
  return out;
}

}  // namespace kshard::memory
