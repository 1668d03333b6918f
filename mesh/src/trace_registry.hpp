#pragma once
// Private: the process-wide list of communicator traces.
#include <atomic>
#include <cstdint>
#include <list>
#include <memory>
#include <mutex>

#include "kshard/mesh/trace.hpp"

namespace kshard::detail {
struct TraceRegistry {
  std::mutex mu;
  std::list<std::weak_ptr<CollectiveTrace>> traces;
};
TraceRegistry& trace_registry();
std::atomic<std::int64_t>& inflight_counter();
}  // namespace kshard::detail
