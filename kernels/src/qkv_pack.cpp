#include "kshard/kernels/qkv_pack.hpp"

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "kshard/compat/kokkos.hpp"
#include "kshard/kernels/rope_angle.hpp"

// Shape of both kernels: one team per row. The team first computes the
// cosines and sines of its row's position (hd/2 angles, in team scratch),
// then each thread takes work items of (source head, chunk of V consecutive
// pair indices): it loads the source chunk(s) as whole V-element vectors,
// rotates them once and stores them to every destination slot (the g query
// heads sharing a k/v head get copies of one rotation; unpack sums the g
// slots, then rotates back once). So per element: no angle (the old kernels
// evaluated exp, cos and sin per element and per query head, k's g times),
// no 64-bit division chain (one 32-bit divide per item of 2V elements), and
// consecutive threads touch consecutive 16-byte vectors.
//
// The arithmetic is the previous kernels' to the bit: the same angle formula
// (rope_angle.hpp), the rotations rounded as they rounded them (rotate()),
// the same conversions, the group sums in the same order from the same zero;
// copies that never converted still do not. tests/layers/test_qkv_pack.cpp
// holds the previous kernels and compares both directions bitwise.
namespace kshard::detail {
// Named (not anonymous): unity builds put several kernel files in one
// translation unit, and nvcc wants the functions enclosing device lambdas
// to have external linkage.
namespace qkv_pack_impl {

/// V consecutive elements of T, loaded and stored as one (V * sizeof(T) is a
/// power of two up to 16 bytes: one vector load or store on the GPU).
template <class T, int V>
struct alignas(V * sizeof(T)) Vec {
  T v[V];
};

/// Stores x at p (aligned to the vector; global memory on the device). On
/// the device the bytes go out as one CUDA vector through __stwb
/// (st.global.wb, the default write-back store): nvcc (CUDA 13, sm_90) split
/// plain stores of the struct, and even of a uint4 built from it, into 16-
/// or 32-bit stores in these kernels (PTX: four st.global.u32 per vector
/// beside whole ld.global.v4 loads). The host stores the struct.
template <class T, int V>
KOKKOS_INLINE_FUNCTION void store(T* p, const Vec<T, V>& x) {
#if defined(__CUDA_ARCH__)
  constexpr std::size_t kBytes = sizeof(Vec<T, V>);
  if constexpr (kBytes == 16) {
    uint4 w;
    std::memcpy(&w, &x, kBytes);
    __stwb(reinterpret_cast<uint4*>(p), w);
    return;
  } else if constexpr (kBytes == 8) {
    uint2 w;
    std::memcpy(&w, &x, kBytes);
    __stwb(reinterpret_cast<uint2*>(p), w);
    return;
  } else if constexpr (kBytes == 4) {
    unsigned w;
    std::memcpy(&w, &x, kBytes);
    __stwb(reinterpret_cast<unsigned*>(p), w);
    return;
  }
#endif
  *reinterpret_cast<Vec<T, V>*>(p) = x;
}
template <class T, int V>
KOKKOS_INLINE_FUNCTION Vec<T, V> load(const T* p) {
  return *reinterpret_cast<const Vec<T, V>*>(p);
}

// The rotations, rounded as the previous kernels round them. On the GPU
// ptxas fuses a product and a sum into one FMA where it sees fit, and which
// product it fuses depends on the code around it: compiled for sm_90 with
// CUDA 13, the previous kernels fused as written below (f32, f64 and the
// 16-bit types alike), and so did this file's 2- to 8-wide paths, but its
// scalar path fused the other product of one output, which changed low bits
// (seen on an H100). So on the device each rounding
// step is spelled out (the _rn intrinsics are never fused further); the host
// compiler contracts nothing here (no FMA in the baseline x86-64 ISA), and
// the expressions stay as they were.
#if defined(__CUDA_ARCH__)
__device__ inline float mul_rn(float a, float b) { return __fmul_rn(a, b); }
__device__ inline double mul_rn(double a, double b) { return __dmul_rn(a, b); }
__device__ inline float fma_rn(float a, float b, float c) { return __fmaf_rn(a, b, c); }
__device__ inline double fma_rn(double a, double b, double c) { return __fma_rn(a, b, c); }
#endif

/// The forward rotation of the pair (x1, x2): x1 c - x2 s and x2 c + x1 s.
template <class A>
KOKKOS_INLINE_FUNCTION void rotate(A x1, A x2, A c, A s, A& o1, A& o2) {
#if defined(__CUDA_ARCH__)
  o1 = fma_rn(x1, c, -mul_rn(x2, s));
  o2 = fma_rn(x1, s, mul_rn(x2, c));
#else
  o1 = x1 * c - x2 * s;
  o2 = x2 * c + x1 * s;
#endif
}
/// Its adjoint (the backward): a1 c + a2 s and a2 c - a1 s.
template <class A>
KOKKOS_INLINE_FUNCTION void rotate_back(A a1, A a2, A c, A s, A& o1, A& o2) {
#if defined(__CUDA_ARCH__)
  o1 = fma_rn(a1, c, mul_rn(a2, s));
  o2 = fma_rn(a2, c, -mul_rn(a1, s));
#else
  o1 = a1 * c + a2 * s;
  o2 = a2 * c - a1 * s;
#endif
}

/// The sizes the kernels index with, from the layout.
struct Sizes {
  std::int64_t rows, seq, h, kv, hd, g, half;
  std::int64_t sw, dw;  // src and dst row widths, in elements
  bool rope;
  // Elements of a head that chunks cover: hd / 2 with rope (the chunk at i
  // also does i + hd / 2), hd without.
  int span;
  int chunks;  // span / V
  int items;   // (h + 2 kv) * chunks: work items per row
  explicit Sizes(const QkvLayout& l)
      : rows(l.rows), seq(l.seq), h(l.heads), kv(l.kv_heads), hd(l.head_dim),
        g(l.heads / l.kv_heads), half(l.head_dim / 2), sw((l.heads + 2 * l.kv_heads) * l.head_dim),
        dw(3 * l.heads * l.head_dim), rope(l.rope_theta > 0),
        span(static_cast<int>(l.rope_theta > 0 ? l.head_dim / 2 : l.head_dim)), chunks(0),
        items(0) {}
  void set_width(int v) {
    chunks = span / v;
    items = static_cast<int>((h + 2 * kv) * chunks);
  }
};

/// The widest V (elements per vector, up to 16 bytes) that divides the span
/// and that both arrays' starts are aligned to; 1 for odd spans or views
/// that start inside an allocation's vector.
template <class T>
int vector_width(const void* a, const void* b, std::int64_t span) {
  for (int v = 16 / static_cast<int>(sizeof(T)); v > 1; v /= 2) {
    const auto bytes = static_cast<std::uintptr_t>(v) * sizeof(T);
    if (span % v == 0 && reinterpret_cast<std::uintptr_t>(a) % bytes == 0 &&
        reinterpret_cast<std::uintptr_t>(b) % bytes == 0)
      return v;
  }
  return 1;
}

/// One team per row with its angle table in level-0 scratch. On CUDA the
/// row's items are split into the fewest passes of at most 256 threads and
/// the team is one pass, rounded up to whole warps (a d2048 row of bf16: 192
/// items, one pass of 192 threads; of f32: 384 items, two passes of 192):
/// no idle warps holding registers, so more rows run per SM. Elsewhere
/// Kokkos picks (a host team loops).
template <class A>
Kokkos::TeamPolicy<> row_policy(const Sizes& z) {
#if defined(KOKKOS_ENABLE_CUDA)
  const int passes = (z.items + 255) / 256;
  const int per_pass = (z.items + passes - 1) / passes;
  const int team = (per_pass + 31) / 32 * 32;
  Kokkos::TeamPolicy<> p(static_cast<int>(z.rows), team);
#else
  Kokkos::TeamPolicy<> p(static_cast<int>(z.rows), Kokkos::AUTO);
#endif
  using Shared = Kokkos::View<A*, Kokkos::DefaultExecutionSpace::scratch_memory_space,
                              Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
  p.set_scratch_size(0, Kokkos::PerTeam(Shared::shmem_size(z.rope ? 2 * z.half : 0)));
  return p;
}

using Team = Kokkos::TeamPolicy<>::member_type;

/// cos at [0, half) and sin at [half, 2 half) of row r's angles (its
/// position r % seq), then a barrier. Once per row instead of once per
/// element and query head.
template <class A, class Shared>
KOKKOS_INLINE_FUNCTION void row_angles(const Team& team, const Sizes& z, A log_theta,
                                       std::int64_t r, const Shared& cs) {
  const std::int64_t pos = r % z.seq, half = z.half, hd = z.hd;
  Kokkos::parallel_for(Kokkos::TeamThreadRange(team, static_cast<int>(half)), [&](int i) {
    const A ang = rope_angle<A>(pos, i, hd, log_theta);
    cs(i) = compat::kmath::cos(ang);
    cs(half + i) = compat::kmath::sin(ang);
  });
  team.team_barrier();
}

template <class T, int V>
void pack(const T* src, T* dst, const Sizes& z, accum_t<T> log_theta) {
  using A = accum_t<T>;
  using Vt = Vec<T, V>;
  using Shared = Kokkos::View<A*, Kokkos::DefaultExecutionSpace::scratch_memory_space,
                              Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
  Kokkos::parallel_for(
      "kshard::qkv_pack", row_policy<A>(z), KOKKOS_LAMBDA(const Team& team) {
        const std::int64_t r = team.league_rank();
        const Shared cs(team.team_scratch(0), z.rope ? 2 * z.half : 0);
        if (z.rope) row_angles<A>(team, z, log_theta, r, cs);
        const T* s = src + r * z.sw;
        T* d = dst + r * z.dw;
        const std::int64_t h = z.h, kv = z.kv, hd = z.hd, g = z.g, half = z.half;
        Kokkos::parallel_for(Kokkos::TeamThreadRange(team, z.items), [&](int t) {
          const int sh = t / z.chunks;  // source head: q 0..h-1, k h..h+kv-1, v after
          const std::int64_t e = std::int64_t(t - sh * z.chunks) * V;
          // Destination of the first copy and how many: q head sh, or the g
          // query-head slots of k/v head j (j g .. j g + g - 1).
          std::int64_t base = sh * hd, n = 1;
          if (sh >= h + kv) {
            base = 2 * h * hd + (sh - h - kv) * g * hd, n = g;
          } else if (sh >= h) {
            base = h * hd + (sh - h) * g * hd, n = g;
          }
          const T* in = s + sh * hd + e;  // src holds q, k, v heads back to back
          const Vt lo = load<T, V>(in);
          if (!z.rope) {
            for (std::int64_t c = 0; c < n; ++c) store<T, V>(d + base + c * hd + e, lo);
            return;
          }
          const Vt hi = load<T, V>(in + half);
          if (sh >= h + kv) {  // v: copied, not rotated
            for (std::int64_t c = 0; c < n; ++c) {
              store<T, V>(d + base + c * hd + e, lo);
              store<T, V>(d + base + c * hd + e + half, hi);
            }
            return;
          }
          Vt o1, o2;
          for (int k = 0; k < V; ++k) {
            A r1, r2;
            rotate(to_accum(lo.v[k]), to_accum(hi.v[k]), cs(e + k), cs(half + e + k), r1, r2);
            o1.v[k] = from_accum<T>(r1);
            o2.v[k] = from_accum<T>(r2);
          }
          for (std::int64_t c = 0; c < n; ++c) {
            store<T, V>(d + base + c * hd + e, o1);
            store<T, V>(d + base + c * hd + e + half, o2);
          }
        });
      });
}

/// Slots of a k/v group that unpack loads at once.
constexpr int kBatch = 4;

template <class T, int V>
void unpack(const T* ddst, T* dsrc, const Sizes& z, accum_t<T> log_theta) {
  using A = accum_t<T>;
  using Vt = Vec<T, V>;
  using Shared = Kokkos::View<A*, Kokkos::DefaultExecutionSpace::scratch_memory_space,
                              Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
  Kokkos::parallel_for(
      "kshard::qkv_unpack", row_policy<A>(z), KOKKOS_LAMBDA(const Team& team) {
        const std::int64_t r = team.league_rank();
        const Shared cs(team.team_scratch(0), z.rope ? 2 * z.half : 0);
        if (z.rope) row_angles<A>(team, z, log_theta, r, cs);
        const T* d = ddst + r * z.dw;
        T* s = dsrc + r * z.sw;
        const std::int64_t h = z.h, kv = z.kv, hd = z.hd, g = z.g, half = z.half;
        const bool rope = z.rope;
        Kokkos::parallel_for(Kokkos::TeamThreadRange(team, z.items), [&](int t) {
          const int sh = t / z.chunks;
          const std::int64_t e = std::int64_t(t - sh * z.chunks) * V;
          A a1[V], a2[V];
          if (sh < h) {  // q: its one slot, converted (no sum)
            const Vt lo = load<T, V>(d + sh * hd + e);
            for (int k = 0; k < V; ++k) a1[k] = to_accum(lo.v[k]);
            if (rope) {
              const Vt hi = load<T, V>(d + sh * hd + e + half);
              for (int k = 0; k < V; ++k) a2[k] = to_accum(hi.v[k]);
            }
          } else {  // k or v head j: its group's g slots summed in order, from 0
            const std::int64_t base =
                sh < h + kv ? h * hd + (sh - h) * g * hd : 2 * h * hd + (sh - h - kv) * g * hd;
            for (int k = 0; k < V; ++k) a1[k] = 0, a2[k] = 0;
            // kBatch slots' loads go out together before their sums: a loop
            // of load-then-add waits one memory latency per slot (on an
            // H100, d2048 GQA bf16 with RoPE, this and row_policy's warp-
            // rounded teams took unpack from 49 us to 40 us).
            for (std::int64_t c0 = 0; c0 < g; c0 += kBatch) {
              Vt lo[kBatch], hi[kBatch];
              for (int b = 0; b < kBatch; ++b) {
                if (c0 + b >= g) break;
                lo[b] = load<T, V>(d + base + (c0 + b) * hd + e);
                if (rope) hi[b] = load<T, V>(d + base + (c0 + b) * hd + e + half);
              }
              for (int b = 0; b < kBatch; ++b) {
                if (c0 + b >= g) break;
                for (int k = 0; k < V; ++k) a1[k] += to_accum(lo[b].v[k]);
                if (rope)
                  for (int k = 0; k < V; ++k) a2[k] += to_accum(hi[b].v[k]);
              }
            }
          }
          T* out = s + sh * hd + e;  // q heads, then k, then v, in src
          Vt o1, o2;
          if (!rope || sh >= h + kv) {  // nothing to rotate back
            for (int k = 0; k < V; ++k) o1.v[k] = from_accum<T>(a1[k]);
            store<T, V>(out, o1);
            if (rope) {
              for (int k = 0; k < V; ++k) o2.v[k] = from_accum<T>(a2[k]);
              store<T, V>(out + half, o2);
            }
            return;
          }
          for (int k = 0; k < V; ++k) {
            A r1, r2;
            rotate_back(a1[k], a2[k], cs(e + k), cs(half + e + k), r1, r2);
            o1.v[k] = from_accum<T>(r1);
            o2.v[k] = from_accum<T>(r2);
          }
          store<T, V>(out, o1);
          store<T, V>(out + half, o2);
        });
      });
}

/// Runs kernel<T, V> for the run-time width v (only widths of at most 16 bytes exist).
template <class T, template <class, int> class K, class... Args>
void with_width(int v, Args&&... args) {
  constexpr int kMax = 16 / static_cast<int>(sizeof(T));
  if constexpr (kMax >= 8) {
    if (v == 8) return K<T, 8>::run(args...);
  }
  if constexpr (kMax >= 4) {
    if (v == 4) return K<T, 4>::run(args...);
  }
  if (v == 2) return K<T, 2>::run(args...);
  K<T, 1>::run(args...);
}
template <class T, int V>
struct Pack {
  static void run(const T* src, T* dst, const Sizes& z, accum_t<T> lt) {
    pack<T, V>(src, dst, z, lt);
  }
};
template <class T, int V>
struct Unpack {
  static void run(const T* ddst, T* dsrc, const Sizes& z, accum_t<T> lt) {
    unpack<T, V>(ddst, dsrc, z, lt);
  }
};

}  // namespace qkv_pack_impl

template <class T>
void qkv_pack(Kokkos::View<const T*> src, Kokkos::View<T*> dst, const QkvLayout& l) {
  namespace impl = qkv_pack_impl;
  impl::Sizes z(l);
  if (z.rows <= 0) return;
  const int v = impl::vector_width<T>(src.data(), dst.data(), z.span);
  z.set_width(v);
  impl::with_width<T, impl::Pack>(v, src.data(), dst.data(), z,
                                  rope_log_theta<accum_t<T>>(l.rope_theta));
}

template <class T>
void qkv_unpack(Kokkos::View<const T*> ddst, Kokkos::View<T*> dsrc, const QkvLayout& l) {
  namespace impl = qkv_pack_impl;
  impl::Sizes z(l);
  if (z.rows <= 0) return;
  const int v = impl::vector_width<T>(ddst.data(), dsrc.data(), z.span);
  z.set_width(v);
  impl::with_width<T, impl::Unpack>(v, ddst.data(), dsrc.data(), z,
                                    rope_log_theta<accum_t<T>>(l.rope_theta));
}

#define KSHARD_QKV_PACK_INSTANTIATE(T)                                                   \
  template void qkv_pack<T>(Kokkos::View<const T*>, Kokkos::View<T*>, const QkvLayout&); \
  template void qkv_unpack<T>(Kokkos::View<const T*>, Kokkos::View<T*>, const QkvLayout&);
KSHARD_FOR_EACH_COMPUTE_TYPE(KSHARD_QKV_PACK_INSTANTIATE)
#undef KSHARD_QKV_PACK_INSTANTIATE

}  // namespace kshard::detail
