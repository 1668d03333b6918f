#pragma once
// A short ring buffer of the last collectives each communicator issued. The
// test harness' watchdog prints it when a test hangs, so a report says which
// collective (op, bytes, sequence number) every rank was stuck in.
#include <array>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

namespace kshard {

struct TraceEntry {
  std::uint64_t seq = 0;     // 1-based sequence number on this communicator
  const char* op = "";       // "all_gather", "reduce_scatter", ...
  std::size_t bytes = 0;     // bytes this rank contributes
  const char* dtype = "";
  double started_s = 0;      // seconds since the process started tracing
  double finished_s = -1;    // < 0: still in flight
};

class CollectiveTrace {
 public:
  static constexpr std::size_t capacity = 16;

  explicit CollectiveTrace(std::string comm_name) : name_(std::move(comm_name)) {}

  std::uint64_t begin(const char* op, std::size_t bytes, const char* dtype);
  void finish(std::uint64_t seq);
  std::vector<TraceEntry> last() const;  // oldest first
  const std::string& name() const { return name_; }
  /// One line per entry, e.g. "  world#12 all_gather 4096 B f32 in flight 3.2 s".
  std::string format() const;

 private:
  mutable std::mutex mu_;
  std::string name_;
  std::array<TraceEntry, capacity> ring_{};
  std::uint64_t next_ = 1;
};

/// Seconds since the first call (monotonic); used for trace timestamps.
double trace_clock() noexcept;

/// Traces of every live communicator of this process, formatted. Safe to call
/// from a watchdog thread while the main thread is blocked in a collective.
std::string format_all_traces();

/// Number of non-blocking collectives started and not yet waited on.
std::int64_t collectives_in_flight() noexcept;

}  // namespace kshard
