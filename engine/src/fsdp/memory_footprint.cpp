#include "kshard/engine/fsdp/memory_footprint.hpp"

#include <algorithm>

#include "kshard/engine/fsdp/sharded_group.hpp"

namespace kshard {

MemoryFootprint MemoryFootprint::of(const std::vector<ShardedGroup>& units) {
  MemoryFootprint m;
  for (const ShardedGroup& g : units) {
    m.parameters += g.index().param_numel();
    m.persistent_bytes += g.persistent_bytes();
    m.max_unit_bytes = std::max(m.max_unit_bytes, g.unsharded_bytes());
  }
  return m;
}

}  // namespace kshard
