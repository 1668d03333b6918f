#include "cached_attention.hpp"

#include <algorithm>
#include <cmath>

#include "kshard/compat/for_each.hpp"
#include "kshard/compat/kokkos.hpp"
#include "kshard/engine/nn/layer.hpp"
#include "kshard/kernels/rope_angle.hpp"

namespace kshard::detail {

template <class T>
void kv_cache_append(Kokkos::View<const T*> src, Kokkos::View<T*> q, Kokkos::View<T*> k_cache,
                     Kokkos::View<T*> v_cache, const CachedAttentionShape& s) {
  using A = accum_t<T>;
  const std::int64_t h = s.heads, kv = s.kv_heads, hd = s.head_dim, seq = s.seq,
                     cap = s.capacity, first = s.position, rows = s.batch * s.seq;
  const std::int64_t sw = (h + 2 * kv) * hd, half = hd / 2;
  const bool rope = s.rope_theta > 0;
  const std::int64_t per_head = rope ? half : hd;
  // The training kernels' angle (rope_angle.hpp), so a cached key is rotated
  // by the same angle bits as the recomputed one.
  const A log_theta = rope_log_theta<A>(s.rope_theta);
  // q heads, then k heads: per (row, head, pair) when rotating, else per element.
  compat::for_each_index(
      "kshard::kv_cache_append_qk", rows * (h + kv) * per_head, KOKKOS_LAMBDA(std::int64_t idx) {
        const std::int64_t r = idx / ((h + kv) * per_head), rem = idx - r * (h + kv) * per_head;
        const std::int64_t sh = rem / per_head, i = rem - sh * per_head;
        const std::int64_t b = r / seq, p = first + r % seq;
        const T* in = src.data() + r * sw + sh * hd;
        T* out = sh < h ? q.data() + r * h * hd + sh * hd
                        : k_cache.data() + ((b * kv + (sh - h)) * cap + p) * hd;
        if (!rope) {
          out[i] = in[i];
          return;
        }
        const A ang = rope_angle<A>(p, i, hd, log_theta);
        const A c = compat::kmath::cos(ang), sn = compat::kmath::sin(ang);
        const A x1 = to_accum(in[i]), x2 = to_accum(in[i + half]);
        out[i] = from_accum<T>(x1 * c - x2 * sn);
        out[i + half] = from_accum<T>(x2 * c + x1 * sn);
      });
  compat::for_each_index(
      "kshard::kv_cache_append_v", rows * kv * hd, KOKKOS_LAMBDA(std::int64_t idx) {
        const std::int64_t r = idx / (kv * hd), rem = idx - r * kv * hd;
        const std::int64_t j = rem / hd, i = rem - j * hd;
        const std::int64_t b = r / seq, p = first + r % seq;
        v_cache(((b * kv + j) * cap + p) * hd + i) = src(r * sw + (h + kv) * hd + j * hd + i);
      });
}

template <class T>
void cached_attention(Kokkos::View<const T*> q, Kokkos::View<const T*> k_cache,
                      Kokkos::View<const T*> v_cache, Kokkos::View<T*> ctx,
                      const CachedAttentionShape& s) {
  using A = accum_t<T>;
  using Team = Kokkos::TeamPolicy<>::member_type;
  const std::int64_t h = s.heads, kv = s.kv_heads, hd = s.head_dim, seq = s.seq,
                     cap = s.capacity, first = s.position, g = s.heads / s.kv_heads;
  const std::int64_t nrows = s.batch * h * seq;  // one per (sequence, head, query)
  const std::int64_t keys = first + seq;          // the most keys a query sees
  const A scale = A(1) / std::sqrt(static_cast<A>(hd));
  // At most 2^25 scores (128 MiB in f32) at a time: a decode step (seq = 1)
  // is one chunk; a long prefill runs its queries in several.
  const std::int64_t chunk = std::max<std::int64_t>(
      1, std::min<std::int64_t>(nrows, (std::int64_t(1) << 25) / keys));
  auto work = scratch<A>(chunk * keys, "kshard::cached_attention::scores");
  const auto scores = work.view;
  for (std::int64_t r0 = 0; r0 < nrows; r0 += chunk) {
    const std::int64_t rc = std::min(chunk, nrows - r0);
    Kokkos::parallel_for(
        "kshard::cached_attention", compat::row_team_policy(rc),
        KOKKOS_LAMBDA(const Team& team) {
          const std::int64_t rr = r0 + team.league_rank();
          const std::int64_t b = rr / (h * seq), rem = rr - b * h * seq;
          const std::int64_t head = rem / seq, t = rem - head * seq;
          const std::int64_t n = first + t + 1;  // causal: keys 0 .. its own position
          const std::int64_t row = b * seq + t;
          const T* qp = q.data() + row * h * hd + head * hd;
          const std::int64_t base = (b * kv + head / g) * cap * hd;
          const T* kp = k_cache.data() + base;
          const T* vp = v_cache.data() + base;
          A* sc = scores.data() + std::int64_t(team.league_rank()) * keys;
          Kokkos::parallel_for(Kokkos::TeamThreadRange(team, n), [&](std::int64_t j) {
            A dot = 0;
            for (std::int64_t c = 0; c < hd; ++c) dot += to_accum(qp[c]) * to_accum(kp[j * hd + c]);
            sc[j] = dot * scale;
          });
          team.team_barrier();
          A mx = 0;
          compat::team_reduce(
              team, n,
              [&](std::int64_t j, A& m) {
                if (sc[j] > m) m = sc[j];
              },
              Kokkos::Max<A>(mx));
          Kokkos::parallel_for(Kokkos::TeamThreadRange(team, n),
                               [&](std::int64_t j) { sc[j] = compat::exp(sc[j] - mx); });
          team.team_barrier();
          A sum = 0;
          compat::team_reduce(team, n, [&](std::int64_t j, A& acc) { acc += sc[j]; }, sum);
          const A inv = A(1) / sum;
          Kokkos::parallel_for(Kokkos::TeamThreadRange(team, hd), [&](std::int64_t c) {
            A acc = 0;
            for (std::int64_t j = 0; j < n; ++j) acc += sc[j] * to_accum(vp[j * hd + c]);
            ctx(row * h * hd + head * hd + c) = from_accum<T>(acc * inv);
          });
        });
  }
}

#define KSHARD_CACHED_ATTENTION_INSTANTIATE(T)                                                  \
  template void kv_cache_append<T>(Kokkos::View<const T*>, Kokkos::View<T*>, Kokkos::View<T*>, \
                                   Kokkos::View<T*>, const CachedAttentionShape&);             \
  template void cached_attention<T>(Kokkos::View<const T*>, Kokkos::View<const T*>,            \
                                    Kokkos::View<const T*>, Kokkos::View<T*>,                  \
                                    const CachedAttentionShape&);
KSHARD_FOR_EACH_COMPUTE_TYPE(KSHARD_CACHED_ATTENTION_INSTANTIATE)
#undef KSHARD_CACHED_ATTENTION_INSTANTIATE

}  // namespace kshard::detail
