// Fused causal attention: argument checks and the portable Kokkos kernels.
//
// Portable kernel (FlashAttention-2 blocking, one team per tile):
//   forward   team = (batch, head, query tile of BR rows); key tiles of BC
//             keys stream through team scratch; running row max m and sum l
//             (online softmax) rescale the output accumulator, so only
//             lse = m + log(l) leaves the kernel.
//   backward  delta = rowsum(dO * O) first; then team = (batch, head, key
//             tile) recomputes P = exp(scale q.k - lse) for every query tile
//             at or after it and accumulates dV += P^T dO, dK += dS^T Q with
//             dS = P (dO v - delta); then team = (batch, head, query tile)
//             recomputes P and dS for every key tile up to the diagonal and
//             accumulates dQ += dS K. Two passes instead of atomics on dQ:
//             ~40% more multiply-adds, but deterministic and no f32 dQ buffer.
// Everything in scratch is accum_t<T>: operands are converted once on load.
#include "kshard/kernels/flash_attention.hpp"

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <string>

#include "kshard/compat/kokkos.hpp"
#include "kshard/error.hpp"

namespace kshard {
namespace detail {
namespace {

using Policy = Kokkos::TeamPolicy<>;
using Member = Policy::member_type;

constexpr bool kHostKernel = compat::host_accessible_v<compat::DeviceSpace>;

// C[i][j] = (accumulate ? C[i][j] : 0) + alpha * sum_l A(i, l) B[l][j] for
// i < m, j < n, l < k; A(i, l) = a[i*a_rs + l*a_cs] (strides make A^T free),
// B and C row-major. Rows go to team threads. Callers barrier around it.
template <class A>
KOKKOS_INLINE_FUNCTION void tile_mm(const Member& team, int m, int n, int k, A alpha, const A* a,
                                    int a_rs, int a_cs, const A* b, int ldb, A* c, int ldc,
                                    bool accumulate) {
  Kokkos::parallel_for(Kokkos::TeamThreadRange(team, m), [&](const int i) {
#if defined(__CUDA_ARCH__)
    // GPU: one vector lane per output, the sum in a register.
    Kokkos::parallel_for(Kokkos::ThreadVectorRange(team, n), [&](const int j) {
      A s = 0;
      for (int l = 0; l < k; ++l) s += a[i * a_rs + l * a_cs] * b[l * ldb + j];
      c[i * ldc + j] = accumulate ? c[i * ldc + j] + alpha * s : alpha * s;
    });
#else
    // Host: row-update form, so the innermost loop runs over contiguous j in
    // B and C and the compiler vectorises it (a dot product over l would be
    // a serial floating-point reduction).
    A* ci = c + i * ldc;
    if (!accumulate)
      for (int j = 0; j < n; ++j) ci[j] = A(0);
    for (int l = 0; l < k; ++l) {
      const A av = alpha * a[i * a_rs + l * a_cs];
      const A* bl = b + l * ldb;
      for (int j = 0; j < n; ++j) ci[j] += av * bl[j];
    }
#endif
  });
}

// Tile rows [r0, r0+rows) x hd columns of one head's q/k/v/ctx block (row
// stride ld) into scratch as accum_t, either row-major [rows_pad][hd] or
// transposed [hd][rows_pad]; rows past `valid` are zero so that padded rows
// and keys contribute exact zeros (never uninitialised NaNs).
template <class T, class A>
KOKKOS_INLINE_FUNCTION void load_tile(const Member& team, const T* src, std::int64_t ld,
                                      int rows_pad, int valid, int hd, A* dst, bool transpose,
                                      A mul = A(1)) {
  Kokkos::parallel_for(Kokkos::TeamThreadRange(team, rows_pad), [&](const int r) {
    Kokkos::parallel_for(Kokkos::ThreadVectorRange(team, hd), [&](const int c) {
      const A v = r < valid ? mul * to_accum(src[r * ld + c]) : A(0);
      if (transpose)
        dst[c * rows_pad + r] = v;
      else
        dst[r * hd + c] = v;
    });
  });
}

template <class A>
KOKKOS_INLINE_FUNCTION void zero_tile(const Member& team, A* dst, int n) {
  Kokkos::parallel_for(Kokkos::TeamThreadRange(team, n), [&](const int i) { dst[i] = A(0); });
}

/// Geometry shared by the kernels: tile sizes, scratch level and bytes.
struct Tiles {
  int br = 0, bc = 0;  // query rows and keys per tile
  int level = 0;       // team scratch level
  std::size_t bytes = 0;
};

// Tiles of `t` rows/keys whose scratch holds `tiles_hd` tiles of t x hd,
// `tiles_tt` of t x t and `vecs` vectors of t, in elements of `elem` bytes.
// Host: 64 (the scratch is ordinary cache-resident memory). Device: the
// largest of 32/16/8 whose scratch fits in shared memory, else 16 in level-1
// (global) scratch: a fallback for head dims the tensor-core path lacks.
Tiles choose_tiles(std::int64_t hd, int tiles_hd, int tiles_tt, int vecs, std::size_t elem) {
  auto bytes = [&](std::int64_t t) {
    return static_cast<std::size_t>(tiles_hd * t * hd + tiles_tt * t * t + vecs * t) * elem;
  };
  const auto max0 = static_cast<std::size_t>(Policy::scratch_size_max(0));
  Tiles g;
  if (kHostKernel) {
    g.br = g.bc = 64;
  } else {
    g.br = g.bc = 16;
    for (int t : {32, 16, 8})
      if (bytes(t) <= max0) {
        g.br = g.bc = t;
        break;
      }
  }
  g.bytes = bytes(g.br);
  g.level = g.bytes <= max0 ? 0 : 1;
  return g;
}

template <class... Tag>
Kokkos::TeamPolicy<Tag...> make_policy(std::int64_t league, const Tiles& g, const char* who) {
  if (league > std::numeric_limits<int>::max())
    throw Error(std::string(who) + ": " + std::to_string(league) + " teams",
                "batch * heads * tiles <= 2^31 - 1");
  // Vector lanes over tile columns on GPUs (a warp per row), one on host.
  const int vlen = kHostKernel ? 1 : Policy::vector_length_max();
  return Kokkos::TeamPolicy<Tag...>(static_cast<int>(league), Kokkos::AUTO, vlen)
      .set_scratch_size(g.level, Kokkos::PerTeam(g.bytes));
}

int tiles_of(std::int64_t n, int t) { return static_cast<int>((n + t - 1) / t); }

template <class T>
struct ForwardKernel {
  using A = accum_t<T>;
  const T* qkv;
  T* ctx;
  A* lse;
  std::int64_t seq, d, heads;
  int hd, br, bc, ntiles, level;
  std::size_t bytes;
  A scale, lowest;

  KOKKOS_INLINE_FUNCTION void operator()(const Member& team) const {
    const int tile = ntiles - 1 - team.league_rank() % ntiles;  // longest rows first
    const std::int64_t bh = team.league_rank() / ntiles;
    const std::int64_t b = bh / heads, h = bh % heads, ld = 3 * d;
    const std::int64_t q0 = std::int64_t(tile) * br;
    const int nq = static_cast<int>(seq - q0 < br ? seq - q0 : br);
    const T* head = qkv + b * seq * ld + h * hd;  // q of token 0 of this (b, h)

    A* qs = static_cast<A*>(team.team_scratch(level).get_shmem(bytes));
    A* kt = qs + br * hd;  // K^T [hd][bc]
    A* vs = kt + bc * hd;  // V [bc][hd]
    A* o = vs + bc * hd;   // unnormalised output [br][hd]
    A* s = o + br * hd;    // scores, then probabilities [br][bc]
    A* m = s + br * bc;    // running max of the scaled scores
    A* l = m + br;         // running sum of exp(score - m)

    load_tile(team, head + q0 * ld, ld, br, nq, hd, qs, false, scale);  // pre-scaled
    zero_tile(team, o, br * hd);
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, br), [&](const int i) {
      m[i] = lowest;
      l[i] = A(0);
    });
    team.team_barrier();

    const std::int64_t kend = q0 + nq;  // the last row sees keys [0, kend)
    for (std::int64_t k0 = 0; k0 < kend; k0 += bc) {
      const int nk = static_cast<int>(kend - k0 < bc ? kend - k0 : bc);
      load_tile(team, head + k0 * ld + d, ld, bc, nk, hd, kt, true);
      load_tile(team, head + k0 * ld + 2 * d, ld, bc, nk, hd, vs, false);
      team.team_barrier();
      tile_mm(team, br, bc, hd, A(1), qs, hd, 1, kt, bc, s, bc, false);
      team.team_barrier();
      Kokkos::parallel_for(Kokkos::TeamThreadRange(team, br), [&](const int i) {
        A* si = s + i * bc;
        // Keys k0 + j with j < valid are unmasked for query q0 + i.
        const std::int64_t reach = q0 + i - k0 + 1;
        const int valid = i >= nq ? 0 : static_cast<int>(reach < nk ? reach : nk);
        if (valid <= 0) {
          Kokkos::parallel_for(Kokkos::ThreadVectorRange(team, bc),
                               [&](const int j) { si[j] = A(0); });
          return;
        }
        const A m_old = m[i], l_old = l[i];  // read before any lane writes them
        A mx = m_old;
        Kokkos::parallel_reduce(
            Kokkos::ThreadVectorRange(team, valid),
            [&](const int j, A& v) {
              if (si[j] > v) v = si[j];
            },
            Kokkos::Max<A>(mx));
        if (m_old > mx) mx = m_old;
        A sum = 0;
        Kokkos::parallel_reduce(
            Kokkos::ThreadVectorRange(team, bc),
            [&](const int j, A& acc) {
              const A p = j < valid ? compat::exp(si[j] - mx) : A(0);
              si[j] = p;
              acc += p;
            },
            sum);
        const A alpha = compat::exp(m_old - mx);  // 0 on the first tile (m_old = lowest)
        Kokkos::parallel_for(Kokkos::ThreadVectorRange(team, hd),
                             [&](const int c) { o[i * hd + c] *= alpha; });
        Kokkos::single(Kokkos::PerThread(team), [&]() {
          m[i] = mx;
          l[i] = l_old * alpha + sum;
        });
      });
      team.team_barrier();
      tile_mm(team, br, hd, bc, A(1), s, bc, 1, vs, hd, o, hd, true);
      team.team_barrier();
    }

    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, nq), [&](const int i) {
      const A inv = A(1) / l[i];
      T* out = ctx + (b * seq + q0 + i) * d + h * hd;
      Kokkos::parallel_for(Kokkos::ThreadVectorRange(team, hd),
                           [&](const int c) { out[c] = from_accum<T>(o[i * hd + c] * inv); });
      Kokkos::single(Kokkos::PerThread(team),
                     [&]() { lse[bh * seq + q0 + i] = m[i] + compat::log(l[i]); });
    });
  }
};

// delta[(b*heads + h)*seq + i] = sum_c dO[b, i, h, c] * O[b, i, h, c]
template <class T>
struct DeltaKernel {
  using A = accum_t<T>;
  const T* ctx;
  const T* dctx;
  A* delta;
  std::int64_t seq, d, heads;
  int hd;
  KOKKOS_INLINE_FUNCTION void operator()(const std::int64_t r) const {
    const std::int64_t bh = r / seq, i = r % seq, b = bh / heads, h = bh % heads;
    const std::int64_t off = (b * seq + i) * d + h * hd;
    A s = 0;
    for (int c = 0; c < hd; ++c) s += to_accum(dctx[off + c]) * to_accum(ctx[off + c]);
    delta[r] = s;
  }
};

// P and dS of a (query tile, key tile) pair in place: on entry p holds
// scale * q.k and ds holds dO.v; on exit p = exp(p - lse) and
// ds = p * (ds - delta), both zero where masked (key after query, padding).
template <class A>
KOKKOS_INLINE_FUNCTION void probs_and_dscores(const Member& team, A* p, A* ds, int br, int bc,
                                              std::int64_t q0, int nq, std::int64_t k0, int nk,
                                              const A* lse_rows, const A* delta_rows) {
  Kokkos::parallel_for(Kokkos::TeamThreadRange(team, br), [&](const int i) {
    const std::int64_t reach = q0 + i - k0 + 1;
    const int valid = i >= nq || reach <= 0 ? 0 : static_cast<int>(reach < nk ? reach : nk);
    const A lse_i = valid > 0 ? lse_rows[q0 + i] : A(0);
    const A delta_i = valid > 0 ? delta_rows[q0 + i] : A(0);
    Kokkos::parallel_for(Kokkos::ThreadVectorRange(team, bc), [&](const int j) {
      const A pj = j < valid ? compat::exp(p[i * bc + j] - lse_i) : A(0);
      p[i * bc + j] = pj;
      ds[i * bc + j] = pj * (ds[i * bc + j] - delta_i);
    });
  });
}

struct KeyPass {};    // work tag: dK, dV for one (batch, head, key tile)
struct QueryPass {};  // work tag: dQ for one (batch, head, query tile)

template <class T>
struct BackwardKernel {
  using A = accum_t<T>;
  const T* qkv;
  const T* dctx;
  const A* lse;
  const A* delta;
  T* dqkv;
  std::int64_t seq, d, heads;
  int hd, br, bc, ntiles, level;
  std::size_t bytes;
  A scale;

  struct Where {
    std::int64_t bh, b, h;
    const T* head;  // q columns of this (batch, head), token 0
    const T* dout;  // dO of this (batch, head), token 0
  };
  KOKKOS_INLINE_FUNCTION Where where(const Member& team) const {
    const std::int64_t bh = team.league_rank() / ntiles, b = bh / heads, h = bh % heads;
    return {bh, b, h, qkv + b * seq * 3 * d + h * hd, dctx + b * seq * d + h * hd};
  }

  // P and dS of query tile (q0, nq) against key tile (k0, nk), all operands
  // already in scratch (qs, dos [br][hd]; kt, vt [hd][bc]); ends with a barrier.
  KOKKOS_INLINE_FUNCTION void probs(const Member& team, const Where& w, const A* qs,
                                    const A* dos, const A* kt, const A* vt, A* p, A* ds,
                                    std::int64_t q0, int nq, std::int64_t k0, int nk) const {
    tile_mm(team, br, bc, hd, scale, qs, hd, 1, kt, bc, p, bc, false);
    tile_mm(team, br, bc, hd, A(1), dos, hd, 1, vt, bc, ds, bc, false);
    team.team_barrier();
    probs_and_dscores(team, p, ds, br, bc, q0, nq, k0, nk, lse + w.bh * seq,
                      delta + w.bh * seq);
    team.team_barrier();
  }

  KOKKOS_INLINE_FUNCTION void operator()(KeyPass, const Member& team) const {
    const Where w = where(team);
    const std::int64_t ld = 3 * d, k0 = std::int64_t(team.league_rank() % ntiles) * bc;
    const int nk = static_cast<int>(seq - k0 < bc ? seq - k0 : bc);

    A* kt = static_cast<A*>(team.team_scratch(level).get_shmem(bytes));  // [hd][bc]
    A* vt = kt + bc * hd;   // [hd][bc]
    A* dk = vt + bc * hd;   // [bc][hd]
    A* dv = dk + bc * hd;   // [bc][hd]
    A* qs = dv + bc * hd;   // [br][hd]
    A* dos = qs + br * hd;  // [br][hd]
    A* p = dos + br * hd;   // [br][bc]
    A* ds = p + br * bc;    // [br][bc]

    load_tile(team, w.head + k0 * ld + d, ld, bc, nk, hd, kt, true);
    load_tile(team, w.head + k0 * ld + 2 * d, ld, bc, nk, hd, vt, true);
    zero_tile(team, dk, 2 * bc * hd);  // dk and dv are adjacent
    team.team_barrier();

    // Queries before k0 see none of these keys.
    for (std::int64_t q0 = (k0 / br) * br; q0 < seq; q0 += br) {
      const int nq = static_cast<int>(seq - q0 < br ? seq - q0 : br);
      load_tile(team, w.head + q0 * ld, ld, br, nq, hd, qs, false);
      load_tile(team, w.dout + q0 * d, d, br, nq, hd, dos, false);
      team.team_barrier();
      probs(team, w, qs, dos, kt, vt, p, ds, q0, nq, k0, nk);
      tile_mm(team, bc, hd, br, A(1), p, 1, bc, dos, hd, dv, hd, true);   // dV += P^T dO
      tile_mm(team, bc, hd, br, scale, ds, 1, bc, qs, hd, dk, hd, true);  // dK += s dS^T Q
      team.team_barrier();
    }

    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, nk), [&](const int j) {
      T* row = dqkv + (w.b * seq + k0 + j) * ld + w.h * hd;
      Kokkos::parallel_for(Kokkos::ThreadVectorRange(team, hd), [&](const int c) {
        row[d + c] = from_accum<T>(dk[j * hd + c]);
        row[2 * d + c] = from_accum<T>(dv[j * hd + c]);
      });
    });
  }

  KOKKOS_INLINE_FUNCTION void operator()(QueryPass, const Member& team) const {
    const Where w = where(team);
    const int tile = ntiles - 1 - team.league_rank() % ntiles;  // longest rows first
    const std::int64_t ld = 3 * d, q0 = std::int64_t(tile) * br;
    const int nq = static_cast<int>(seq - q0 < br ? seq - q0 : br);

    A* qs = static_cast<A*>(team.team_scratch(level).get_shmem(bytes));  // [br][hd]
    A* dos = qs + br * hd;  // [br][hd]
    A* dq = dos + br * hd;  // [br][hd]
    A* kt = dq + br * hd;   // [hd][bc]
    A* vt = kt + bc * hd;   // [hd][bc]
    A* ks = vt + bc * hd;   // [bc][hd]
    A* p = ks + bc * hd;    // [br][bc]
    A* ds = p + br * bc;    // [br][bc]

    load_tile(team, w.head + q0 * ld, ld, br, nq, hd, qs, false);
    load_tile(team, w.dout + q0 * d, d, br, nq, hd, dos, false);
    zero_tile(team, dq, br * hd);
    team.team_barrier();

    const std::int64_t kend = q0 + nq;
    for (std::int64_t k0 = 0; k0 < kend; k0 += bc) {
      const int nk = static_cast<int>(kend - k0 < bc ? kend - k0 : bc);
      load_tile(team, w.head + k0 * ld + d, ld, bc, nk, hd, kt, true);
      load_tile(team, w.head + k0 * ld + 2 * d, ld, bc, nk, hd, vt, true);
      load_tile(team, w.head + k0 * ld + d, ld, bc, nk, hd, ks, false);
      team.team_barrier();
      probs(team, w, qs, dos, kt, vt, p, ds, q0, nq, k0, nk);
      tile_mm(team, br, hd, bc, scale, ds, bc, 1, ks, hd, dq, hd, true);  // dQ += s dS K
      team.team_barrier();
    }

    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, nq), [&](const int i) {
      T* row = dqkv + (w.b * seq + q0 + i) * ld + w.h * hd;
      Kokkos::parallel_for(Kokkos::ThreadVectorRange(team, hd),
                           [&](const int c) { row[c] = from_accum<T>(dq[i * hd + c]); });
    });
  }
};

template <class T>
accum_t<T> softmax_scale(std::int64_t hd) {
  using A = accum_t<T>;
  return A(1) / std::sqrt(static_cast<A>(hd));
}

// --- argument checks -------------------------------------------------------

void check_dims(const char* who, std::int64_t batch, std::int64_t seq, std::int64_t d,
                std::int64_t heads) {
  if (batch <= 0 || seq <= 0 || d <= 0 || heads <= 0 || d % heads != 0)
    throw Error(std::string(who) + "(batch=" + std::to_string(batch) +
                    ", seq=" + std::to_string(seq) + ", d=" + std::to_string(d) +
                    ", heads=" + std::to_string(heads) + ")",
                "batch, seq, d, heads > 0 and d divisible by heads");
  if (d / heads > std::numeric_limits<int>::max() / 4 || seq > std::numeric_limits<int>::max())
    throw Error(std::string(who) + ": head dim " + std::to_string(d / heads) + ", seq " +
                    std::to_string(seq),
                "head dim and seq below 2^29");
}

void check_extent(const char* who, const char* name, std::size_t have, std::int64_t need,
                  const char* formula) {
  if (static_cast<std::int64_t>(have) < need)
    throw Error(std::string(who) + ": " + name + " has " + std::to_string(have) + " elements",
                std::string("at least ") + formula + " = " + std::to_string(need));
}

std::atomic<bool>& vendor_attention_flag() {
  static std::atomic<bool> flag{[] {
    const char* env = std::getenv("KSHARD_CUDNN_ATTENTION");
    return !(env != nullptr && std::string(env) == "0");
  }()};
  return flag;
}

}  // namespace

void set_vendor_attention_enabled(bool enabled) noexcept { vendor_attention_flag() = enabled; }
bool vendor_attention_enabled() noexcept { return vendor_attention_flag(); }

template <class T>
void flash_attention_forward_portable(const FlashArgs<T>& a) {
  using A = accum_t<T>;
  const int hd = static_cast<int>(a.head_dim());
  // Scratch: Q, K^T, V, O (t x hd); S (t x t); m, l (t).
  const Tiles g = choose_tiles(hd, 4, 1, 2, sizeof(A));
  const int ntiles = tiles_of(a.seq, g.br);
  ForwardKernel<T> k{a.qkv, a.out, a.lse, a.seq, a.d, a.heads, hd, g.br, g.bc, ntiles,
                     g.level, g.bytes, softmax_scale<T>(hd), std::numeric_limits<A>::lowest()};
  Kokkos::parallel_for("kshard::flash_attention_forward",
                       make_policy(a.batch * a.heads * ntiles, g, "flash_attention_forward"), k);
}

template <class T>
void flash_attention_backward_portable(const FlashArgs<T>& a) {
  using A = accum_t<T>;
  const int hd = static_cast<int>(a.head_dim());
  const std::int64_t rows = flash_attention_rows(a.batch, a.seq, a.heads);
  Kokkos::parallel_for("kshard::flash_attention_delta",
                       Kokkos::RangePolicy<Kokkos::IndexType<std::int64_t>>(0, rows),
                       DeltaKernel<T>{a.ctx, a.dctx, a.delta, a.seq, a.d, a.heads, hd});
  const A scale = softmax_scale<T>(hd);
  // Both passes hold 6 tiles of t x hd and 2 of t x t.
  const Tiles g = choose_tiles(hd, 6, 2, 0, sizeof(A));
  const int ntiles = tiles_of(a.seq, g.br);
  const std::int64_t league = a.batch * a.heads * ntiles;
  const BackwardKernel<T> k{a.qkv, a.dctx, a.lse_in, a.delta, a.out, a.seq, a.d, a.heads, hd,
                           g.br,  g.bc,   ntiles,   g.level, g.bytes, scale};
  Kokkos::parallel_for("kshard::flash_attention_backward_dkdv",
                       make_policy<KeyPass>(league, g, "flash_attention_backward"), k);
  Kokkos::parallel_for("kshard::flash_attention_backward_dq",
                       make_policy<QueryPass>(league, g, "flash_attention_backward"), k);
}

}  // namespace detail

template <class T>
void flash_attention_forward(Kokkos::View<const T*> qkv, Kokkos::View<T*> ctx,
                             Kokkos::View<accum_t<T>*> lse, std::int64_t batch, std::int64_t seq,
                             std::int64_t d, std::int64_t heads) {
  const char* who = "kshard::flash_attention_forward";
  detail::check_dims(who, batch, seq, d, heads);
  const std::int64_t tokens = batch * seq;
  detail::check_extent(who, "qkv", qkv.extent(0), tokens * 3 * d, "batch*seq*3*d");
  detail::check_extent(who, "ctx", ctx.extent(0), tokens * d, "batch*seq*d");
  detail::check_extent(who, "lse", lse.extent(0), flash_attention_rows(batch, seq, heads),
               "batch*heads*seq");
  detail::FlashArgs<T> a;
  a.qkv = qkv.data();
  a.out = ctx.data();
  a.lse = lse.data();
  a.batch = batch;
  a.seq = seq;
  a.d = d;
  a.heads = heads;
  detail::flash_attention_forward_backend<T>(a);
}

template <class T>
void flash_attention_backward(Kokkos::View<const T*> qkv, Kokkos::View<const T*> ctx,
                              Kokkos::View<const T*> dctx, Kokkos::View<const accum_t<T>*> lse,
                              Kokkos::View<T*> dqkv, std::int64_t batch, std::int64_t seq,
                              std::int64_t d, std::int64_t heads,
                              Kokkos::View<accum_t<T>*> delta) {
  const char* who = "kshard::flash_attention_backward";
  detail::check_dims(who, batch, seq, d, heads);
  const std::int64_t tokens = batch * seq, rows = flash_attention_rows(batch, seq, heads);
  detail::check_extent(who, "qkv", qkv.extent(0), tokens * 3 * d, "batch*seq*3*d");
  detail::check_extent(who, "ctx", ctx.extent(0), tokens * d, "batch*seq*d");
  detail::check_extent(who, "dctx", dctx.extent(0), tokens * d, "batch*seq*d");
  detail::check_extent(who, "lse", lse.extent(0), rows, "batch*heads*seq");
  detail::check_extent(who, "dqkv", dqkv.extent(0), tokens * 3 * d, "batch*seq*3*d");
  detail::check_extent(who, "delta", delta.extent(0), rows, "batch*heads*seq");
  detail::FlashArgs<T> a;
  a.qkv = qkv.data();
  a.ctx = ctx.data();
  a.dctx = dctx.data();
  a.lse_in = lse.data();
  a.out = dqkv.data();
  a.delta = delta.data();
  a.batch = batch;
  a.seq = seq;
  a.d = d;
  a.heads = heads;
  detail::flash_attention_backward_backend<T>(a);
}

#define KSHARD_FLASH_INSTANTIATE(T)                                                             \
  template void flash_attention_forward<T>(Kokkos::View<const T*>, Kokkos::View<T*>,            \
                                           Kokkos::View<accum_t<T>*>, std::int64_t,             \
                                           std::int64_t, std::int64_t, std::int64_t);           \
  template void flash_attention_backward<T>(                                                    \
      Kokkos::View<const T*>, Kokkos::View<const T*>, Kokkos::View<const T*>,                   \
      Kokkos::View<const accum_t<T>*>, Kokkos::View<T*>, std::int64_t, std::int64_t,            \
      std::int64_t, std::int64_t, Kokkos::View<accum_t<T>*>);                                   \
  template void detail::flash_attention_forward_portable<T>(const detail::FlashArgs<T>&);      \
  template void detail::flash_attention_backward_portable<T>(const detail::FlashArgs<T>&);
KSHARD_FLASH_INSTANTIATE(float)
KSHARD_FLASH_INSTANTIATE(double)
KSHARD_FLASH_INSTANTIATE(bfloat16_t)
KSHARD_FLASH_INSTANTIATE(float16_t)
#undef KSHARD_FLASH_INSTANTIATE

}  // namespace kshard
