#include "kshard/engine/fsdp/kv_cache.hpp"

#include <string>

#include "kshard/error.hpp"

namespace kshard {

KvCache::KvCache(std::int64_t batch, std::int64_t capacity) : batch_(batch), capacity_(capacity) {
  if (batch <= 0 || capacity <= 0)
    throw Error("KvCache(batch=" + std::to_string(batch) + ", capacity=" + std::to_string(capacity) +
                    ")",
                "batch > 0 and capacity > 0 tokens per sequence");
}

void KvCache::advance(std::int64_t tokens) {
  if (tokens < 0 || length_ + tokens > capacity_)
    throw Error("KvCache of " + std::to_string(length_) + " tokens advanced by " +
                    std::to_string(tokens),
                "at most capacity=" + std::to_string(capacity_) + " tokens per sequence");
  length_ += tokens;
}

}  // namespace kshard
