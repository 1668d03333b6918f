#pragma once
// CausalSelfAttention: multi-head self-attention with a causal mask, the
// attention half of a TransformerLayer (without its LayerNorm and residual).
//   qkv = x Wqkv^T + bqkv           Wqkv [3d, d]: rows [0,d) q, [d,2d) k, [2d,3d) v
//   per (batch, head h):            head h uses columns [h*hd, (h+1)*hd) of q, k, v
//     P = softmax(mask(q k^T / sqrt(hd)))   mask: position i sees keys j <= i
//     ctx = P v
//   y = ctx Wproj^T + bproj         Wproj [d, d]
// Params, in order: "qkv.weight", "qkv.bias", "proj.weight", "proj.bias".
//
// Llama's attention (AttentionConfig): grouped-query attention (kv_heads
// dividing heads: Wqkv [(heads + 2 kv_heads) hd, d], k/v head j shared by
// query heads j g .. j g + g - 1), rotary position embeddings on q and k
// (rope_theta > 0; rotate-half layout, kernels/qkv_pack.hpp) and no biases.
// The projection's output is packed into the core's [rows, 3d] layout (q and
// k rotated, k and v repeated per query head) by one kernel, so every core
// path below runs unchanged; its backward folds the packed gradient back.
//
//   kshard::CausalSelfAttention<float> attn(/*d_model=*/768, /*heads=*/12);
//   attn.forward(x, {batch, seq, 768}, params, y);
//
// The attention core is fused by default (kernels/flash_attention.hpp: online
// softmax, never stores [batch, heads, seq, seq]; tensor cores for bf16/f16 on
// CUDA); saved for backward: qkv [rows, 3d], ctx [rows, d] and the per-row
// log-sum-exp [batch, heads, seq]. The unfused path (set_attention_impl(unfused)
// or KSHARD_ATTENTION=unfused) is the reference the fused one is tested
// against: score and context products as strided-batched GEMMs over heads
// read in place from the qkv activation, a causal softmax with one Kokkos
// team per score row, and the probabilities [batch, heads, seq, seq] saved.
// The recompute path runs the same unfused kernels but keeps the
// probabilities only inside one forward or backward (a pool block shared by
// all layers) and computes them again in backward: one more score GEMM and
// softmax per layer instead of B*H*T*T elements per layer alive from forward
// to backward (the default for f32 on CUDA).
#include "kshard/engine/nn/linear.hpp"
#include "kshard/engine/nn/sub_layers.hpp"

namespace kshard {

/// Process-wide choice of the attention core for the next forwards.
/// automatic (the default; KSHARD_ATTENTION=fused|unfused|recompute overrides
/// it): the fused kernel wherever it is the fast one, i.e. everywhere except
/// f64 on CUDA and f32 on CUDA at head dims other than 64 and 128, where only
/// the portable Kokkos kernel exists (no tensor cores; 7-14x slower than the
/// cuBLAS-based unfused path on the H200, bench/attention): there, recompute.
/// f32 at head dims 64 and 128 runs kshard's exact-f32 CUDA kernel (FP32 FMA,
/// no TF32), so the choice depends on the shape: see the overload below.
enum class AttentionImpl { automatic, fused, unfused, recompute };
void set_attention_impl(AttentionImpl impl) noexcept;
AttentionImpl attention_impl() noexcept;
/// The path a forward in compute type T takes now (automatic resolved),
/// shape-blind: for f32 on CUDA this is recompute (the shape-aware overload
/// below may still pick fused).
template <class T>
AttentionImpl resolved_attention_impl() noexcept;
/// The path a forward in compute type T of this shape takes now: as above,
/// except that automatic f32 on CUDA resolves to fused where the fused backend
/// has a kernel of its own for the shape (not the portable one).
template <class T>
AttentionImpl resolved_attention_impl(std::int64_t batch, std::int64_t seq, std::int64_t d_model,
                                      std::int64_t heads) noexcept;

/// The attention's shape beyond d_model and heads (defaults: GPT-2's).
struct AttentionConfig {
  std::int64_t kv_heads = 0;  ///< key/value heads (GQA); 0: as many as query heads
  double rope_theta = 0;      ///< rotary embeddings' base (Llama: 10000, 500000); 0: none
  bool bias = true;           ///< biases on the qkv and output projections
};

template <class T>
class CausalSelfAttention final : public Layer<T> {
 public:
  using typename Layer<T>::ConstViews;
  using typename Layer<T>::GradViews;

  CausalSelfAttention(std::int64_t d_model, std::int64_t heads, AttentionConfig config = {});

  std::string kind() const override { return "CausalSelfAttention"; }
  std::vector<ParamSpec> param_specs() const override;
  std::int64_t in_features() const override { return d_; }
  std::int64_t out_features() const override { return d_; }
  std::int64_t heads() const { return heads_; }
  std::int64_t kv_heads() const { return kv_heads_; }
  double rope_theta() const { return rope_theta_; }
  std::int64_t head_dim() const { return d_ / heads_; }

  void forward(Kokkos::View<const T*> x, ActShape shape, const ConstViews& params,
               Kokkos::View<T*> y) override;
  void backward(Kokkos::View<const T*> dy, const ConstViews& params, const GradViews& grads,
                Kokkos::View<T*> dx) override;
  void release() override;
  /// Incremental decoding (nn/decode_step.hpp): the new tokens' keys and
  /// values (rotated, kv_heads heads) are appended to *step.kv at positions
  /// step.position.., then each new query attends to every cached key up to
  /// its own position (nn/cached_attention.hpp). The projections are the
  /// forward's Linears; kshard::Error without a cache or past its capacity.
  bool decodes() const override { return true; }
  void decode(Kokkos::View<const T*> x, ActShape shape, const ConstViews& params,
              Kokkos::View<T*> y, DecodeStep<T>& step) override;
  void set_fp8_policy(const Fp8Policy& p) override { subs_.set_fp8_policy(p); }
  bool assigns_grads() const override { return subs_.assigns_grads(); }
  void set_grad_write(GradWrite w) override { subs_.set_grad_write(w); }
  void fp8_scales(std::vector<Fp8Scale*>& out) override { subs_.fp8_scales(out); }
  /// Points the saved forward input (the qkv projection's, the only user of
  /// it in backward) at `x`, an equal recomputed copy: see Linear::rebind_input.
  void rebind_input(Kokkos::View<const T*> x) { qkv_proj_.rebind_input(x); }

 private:
  // Whether the projection's output is packed into the core's layout (GQA or RoPE).
  bool packs() const { return kv_heads_ != heads_ || rope_theta_ > 0; }

  std::int64_t d_, heads_, kv_heads_;
  double rope_theta_;
  Linear<T> qkv_proj_, out_proj_;
  SubLayers<T> subs_{{"qkv", &qkv_proj_}, {"proj", &out_proj_}};
  bool saved_ = false;
  AttentionImpl path_ = AttentionImpl::fused;  // the path of the saved forward
  ActShape shape_{};
  Kokkos::View<T*> qkv_;   // [rows, 3d]
  Kokkos::View<T*> prob_;  // unfused: [batch, heads, seq, seq]
  Kokkos::View<accum_t<T>*> lse_;  // fused: [batch, heads, seq]
  Kokkos::View<T*> ctx_;   // [rows, d]
};

namespace detail {
/// The causal probabilities alone (score GEMM + softmax) into prob.
template <class T>
void causal_attention_probs(Kokkos::View<const T*> qkv, Kokkos::View<T*> prob,
                            std::int64_t batch, std::int64_t seq, std::int64_t d,
                            std::int64_t heads);
/// Attention core on a packed qkv [batch*seq, 3d]: prob and ctx as above.
template <class T>
void causal_attention_forward(Kokkos::View<const T*> qkv, Kokkos::View<T*> prob,
                              Kokkos::View<T*> ctx, std::int64_t batch, std::int64_t seq,
                              std::int64_t d, std::int64_t heads);
/// dqkv (written) from dctx; dprob is a [batch, heads, seq, seq] workspace.
template <class T>
void causal_attention_backward(Kokkos::View<const T*> qkv, Kokkos::View<const T*> prob,
                               Kokkos::View<const T*> dctx, Kokkos::View<T*> dprob,
                               Kokkos::View<T*> dqkv, std::int64_t batch, std::int64_t seq,
                               std::int64_t d, std::int64_t heads);
}  // namespace detail

#define KSHARD_EXTERN_LAYER(T) extern template class CausalSelfAttention<T>;
KSHARD_FOR_EACH_COMPUTE_TYPE(KSHARD_EXTERN_LAYER)
#undef KSHARD_EXTERN_LAYER

}  // namespace kshard
