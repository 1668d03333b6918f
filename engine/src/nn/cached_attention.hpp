#pragma once
// The two kernels of an attention layer's incremental decoding (decode(),
// nn/decode_step.hpp), portable Kokkos: one implementation for host and CUDA.
//
// kv_cache_append: the qkv projection's output src [rows, (h + 2 kv) hd] of
// the new tokens ([q | k | v], heads side by side, row r = sequence r / seq,
// position `position + r % seq`) becomes q [rows, h hd] and the keys and
// values at those positions of the cache ([batch, kv, capacity, hd]); q and k
// rotated by their position when rope_theta > 0, with the angles of
// kernels/qkv_pack.hpp (rotate-half layout, computed in accum_t<T>), so the
// cache holds exactly what the forward's packed k would.
//
// cached_attention: ctx [rows, h hd] of each new query over the keys at
// positions 0 .. its own (causal: earlier steps' and this step's earlier
// tokens); query head i reads kv head i / (h / kv) in place (no copies per
// query head). One Kokkos team per (sequence, head, query): scores in
// accum_t<T> in a pool workspace, max-shifted softmax, context summed in
// accum_t<T> and rounded once. Queries run in chunks that keep the score
// workspace bounded (a long prefill: rows x keys scores).
//
// Private to the engine.
#include <cstdint>

#include <Kokkos_Core.hpp>

#include "kshard/numeric/compute.hpp"

namespace kshard::detail {

struct CachedAttentionShape {
  std::int64_t batch, seq;     ///< new tokens: rows = batch * seq
  std::int64_t heads, kv_heads, head_dim;
  double rope_theta;           ///< 0: no rotary embedding
  std::int64_t position;       ///< tokens cached per sequence before these
  std::int64_t capacity;       ///< the cache's tokens per sequence
};

template <class T>
void kv_cache_append(Kokkos::View<const T*> src, Kokkos::View<T*> q, Kokkos::View<T*> k_cache,
                     Kokkos::View<T*> v_cache, const CachedAttentionShape& s);

template <class T>
void cached_attention(Kokkos::View<const T*> q, Kokkos::View<const T*> k_cache,
                      Kokkos::View<const T*> v_cache, Kokkos::View<T*> ctx,
                      const CachedAttentionShape& s);

}  // namespace kshard::detail
