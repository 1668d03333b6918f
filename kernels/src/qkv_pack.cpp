#include "kshard/kernels/qkv_pack.hpp"

#include "kshard/compat/for_each.hpp"
#include "kshard/compat/kokkos.hpp"

#include <cmath>

namespace kshard::detail {
namespace {

// The sizes both kernels index with, derived once from the layout.
template <class A>
struct Geometry {
  std::int64_t h, kv, hd, seq, g, sw, dw, half, per_head;
  bool rope;
  A log_theta;  // ln(theta), hoisted out of the per-element angle
  explicit Geometry(const QkvLayout& l)
      : h(l.heads), kv(l.kv_heads), hd(l.head_dim), seq(l.seq), g(l.heads / l.kv_heads),
        sw((l.heads + 2 * l.kv_heads) * l.head_dim), dw(3 * l.heads * l.head_dim),
        half(l.head_dim / 2), per_head(l.rope_theta > 0 ? l.head_dim / 2 : l.head_dim),
        rope(l.rope_theta > 0), log_theta(l.rope_theta > 0 ? A(std::log(l.rope_theta)) : A(0)) {}
  // cos and sin of the angle of row r's position for pair index i.
  KOKKOS_INLINE_FUNCTION void angle(std::int64_t r, std::int64_t i, A& c, A& s) const {
    const A ang = A(r % seq) * compat::exp(-(A(2 * i) / A(hd)) * log_theta);
    c = compat::kmath::cos(ang);
    s = compat::kmath::sin(ang);
  }
};

}  // namespace

template <class T>
void qkv_pack(Kokkos::View<const T*> src, Kokkos::View<T*> dst, const QkvLayout& l) {
  using A = accum_t<T>;
  const Geometry<A> geo(l);
  const std::int64_t h = geo.h, kv = geo.kv, hd = geo.hd, g = geo.g, sw = geo.sw, dw = geo.dw,
                     half = geo.half, per_head = geo.per_head;
  const bool rope = geo.rope;
  // q and k: per (row, query head, pair) when rotating, per element when not.
  compat::for_each_index(
      "kshard::qkv_pack_qk", l.rows * h * per_head, KOKKOS_LAMBDA(std::int64_t idx) {
        const std::int64_t r = idx / (h * per_head), rem = idx - r * h * per_head;
        const std::int64_t head = rem / per_head, i = rem - head * per_head;
        const T* s = src.data() + r * sw;
        T* d = dst.data() + r * dw;
        const std::int64_t qs = head * hd, ks = h * hd + (head / g) * hd;
        const std::int64_t qd = head * hd, kd = h * hd + head * hd;
        if (!rope) {
          d[qd + i] = s[qs + i];
          d[kd + i] = s[ks + i];
          return;
        }
        A c, sn;
        geo.angle(r, i, c, sn);
        const A q1 = to_accum(s[qs + i]), q2 = to_accum(s[qs + i + half]);
        d[qd + i] = from_accum<T>(q1 * c - q2 * sn);
        d[qd + i + half] = from_accum<T>(q2 * c + q1 * sn);
        const A k1 = to_accum(s[ks + i]), k2 = to_accum(s[ks + i + half]);
        d[kd + i] = from_accum<T>(k1 * c - k2 * sn);
        d[kd + i + half] = from_accum<T>(k2 * c + k1 * sn);
      });
  compat::for_each_index(
      "kshard::qkv_pack_v", l.rows * h * hd, KOKKOS_LAMBDA(std::int64_t idx) {
        const std::int64_t r = idx / (h * hd), rem = idx - r * h * hd;
        const std::int64_t head = rem / hd, i = rem - head * hd;
        dst(r * dw + 2 * h * hd + head * hd + i) = src(r * sw + (h + kv) * hd + (head / g) * hd + i);
      });
}

template <class T>
void qkv_unpack(Kokkos::View<const T*> ddst, Kokkos::View<T*> dsrc, const QkvLayout& l) {
  using A = accum_t<T>;
  const Geometry<A> geo(l);
  const std::int64_t h = geo.h, kv = geo.kv, hd = geo.hd, g = geo.g, sw = geo.sw, dw = geo.dw,
                     half = geo.half, per_head = geo.per_head;
  const bool rope = geo.rope;
  // One thread per (row, source head of q or k, pair or element): a k head
  // sums its group's gradients (t = 0 .. g-1, in order), then rotates back
  // (the rotation is linear, so summing first is the same adjoint).
  compat::for_each_index(
      "kshard::qkv_unpack_qk", l.rows * (h + kv) * per_head, KOKKOS_LAMBDA(std::int64_t idx) {
        const std::int64_t r = idx / ((h + kv) * per_head), rem = idx - r * (h + kv) * per_head;
        const std::int64_t sh = rem / per_head, i = rem - sh * per_head;
        const T* d = ddst.data() + r * dw;
        T* s = dsrc.data() + r * sw;
        const bool is_q = sh < h;
        A a1 = 0, a2 = 0;
        if (is_q) {
          a1 = to_accum(d[sh * hd + i]);
          if (rope) a2 = to_accum(d[sh * hd + i + half]);
        } else {
          const std::int64_t j = sh - h;
          for (std::int64_t t = 0; t < g; ++t) {
            const std::int64_t kd = h * hd + (j * g + t) * hd;
            a1 += to_accum(d[kd + i]);
            if (rope) a2 += to_accum(d[kd + i + half]);
          }
        }
        const std::int64_t so = sh * hd;  // q heads, then k heads, in src
        if (!rope) {
          s[so + i] = from_accum<T>(a1);
          return;
        }
        A c, sn;
        geo.angle(r, i, c, sn);
        s[so + i] = from_accum<T>(a1 * c + a2 * sn);
        s[so + i + half] = from_accum<T>(a2 * c - a1 * sn);
      });
  compat::for_each_index(
      "kshard::qkv_unpack_v", l.rows * kv * hd, KOKKOS_LAMBDA(std::int64_t idx) {
        const std::int64_t r = idx / (kv * hd), rem = idx - r * kv * hd;
        const std::int64_t j = rem / hd, i = rem - j * hd;
        A a = 0;
        for (std::int64_t t = 0; t < g; ++t) a += to_accum(ddst(r * dw + 2 * h * hd + (j * g + t) * hd + i));
        dsrc(r * sw + (h + kv) * hd + j * hd + i) = from_accum<T>(a);
      });
}

#define KSHARD_QKV_PACK_INSTANTIATE(T)                                                   \
  template void qkv_pack<T>(Kokkos::View<const T*>, Kokkos::View<T*>, const QkvLayout&); \
  template void qkv_unpack<T>(Kokkos::View<const T*>, Kokkos::View<T*>, const QkvLayout&);
KSHARD_FOR_EACH_COMPUTE_TYPE(KSHARD_QKV_PACK_INSTANTIATE)
#undef KSHARD_QKV_PACK_INSTANTIATE

}  // namespace kshard::detail
