#include "kshard/mesh/trace.hpp"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <memory>

#include "trace_registry.hpp"

namespace kshard {

double trace_clock() noexcept {
  static const auto t0 = std::chrono::steady_clock::now();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

std::uint64_t CollectiveTrace::begin(const char* op, std::size_t bytes, const char* dtype) {
  std::lock_guard<std::mutex> lock(mu_);
  TraceEntry& e = ring_[next_ % capacity];
  e = TraceEntry{next_, op, bytes, dtype, trace_clock(), -1.0};
  return next_++;
}

void CollectiveTrace::finish(std::uint64_t seq) {
  std::lock_guard<std::mutex> lock(mu_);
  TraceEntry& e = ring_[seq % capacity];
  if (e.seq == seq) e.finished_s = trace_clock();
}

std::vector<TraceEntry> CollectiveTrace::last() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<TraceEntry> out;
  const std::uint64_t first = next_ > capacity ? next_ - capacity : 1;
  for (std::uint64_t s = first; s < next_; ++s) out.push_back(ring_[s % capacity]);
  return out;
}

std::string CollectiveTrace::format() const {
  const double now = trace_clock();
  std::string out;
  char line[256];
  for (const TraceEntry& e : last()) {
    if (e.finished_s < 0)
      std::snprintf(line, sizeof line, "  %s#%llu %s %zu B %s IN FLIGHT for %.1f s\n",
                    name_.c_str(), (unsigned long long)e.seq, e.op, e.bytes, e.dtype,
                    now - e.started_s);
    else
      std::snprintf(line, sizeof line, "  %s#%llu %s %zu B %s done in %.3f ms\n", name_.c_str(),
                    (unsigned long long)e.seq, e.op, e.bytes, e.dtype,
                    1e3 * (e.finished_s - e.started_s));
    out += line;
  }
  if (out.empty()) out = "  " + name_ + ": no collectives yet\n";
  return out;
}

namespace detail {
TraceRegistry& trace_registry() {
  static TraceRegistry* r = new TraceRegistry;  // never destroyed: read at exit by the watchdog
  return *r;
}
std::atomic<std::int64_t>& inflight_counter() {
  static std::atomic<std::int64_t> n{0};
  return n;
}
}  // namespace detail

std::string format_all_traces() {
  auto& reg = detail::trace_registry();
  std::vector<std::shared_ptr<CollectiveTrace>> live;
  {
    std::lock_guard<std::mutex> lock(reg.mu);
    for (auto it = reg.traces.begin(); it != reg.traces.end();) {
      if (auto t = it->lock()) {
        live.push_back(std::move(t));
        ++it;
      } else {
        it = reg.traces.erase(it);
      }
    }
  }
  std::string out;
  for (const auto& t : live) out += t->format();
  if (out.empty()) out = "  (no communicators)\n";
  return out;
}

std::int64_t collectives_in_flight() noexcept { return detail::inflight_counter().load(); }

}  // namespace kshard
