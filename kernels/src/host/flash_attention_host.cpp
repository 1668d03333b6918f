// Host fused-attention backend: query blocks of 64 rows through the vendor
// GEMM (CBLAS), per (batch, head):
//   forward   S = scale Q_blk K^T over the keys the block can see ([64, kend],
//             kend <= seq), causal softmax in place (lse saved), O_blk = P V.
//   backward  delta, S and P = exp(S - lse) again, dP = dO_blk V^T,
//             dS = P (dP - delta), dQ_blk = scale dS K, and dK, dV (keys
//             < kend) += scale dS^T Q_blk, P^T dO_blk, block after block in a
//             fixed order (deterministic).
// The state is O(64 * seq) per call, never [B, H, T, T]. Why not the portable
// Kokkos kernel here: on one host core its hand-written tile products reach
// ~8 GFLOP/s, the BLAS ~3-5x that (measured with kshard-bench-attention).
// The portable kernel stays callable (detail::flash_attention_*_portable) and
// is tested on the host as well.
//
// Accumulation type A = accum_t<T>: float and double operands go to the GEMM
// in place (strided rows of qkv/ctx); 16-bit operands of one head are widened
// to f32 once per (batch, head) and the results rounded once.
#include <algorithm>
#include <cmath>
#include <string>
#include <type_traits>
#include <vector>

#include "kshard/kernels/flash_attention.hpp"
#include "kshard/kernels/gemm.hpp"
#include "kshard/error.hpp"

namespace kshard::detail {
namespace {

constexpr std::int64_t kBlock = 64;

/// Host scratch reused across calls (grown, never shrunk), so that a steady
/// state of same-sized calls allocates nothing. One set per thread.
template <class A>
struct Scratch {
  std::vector<A> s, dp, q, k, v, dout, o, dk, dv, out;
  static Scratch& get() {
    thread_local Scratch scratch;
    return scratch;
  }
};

template <class A>
A* sized(std::vector<A>& v, std::int64_t n) {
  if (static_cast<std::int64_t>(v.size()) < n) v.resize(static_cast<std::size_t>(n));
  return v.data();
}

/// rows x hd elements at src (row stride ld) widened into dst [rows][hd].
template <class T, class A>
void widen(const T* src, std::int64_t ld, std::int64_t rows, std::int64_t hd, A* dst) {
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t c = 0; c < hd; ++c) dst[r * hd + c] = to_accum(src[r * ld + c]);
}

/// rows x hd of src [rows][hd], times mul, rounded into dst (row stride ld).
template <class T, class A>
void narrow(const A* src, std::int64_t rows, std::int64_t hd, A mul, T* dst, std::int64_t ld) {
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t c = 0; c < hd; ++c) dst[r * ld + c] = from_accum<T>(mul * src[r * hd + c]);
}

/// One head's operand: rows of `rows` x hd elements and their row stride.
template <class A>
struct Operand {
  const A* p;
  std::int64_t ld;
  const A* row(std::int64_t r) const { return p + r * ld; }
};

/// The rows of T in place when T is the accumulation type, otherwise widened
/// into `buf`.
template <class T, class A>
Operand<A> operand(const T* src, std::int64_t ld, std::int64_t rows, std::int64_t hd,
                   std::vector<A>& buf) {
  if constexpr (std::is_same_v<T, A>) {
    (void)rows;
    (void)hd;
    (void)buf;
    return {src, ld};
  } else {
    A* dst = sized(buf, rows * hd);
    widen(src, ld, rows, hd, dst);
    return {dst, hd};
  }
}

template <class A>
struct HeadQkv {
  Operand<A> q, k, v;
};

/// q, k, v of (batch b, head h).
template <class T, class A>
HeadQkv<A> head_qkv(const FlashArgs<T>& a, std::int64_t b, std::int64_t h, Scratch<A>& w) {
  const std::int64_t seq = a.seq, d = a.d, hd = a.head_dim(), ld = 3 * d;
  const T* head = a.qkv + b * seq * ld + h * hd;
  return {operand(head, ld, seq, hd, w.q), operand(head + d, ld, seq, hd, w.k),
          operand(head + 2 * d, ld, seq, hd, w.v)};
}

template <class T>
void forward_blocked(const FlashArgs<T>& a) {
  using A = accum_t<T>;
  const std::int64_t seq = a.seq, d = a.d, hd = a.head_dim(), ld = 3 * d;
  const A scale = A(1) / std::sqrt(static_cast<A>(hd));
  Scratch<A>& w = Scratch<A>::get();
  A* s = sized(w.s, kBlock * seq);
  for (std::int64_t b = 0; b < a.batch; ++b)
    for (std::int64_t h = 0; h < a.heads; ++h) {
      const HeadQkv<A> x = head_qkv(a, b, h, w);
      A* lse = a.lse + (b * a.heads + h) * seq;
      for (std::int64_t q0 = 0; q0 < seq; q0 += kBlock) {
        const std::int64_t nq = std::min(kBlock, seq - q0), kend = q0 + nq;
        gemm<A>(Trans::N, Trans::T, nq, kend, hd, scale, x.q.row(q0), x.q.ld, x.k.p, x.k.ld, A(0),
                s, kend);
        for (std::int64_t i = 0; i < nq; ++i) {
          A* row = s + i * kend;
          const std::int64_t n = q0 + i + 1;  // keys 0..q0+i
          A mx = row[0];
          for (std::int64_t j = 1; j < n; ++j) mx = row[j] > mx ? row[j] : mx;
          A sum = 0;
          for (std::int64_t j = 0; j < n; ++j) {
            row[j] = std::exp(row[j] - mx);
            sum += row[j];
          }
          const A inv = A(1) / sum;
          for (std::int64_t j = 0; j < n; ++j) row[j] *= inv;
          for (std::int64_t j = n; j < kend; ++j) row[j] = A(0);
          lse[q0 + i] = mx + std::log(sum);
        }
        T* ctx = a.out + (b * seq + q0) * d + h * hd;
        if constexpr (std::is_same_v<T, A>) {
          gemm<A>(Trans::N, Trans::N, nq, hd, kend, A(1), s, kend, x.v.p, x.v.ld, A(0), ctx, d);
        } else {
          A* o = sized(w.out, kBlock * hd);
          gemm<A>(Trans::N, Trans::N, nq, hd, kend, A(1), s, kend, x.v.p, x.v.ld, A(0), o, hd);
          narrow(o, nq, hd, A(1), ctx, d);
        }
      }
    }
}

template <class T>
void backward_blocked(const FlashArgs<T>& a) {
  using A = accum_t<T>;
  const std::int64_t seq = a.seq, d = a.d, hd = a.head_dim(), ld = 3 * d;
  const A scale = A(1) / std::sqrt(static_cast<A>(hd));
  Scratch<A>& w = Scratch<A>::get();
  A* s = sized(w.s, kBlock * seq);
  A* dp = sized(w.dp, kBlock * seq);
  for (std::int64_t b = 0; b < a.batch; ++b)
    for (std::int64_t h = 0; h < a.heads; ++h) {
      const HeadQkv<A> x = head_qkv(a, b, h, w);
      const Operand<A> dout = operand(a.dctx + b * seq * d + h * hd, d, seq, hd, w.dout);
      const Operand<A> o = operand(a.ctx + b * seq * d + h * hd, d, seq, hd, w.o);
      const A* lse = a.lse_in + (b * a.heads + h) * seq;
      A* delta = a.delta + (b * a.heads + h) * seq;
      A* dk = sized(w.dk, seq * hd);
      A* dv = sized(w.dv, seq * hd);
      for (std::int64_t i = 0; i < seq * hd; ++i) dk[i] = dv[i] = A(0);
      T* dqkv = a.out + b * seq * ld + h * hd;
      for (std::int64_t q0 = 0; q0 < seq; q0 += kBlock) {
        const std::int64_t nq = std::min(kBlock, seq - q0), kend = q0 + nq;
        const A* qb = x.q.row(q0);
        const A* dob = dout.row(q0);
        const std::int64_t lq = x.q.ld, ldo = dout.ld;
        gemm<A>(Trans::N, Trans::T, nq, kend, hd, scale, qb, lq, x.k.p, x.k.ld, A(0), s, kend);
        gemm<A>(Trans::N, Trans::T, nq, kend, hd, A(1), dob, ldo, x.v.p, x.v.ld, A(0), dp, kend);
        for (std::int64_t i = 0; i < nq; ++i) {
          A dd = 0;
          const A* oi = o.row(q0 + i);
          for (std::int64_t c = 0; c < hd; ++c) dd += dob[i * ldo + c] * oi[c];
          delta[q0 + i] = dd;
          const std::int64_t n = q0 + i + 1;
          A* p = s + i * kend;
          A* ds = dp + i * kend;
          for (std::int64_t j = 0; j < kend; ++j) {
            const A pj = j < n ? std::exp(p[j] - lse[q0 + i]) : A(0);
            p[j] = pj;
            ds[j] = pj * (ds[j] - dd);
          }
        }
        gemm<A>(Trans::T, Trans::N, kend, hd, nq, A(1), s, kend, dob, ldo, A(1), dv, hd);
        gemm<A>(Trans::T, Trans::N, kend, hd, nq, scale, dp, kend, qb, lq, A(1), dk, hd);
        if constexpr (std::is_same_v<T, A>) {
          gemm<A>(Trans::N, Trans::N, nq, hd, kend, scale, dp, kend, x.k.p, x.k.ld, A(0),
                  dqkv + q0 * ld, ld);
        } else {
          A* dq = sized(w.out, kBlock * hd);
          gemm<A>(Trans::N, Trans::N, nq, hd, kend, scale, dp, kend, x.k.p, x.k.ld, A(0), dq, hd);
          narrow(dq, nq, hd, A(1), dqkv + q0 * ld, ld);
        }
      }
      narrow(dk, seq, hd, A(1), dqkv + d, ld);
      narrow(dv, seq, hd, A(1), dqkv + 2 * d, ld);
    }
}

}  // namespace

template <class T>
void flash_attention_forward_backend(const FlashArgs<T>& a) {
  forward_blocked<T>(a);
}

template <class T>
void flash_attention_backward_backend(const FlashArgs<T>& a) {
  backward_blocked<T>(a);
}

template <class T>
const char* flash_attention_path(const FlashArgs<T>&) {
  return "host blocked GEMM";
}

#define KSHARD_FLASH_HOST_INSTANTIATE(T)                                  \
  template void flash_attention_forward_backend<T>(const FlashArgs<T>&);  \
  template void flash_attention_backward_backend<T>(const FlashArgs<T>&); \
  template const char* flash_attention_path<T>(const FlashArgs<T>&);
KSHARD_FLASH_HOST_INSTANTIATE(float)
KSHARD_FLASH_HOST_INSTANTIATE(double)
KSHARD_FLASH_HOST_INSTANTIATE(bfloat16_t)
KSHARD_FLASH_HOST_INSTANTIATE(float16_t)
#undef KSHARD_FLASH_HOST_INSTANTIATE

}  // namespace kshard::detail
