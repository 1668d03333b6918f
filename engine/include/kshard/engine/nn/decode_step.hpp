#pragma once
// DecodeStep: what a layer's decode() (incremental decoding, layer.hpp) needs
// beyond its input: where the new tokens stand and, for an attention layer,
// its key/value cache.
//
// Incremental decoding runs a few NEW tokens per sequence (a prompt once, then
// one token per step) through every layer; only attention looks at other
// tokens, and it reads the earlier ones' keys and values from its cache
// instead of recomputing them. Row r of a decode input [batch * seq, features]
// is sequence r / seq's token at position `position + r % seq`.
//
// AttentionKv holds one attention layer's keys (after the rotary embedding,
// where there is one) and values: kv_heads heads only (grouped-query
// attention shares them among query heads, so the cache is heads / kv_heads
// times smaller), laid out [batch, kv_heads, capacity, head_dim] so that one
// head's keys are contiguous. The layer allocates it on first use (the
// model's KvCache, fsdp/kv_cache.hpp, owns it) and reallocates it when the
// batch, capacity or head shape change.
#include <cstdint>

#include <Kokkos_Core.hpp>

namespace kshard {

template <class T>
struct AttentionKv {
  Kokkos::View<T*> k, v;  ///< [batch, kv_heads, capacity, head_dim] each
};

template <class T>
struct DecodeStep {
  std::int64_t position = 0;     ///< tokens cached per sequence before these: the first new one's position
  std::int64_t capacity = 0;     ///< the most tokens the cache holds per sequence
  AttentionKv<T>* kv = nullptr;  ///< this layer's cache (null: the layer has none)
};

}  // namespace kshard
