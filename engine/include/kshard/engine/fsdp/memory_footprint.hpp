#pragma once
// MemoryFootprint: what a sharded model's state takes on this rank, read
// from its units' layouts (nothing is measured: kshard/core/memory_tracker.hpp
// measures). The accounting lives here, not in the schedule (FsdpModel).
//
//   const kshard::MemoryFootprint m = model.memory_footprint();
//   double bound = m.persistent_bytes + m.max_unit_bytes;  // + optimizer state, activations
#include <cstddef>
#include <cstdint>
#include <vector>

namespace kshard {

class ShardedGroup;

struct MemoryFootprint {
  std::int64_t parameters = 0;       ///< of every unit (unpadded)
  std::size_t persistent_bytes = 0;  ///< master + grad (+ low-precision) shards on this rank
  std::size_t max_unit_bytes = 0;    ///< the largest unit unsharded (compute buffer + fp8 gather)

  static MemoryFootprint of(const std::vector<ShardedGroup>& units);
};

}  // namespace kshard
