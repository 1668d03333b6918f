#include "kshard/core/memory_tracker.hpp"

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cstdio>
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
  // Live bytes per folded label, and a copy of it taken at each new peak (a
  // few dozen entries: cheap next to the allocation it follows).
  std::map<std::string, std::int64_t> by_kind, at_peak;
};

std::string fold_digits(const std::string& label) {
  std::string out;
  for (std::size_t i = 0; i < label.size(); ++i) {
    if (std::isdigit(static_cast<unsigned char>(label[i]))) {
      out += '*';
      while (i + 1 < label.size() && std::isdigit(static_cast<unsigned char>(label[i + 1]))) ++i;
    } else {
      out += label[i];
    }
  }
  return out;
}
Registry& reg() {
  static Registry* r = new Registry;  // never destroyed: Views may die after static destructors
  return *r;
}

// Long-lived caches: ours, and Kokkos' own internal buffers (team scratch,
// reduction scratch), which it keeps from the first kernel that needs them.
bool is_cache(const char* label) {
  return std::strncmp(label, "kshard.cache:", 13) == 0 || std::strncmp(label, "Kokkos::", 8) == 0;
}
bool is_workspace(const char* label) {
  return std::strncmp(label, "kshard.cache:workspace:", 23) == 0;
}

void add_live(Registry& r, const char* label, const void* ptr, std::uint64_t size) {
  r.s.live_bytes += std::int64_t(size);
  ++r.s.live_allocs;
  Alloc a{label, size, ++r.seq};
  r.by_kind[fold_digits(a.label)] += std::int64_t(size);
  if (r.s.live_bytes > r.s.peak_bytes) {
    r.s.peak_bytes = r.s.live_bytes;
    r.at_peak = r.by_kind;
  }
  r.live[ptr] = std::move(a);
}

void remove_live(Registry& r, const void* ptr, std::uint64_t size) {
  const auto it = r.live.find(ptr);
  if (it == r.live.end()) return;  // allocated before install()
  auto k = r.by_kind.find(fold_digits(it->second.label));
  if (k != r.by_kind.end() && (k->second -= std::int64_t(size)) == 0) r.by_kind.erase(k);
  r.live.erase(it);
  r.s.live_bytes -= std::int64_t(size);
  --r.s.live_allocs;
}

void on_alloc(Kokkos::Profiling::SpaceHandle, const char* label, const void* ptr,
              std::uint64_t size) {
  Registry& r = reg();
  std::lock_guard<std::mutex> lock(r.mu);
  if (is_cache(label)) {
    r.s.cache_bytes += std::int64_t(size);
    if (is_workspace(label)) r.s.workspace_bytes += std::int64_t(size);
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
    if (is_workspace(label)) r.s.workspace_bytes -= std::int64_t(size);
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
  try {
    r.at_peak = r.by_kind;
  } catch (...) {
    r.at_peak.clear();  // only the report suffers
  }
}

std::vector<std::pair<std::string, std::int64_t>> peak_breakdown() {
  Registry& r = reg();
  std::lock_guard<std::mutex> lock(r.mu);
  std::vector<std::pair<std::string, std::int64_t>> v(r.at_peak.begin(), r.at_peak.end());
  std::sort(v.begin(), v.end(), [](const auto& a, const auto& b) { return a.second > b.second; });
  return v;
}

std::string peak_report(std::size_t max_items) {
  const auto v = peak_breakdown();
  std::string out;
  std::int64_t total = 0, rest = 0;
  for (std::size_t i = 0; i < v.size(); ++i) {
    total += v[i].second;
    if (i >= max_items) {
      rest += v[i].second;
      continue;
    }
    char line[64];
    std::snprintf(line, sizeof line, "  %10.1f MiB  ", double(v[i].second) / (1 << 20));
    out += line + v[i].first + "\n";
  }
  char tail[96];
  if (rest) {
    std::snprintf(tail, sizeof tail, "  %10.1f MiB  (%zu more labels)\n", double(rest) / (1 << 20),
                  v.size() - max_items);
    out += tail;
  }
  std::snprintf(tail, sizeof tail, "  %10.1f MiB  total at the peak\n", double(total) / (1 << 20));
  out += tail;
  if (const std::int64_t ws = stats().workspace_bytes; ws > 0) {
    std::snprintf(tail, sizeof tail, "  %10.1f MiB  library workspaces (kept; add to the peak)\n",
                  double(ws) / (1 << 20));
    out += tail;
  }
  return out;
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
