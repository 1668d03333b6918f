#include "kshard/engine/nn/attention.hpp"
#include "kshard/compat/for_each.hpp"
#include "kshard/compat/kokkos.hpp"

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <type_traits>

#include "cached_attention.hpp"
#include "kshard/kernels/flash_attention.hpp"
#include "kshard/kernels/gemm.hpp"
#include "kshard/error.hpp"
#include "kshard/kernels/qkv_pack.hpp"

namespace kshard {

namespace detail {
namespace {

// One GEMM per (batch b, head h): matrix (b, h) of X starts at X + b*sbX + h*shX.
// A (b, h) grid is not one strided batch, so loop over the shorter axis and
// batch over the longer one.
template <class T>
void gemm_batch_heads(Trans ta, Trans tb, std::int64_t m, std::int64_t n, std::int64_t k,
                      accum_t<T> alpha, const T* a, std::int64_t lda, std::int64_t sba,
                      std::int64_t sha, const T* b, std::int64_t ldb, std::int64_t sbb,
                      std::int64_t shb, accum_t<T> beta,
                      T* c, std::int64_t ldc, std::int64_t sbc, std::int64_t shc,
                      std::int64_t batch, std::int64_t heads) {
  if (batch <= heads) {
    for (std::int64_t i = 0; i < batch; ++i)
      gemm_strided_batched<T>(ta, tb, m, n, k, alpha, a + i * sba, lda, sha, b + i * sbb, ldb, shb,
                              beta, c + i * sbc, ldc, shc, heads);
  } else {
    for (std::int64_t h = 0; h < heads; ++h)
      gemm_strided_batched<T>(ta, tb, m, n, k, alpha, a + h * sha, lda, sba, b + h * shb, ldb, sbb,
                              beta, c + h * shc, ldc, sbc, batch);
  }
}

}  // namespace

using Team = Kokkos::TeamPolicy<>::member_type;

// In place on prob: scaled scores -> causal softmax, one team per row; the
// statistics in accum_t<T>, the probabilities stored as T.
template <class T>
void causal_softmax_rows(Kokkos::View<T*> prob, std::int64_t nrows, std::int64_t seq) {
  using A = accum_t<T>;
  Kokkos::parallel_for(
      "kshard::causal_softmax", compat::row_team_policy(nrows),
      KOKKOS_LAMBDA(const Team& team) {
        const std::int64_t r = team.league_rank();
        const std::int64_t n = r % seq + 1;  // query position i sees keys 0..i
        T* p = prob.data() + r * seq;
        A mx = 0;
        compat::team_reduce(
            team, n,
            [&](std::int64_t j, A& m) {
              const A v = to_accum(p[j]);
              if (v > m) m = v;
            },
            Kokkos::Max<A>(mx));
        A sum = 0;
        compat::team_reduce(
            team, n, [&](std::int64_t j, A& s) { s += compat::exp(to_accum(p[j]) - mx); }, sum);
        const A inv = A(1) / sum;
        // exp is recomputed rather than stored before the sum, so 16-bit T
        // rounds each probability once.
        Kokkos::parallel_for(Kokkos::TeamThreadRange(team, seq), [&](std::int64_t j) {
          p[j] = j < n ? from_accum<T>(compat::exp(to_accum(p[j]) - mx) * inv) : from_accum<T>(A(0));
        });
      });
}

// In place on dprob: dP -> dS = P * (dP - sum_j P_j dP_j), zero where masked.
template <class T>
void causal_softmax_backward_rows(Kokkos::View<const T*> prob, Kokkos::View<T*> dprob,
                                  std::int64_t nrows, std::int64_t seq) {
  using A = accum_t<T>;
  Kokkos::parallel_for(
      "kshard::causal_softmax_backward",
      compat::row_team_policy(nrows),
      KOKKOS_LAMBDA(const Team& team) {
        const std::int64_t r = team.league_rank();
        const std::int64_t n = r % seq + 1;
        const T* p = prob.data() + r * seq;
        T* dp = dprob.data() + r * seq;
        A dot = 0;
        compat::team_reduce(
            team, n, [&](std::int64_t j, A& s) { s += to_accum(p[j]) * to_accum(dp[j]); }, dot);
        Kokkos::parallel_for(Kokkos::TeamThreadRange(team, seq), [&](std::int64_t j) {
          dp[j] = j < n ? from_accum<T>(to_accum(p[j]) * (to_accum(dp[j]) - dot))
                        : from_accum<T>(A(0));
        });
      });
}

template <class T>
void causal_attention_probs(Kokkos::View<const T*> qkv, Kokkos::View<T*> prob,
                            std::int64_t batch, std::int64_t seq, std::int64_t d,
                            std::int64_t heads) {
  using A = accum_t<T>;
  const std::int64_t hd = d / heads, ld = 3 * d, ss = seq * seq;
  const A scale = A(1) / std::sqrt(static_cast<A>(hd));
  const T* q = qkv.data();
  const T* k = q + d;
  // scores[b, h] = scale * Q_bh K_bh^T   ([seq, hd] x [hd, seq])
  gemm_batch_heads<T>(Trans::N, Trans::T, seq, seq, hd, scale, q, ld, seq * ld, hd, k, ld,
                      seq * ld, hd, A(0), prob.data(), seq, heads * ss, ss, batch, heads);
  causal_softmax_rows<T>(prob, batch * heads * seq, seq);
}

template <class T>
void causal_attention_forward(Kokkos::View<const T*> qkv, Kokkos::View<T*> prob,
                              Kokkos::View<T*> ctx, std::int64_t batch, std::int64_t seq,
                              std::int64_t d, std::int64_t heads) {
  using A = accum_t<T>;
  const std::int64_t hd = d / heads, ld = 3 * d, ss = seq * seq;
  const T* v = qkv.data() + 2 * d;
  causal_attention_probs<T>(qkv, prob, batch, seq, d, heads);
  // ctx[b, :, h] = P_bh V_bh   ([seq, seq] x [seq, hd]), heads side by side in ctx rows
  gemm_batch_heads<T>(Trans::N, Trans::N, seq, hd, seq, A(1), prob.data(), seq, heads * ss, ss, v,
                      ld, seq * ld, hd, A(0), ctx.data(), d, seq * d, hd, batch, heads);
}

template <class T>
void causal_attention_backward(Kokkos::View<const T*> qkv, Kokkos::View<const T*> prob,
                               Kokkos::View<const T*> dctx, Kokkos::View<T*> dprob,
                               Kokkos::View<T*> dqkv, std::int64_t batch, std::int64_t seq,
                               std::int64_t d, std::int64_t heads) {
  using A = accum_t<T>;
  const std::int64_t hd = d / heads, ld = 3 * d, ss = seq * seq;
  const A scale = A(1) / std::sqrt(static_cast<A>(hd));
  const T* q = qkv.data();
  const T* k = q + d;
  const T* v = q + 2 * d;
  const T* p = prob.data();
  const T* dc = dctx.data();
  T* dq = dqkv.data();
  T* dk = dq + d;
  T* dv = dq + 2 * d;
  // dP = dctx V^T
  gemm_batch_heads<T>(Trans::N, Trans::T, seq, seq, hd, A(1), dc, d, seq * d, hd, v, ld, seq * ld,
                      hd, A(0), dprob.data(), seq, heads * ss, ss, batch, heads);
  // dV = P^T dctx
  gemm_batch_heads<T>(Trans::T, Trans::N, seq, hd, seq, A(1), p, seq, heads * ss, ss, dc, d,
                      seq * d, hd, A(0), dv, ld, seq * ld, hd, batch, heads);
  causal_softmax_backward_rows<T>(prob, dprob, batch * heads * seq, seq);
  const T* ds = dprob.data();
  // dQ = scale * dS K ; dK = scale * dS^T Q
  gemm_batch_heads<T>(Trans::N, Trans::N, seq, hd, seq, scale, ds, seq, heads * ss, ss, k, ld,
                      seq * ld, hd, A(0), dq, ld, seq * ld, hd, batch, heads);
  gemm_batch_heads<T>(Trans::T, Trans::N, seq, hd, seq, scale, ds, seq, heads * ss, ss, q, ld,
                      seq * ld, hd, A(0), dk, ld, seq * ld, hd, batch, heads);
}

#define KSHARD_ATTN_INSTANTIATE(T)                                                              \
  template void causal_softmax_rows<T>(Kokkos::View<T*>, std::int64_t, std::int64_t);          \
  template void causal_softmax_backward_rows<T>(Kokkos::View<const T*>, Kokkos::View<T*>,      \
                                                std::int64_t, std::int64_t);                   \
  template void causal_attention_probs<T>(Kokkos::View<const T*>, Kokkos::View<T*>,            \
                                          std::int64_t, std::int64_t, std::int64_t,            \
                                          std::int64_t);                                       \
  template void causal_attention_forward<T>(Kokkos::View<const T*>, Kokkos::View<T*>,          \
                                            Kokkos::View<T*>, std::int64_t, std::int64_t,      \
                                            std::int64_t, std::int64_t);                       \
  template void causal_attention_backward<T>(                                                  \
      Kokkos::View<const T*>, Kokkos::View<const T*>, Kokkos::View<const T*>, Kokkos::View<T*>, \
      Kokkos::View<T*>, std::int64_t, std::int64_t, std::int64_t, std::int64_t);
KSHARD_FOR_EACH_COMPUTE_TYPE(KSHARD_ATTN_INSTANTIATE)
#undef KSHARD_ATTN_INSTANTIATE

}  // namespace detail

namespace {
std::atomic<int> g_impl{-1};  // -1: not decided yet (read the environment)
}  // namespace

void set_attention_impl(AttentionImpl impl) noexcept { g_impl = int(impl); }
AttentionImpl attention_impl() noexcept {
  int v = g_impl.load();
  if (v < 0) {
    const char* e = std::getenv("KSHARD_ATTENTION");
    AttentionImpl a = AttentionImpl::automatic;
    if (e && std::strcmp(e, "unfused") == 0) a = AttentionImpl::unfused;
    if (e && std::strcmp(e, "fused") == 0) a = AttentionImpl::fused;
    if (e && std::strcmp(e, "recompute") == 0) a = AttentionImpl::recompute;
    v = int(a);
    g_impl = v;
  }
  return AttentionImpl(v);
}

template <class T>
AttentionImpl resolved_attention_impl() noexcept {
  const AttentionImpl a = attention_impl();
  if (a != AttentionImpl::automatic) return a;
#if defined(KOKKOS_ENABLE_CUDA)
  // f32/f64 on CUDA: cuBLAS products (the portable fused kernel has no tensor
  // cores), without keeping [B, H, T, T] per layer alive until backward.
  return is_low_precision_v<T> ? AttentionImpl::fused : AttentionImpl::recompute;
#else
  return AttentionImpl::fused;
#endif
}

template <class T>
AttentionImpl resolved_attention_impl(std::int64_t batch, std::int64_t seq, std::int64_t d_model,
                                      std::int64_t heads) noexcept {
  const AttentionImpl a = resolved_attention_impl<T>();
#if defined(KOKKOS_ENABLE_CUDA)
  // f32 on CUDA: the exact-f32 fused kernel (head dims 64 and 128) beats the
  // cuBLAS-based recompute path (it skips the masked half of every product
  // and never writes [B, H, T, T]); elsewhere only the portable kernel exists.
  if constexpr (std::is_same_v<T, float>) {
    if (attention_impl() == AttentionImpl::automatic && batch > 0 && seq > 0 && heads > 0 &&
        d_model > 0 && d_model % heads == 0) {
      detail::FlashArgs<T> args;
      args.batch = batch;
      args.seq = seq;
      args.d = d_model;
      args.heads = heads;
      if (std::strcmp(detail::flash_attention_path(args), "portable kernel") != 0)
        return AttentionImpl::fused;
    }
  }
#endif
  (void)batch;
  (void)seq;
  (void)d_model;
  (void)heads;
  return a;
}

#define KSHARD_RESOLVED_IMPL(T)                                          \
  template AttentionImpl resolved_attention_impl<T>() noexcept;     \
  template AttentionImpl resolved_attention_impl<T>(std::int64_t, std::int64_t, std::int64_t, \
                                                    std::int64_t) noexcept;
KSHARD_FOR_EACH_COMPUTE_TYPE(KSHARD_RESOLVED_IMPL)
#undef KSHARD_RESOLVED_IMPL

namespace {
std::int64_t checked_d_model(std::int64_t d, std::int64_t heads) {
  if (d <= 0 || heads <= 0 || d % heads != 0)
    throw Error("CausalSelfAttention(d_model=" + std::to_string(d) +
                    ", heads=" + std::to_string(heads) + ")",
                "d_model > 0, heads > 0 and d_model divisible by heads");
  return d;
}

std::int64_t checked_kv_heads(std::int64_t d, std::int64_t heads, const AttentionConfig& c) {
  const std::int64_t kv = c.kv_heads == 0 ? heads : c.kv_heads;
  if (kv <= 0 || heads % kv != 0)
    throw Error("CausalSelfAttention kv_heads=" + std::to_string(c.kv_heads) + " with " +
                    std::to_string(heads) + " heads",
                "kv_heads dividing heads (0: as many as heads)");
  if (!(c.rope_theta >= 0) || !std::isfinite(c.rope_theta) ||
      (c.rope_theta > 0 && (c.rope_theta <= 1 || (d / heads) % 2 != 0)))
    throw Error("CausalSelfAttention rope_theta=" + std::to_string(c.rope_theta) +
                    " at head dim " + std::to_string(d / heads),
                "0 (no rotary embedding) or a finite base > 1 with an even head dim");
  return kv;
}

// The pack kernels' view of an attention layer over `s`.
template <class T>
detail::QkvLayout qkv_layout(const CausalSelfAttention<T>& a, const ActShape& s) {
  return {s.rows(), s.seq, a.heads(), a.kv_heads(), a.head_dim(), a.rope_theta()};
}
}  // namespace

template <class T>
CausalSelfAttention<T>::CausalSelfAttention(std::int64_t d_model, std::int64_t heads,
                                            AttentionConfig config)
    : d_(checked_d_model(d_model, heads)), heads_(heads),
      kv_heads_(checked_kv_heads(d_model, heads, config)), rope_theta_(config.rope_theta),
      qkv_proj_(d_model, (heads + 2 * kv_heads_) * (d_model / heads), config.bias),
      out_proj_(d_model, d_model, config.bias) {}

template <class T>
std::vector<ParamSpec> CausalSelfAttention<T>::param_specs() const {
  return subs_.specs();
}

template <class T>
void CausalSelfAttention<T>::forward(Kokkos::View<const T*> x, ActShape shape,
                                     const ConstViews& params, Kokkos::View<T*> y) {
  detail::check_forward<T>(*this, x, shape, params, y);
  const std::int64_t rows = shape.rows();
  path_ = resolved_attention_impl<T>(shape.batch, shape.seq, d_, heads_);
  detail::ensure_size(qkv_, rows * 3 * d_, "kshard::CausalSelfAttention::qkv");
  detail::ensure_size(ctx_, rows * d_, "kshard::CausalSelfAttention::ctx");
  if (packs()) {
    auto src = detail::scratch<T>(rows * qkv_proj_.out_features(),
                                  "kshard::CausalSelfAttention::qkv_gqa");
    qkv_proj_.forward(x, shape, subs_.params("qkv", params), src.view);
    detail::qkv_pack<T>(src.view, qkv_, qkv_layout(*this, shape));
  } else {
    qkv_proj_.forward(x, shape, subs_.params("qkv", params), qkv_);
  }
  const std::int64_t probs = shape.batch * heads_ * shape.seq * shape.seq;
  if (path_ == AttentionImpl::fused) {
    prob_ = {};
    detail::ensure_size(lse_, flash_attention_rows(shape.batch, shape.seq, heads_),
                        "kshard::CausalSelfAttention::lse");
    flash_attention_forward<T>(qkv_, ctx_, lse_, shape.batch, shape.seq, d_, heads_);
  } else if (path_ == AttentionImpl::recompute) {
    // The probabilities live in a pool block for this forward only; backward
    // computes them again (bitwise the same: same kernels, same inputs).
    prob_ = {};
    lse_ = {};
    auto p = detail::scratch<T>(probs, "kshard::CausalSelfAttention::prob_tmp");
    detail::causal_attention_forward<T>(qkv_, p.view, ctx_, shape.batch, shape.seq, d_, heads_);
  } else {
    lse_ = {};
    detail::ensure_size(prob_, probs, "kshard::CausalSelfAttention::prob");
    detail::causal_attention_forward<T>(qkv_, prob_, ctx_, shape.batch, shape.seq, d_, heads_);
  }
  out_proj_.forward(ctx_, shape, subs_.params("proj", params), y);
  shape_ = shape;
  saved_ = true;
}

template <class T>
void CausalSelfAttention<T>::backward(Kokkos::View<const T*> dy, const ConstViews& params,
                                      const GradViews& grads, Kokkos::View<T*> dx) {
  detail::check_backward<T>(*this, saved_, shape_, dy, params, grads, dx);
  const std::int64_t rows = shape_.rows();
  auto dctx = detail::scratch<T>(rows * d_, "kshard::CausalSelfAttention::dctx");
  auto dqkv = detail::scratch<T>(rows * 3 * d_, "kshard::CausalSelfAttention::dqkv");
  out_proj_.backward(dy, subs_.params("proj", params), subs_.grads("proj", grads), dctx.view);
  if (path_ == AttentionImpl::fused) {
    auto delta = detail::scratch<accum_t<T>>(static_cast<std::int64_t>(lse_.extent(0)),
                                             "kshard::CausalSelfAttention::delta");
    flash_attention_backward<T>(qkv_, ctx_, dctx.view, lse_, dqkv.view, shape_.batch,
                                shape_.seq, d_, heads_, delta.view);
  } else if (path_ == AttentionImpl::recompute) {
    const std::int64_t probs = shape_.batch * heads_ * shape_.seq * shape_.seq;
    auto p = detail::scratch<T>(probs, "kshard::CausalSelfAttention::prob_tmp");
    detail::causal_attention_probs<T>(qkv_, p.view, shape_.batch, shape_.seq, d_, heads_);
    auto dprob = detail::scratch<T>(probs, "kshard::CausalSelfAttention::dprob");
    detail::causal_attention_backward<T>(qkv_, p.view, dctx.view, dprob.view, dqkv.view,
                                         shape_.batch, shape_.seq, d_, heads_);
  } else {
    auto dprob = detail::scratch<T>(static_cast<std::int64_t>(prob_.extent(0)),
                                    "kshard::CausalSelfAttention::dprob");
    detail::causal_attention_backward<T>(qkv_, prob_, dctx.view, dprob.view, dqkv.view,
                                         shape_.batch, shape_.seq, d_, heads_);
  }
  // The projection's gradient: the packed one, folded back when the forward packed.
  Kokkos::View<const T*> dproj = dqkv.view;
  detail::Scratch<T> dsrc;
  if (packs()) {
    dsrc = detail::scratch<T>(rows * qkv_proj_.out_features(),
                              "kshard::CausalSelfAttention::dqkv_gqa");
    detail::qkv_unpack<T>(dqkv.view, dsrc.view, qkv_layout(*this, shape_));
    dproj = dsrc.view;
  }
  qkv_proj_.backward(dproj, subs_.params("qkv", params), subs_.grads("qkv", grads), dx);
}

template <class T>
void CausalSelfAttention<T>::decode(Kokkos::View<const T*> x, ActShape shape,
                                    const ConstViews& params, Kokkos::View<T*> y,
                                    DecodeStep<T>& step) {
  const std::string who = "CausalSelfAttention::decode";
  detail::check_forward<T>(*this, x, shape, params, y);
  if (step.kv == nullptr)
    throw Error(who + " without a key/value cache", "a DecodeStep whose kv points at one");
  if (step.position < 0 || step.position + shape.seq > step.capacity)
    throw Error(who + ": " + std::to_string(shape.seq) + " new tokens after " +
                    std::to_string(step.position) + " cached ones",
                "at most capacity=" + std::to_string(step.capacity) + " tokens per sequence");
  release();
  const std::int64_t rows = shape.rows(), hd = head_dim();
  // The cache, made (or remade) for this batch and capacity; its contents
  // past step.position are written below before anything reads them.
  const std::int64_t cache_n = shape.batch * kv_heads_ * step.capacity * hd;
  detail::ensure_size(step.kv->k, cache_n, "kshard::CausalSelfAttention::k_cache");
  detail::ensure_size(step.kv->v, cache_n, "kshard::CausalSelfAttention::v_cache");
  const detail::CachedAttentionShape cs{shape.batch, shape.seq, heads_, kv_heads_, hd,
                                        rope_theta_, step.position, step.capacity};
  {
    auto src = detail::scratch<T>(rows * qkv_proj_.out_features(),
                                  "kshard::CausalSelfAttention::decode_qkv");
    qkv_proj_.forward(x, shape, subs_.params("qkv", params), src.view);
    qkv_proj_.release();
    auto q = detail::scratch<T>(rows * d_, "kshard::CausalSelfAttention::decode_q");
    detail::kv_cache_append<T>(src.view, q.view, step.kv->k, step.kv->v, cs);
    auto ctx = detail::scratch<T>(rows * d_, "kshard::CausalSelfAttention::decode_ctx");
    detail::cached_attention<T>(q.view, step.kv->k, step.kv->v, ctx.view, cs);
    out_proj_.forward(ctx.view, shape, subs_.params("proj", params), y);
    out_proj_.release();
  }
}

template <class T>
void CausalSelfAttention<T>::release() {
  qkv_proj_.release();
  out_proj_.release();
  saved_ = false;
}

#define KSHARD_INSTANTIATE_LAYER(T) template class CausalSelfAttention<T>;
KSHARD_FOR_EACH_COMPUTE_TYPE(KSHARD_INSTANTIATE_LAYER)
#undef KSHARD_INSTANTIATE_LAYER

}  // namespace kshard
