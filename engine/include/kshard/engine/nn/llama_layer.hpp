#pragma once
// LlamaLayer: a Llama decoder block (pre-RMSNorm, grouped-query attention
// with rotary embeddings, SwiGLU MLP, no biases).
//   x1 = x + CausalSelfAttention(RMSNorm1(x))     (GQA + RoPE, AttentionConfig)
//   y  = x1 + SwiGLUMLP(x1)                        (RMSNorm2, gate/up, SwiGLU, down)
// Params, in order (6):
//   norm1.gamma [d], attn.qkv.weight [(h + 2 kv) hd, d], attn.proj.weight [d, d],
//   mlp.norm.gamma [d], mlp.gate_up.weight [2 ffn, d], mlp.down.weight [d, ffn]
//
//   kshard::LlamaBlockConfig c;
//   c.d_model = 2048; c.heads = 16; c.kv_heads = 4; c.ffn = 5632;
//   kshard::LlamaLayer<bfloat16_t> block(c);   // or kshard::layer<kshard::LlamaLayer>(c)
//   block.forward(x, {batch, seq, 2048}, params, y);
#include "kshard/engine/nn/attention.hpp"
#include "kshard/engine/nn/rms_norm.hpp"
#include "kshard/engine/nn/sub_layers.hpp"
#include "kshard/engine/nn/swiglu_mlp.hpp"

namespace kshard {
namespace detail {
template <class T>
struct PreNormBlock;
}  // namespace detail

/// A Llama block's shape (Hugging Face's LlamaConfig names in comments).
struct LlamaBlockConfig {
  std::int64_t d_model = 0;     ///< hidden_size
  std::int64_t heads = 0;       ///< num_attention_heads
  std::int64_t kv_heads = 0;    ///< num_key_value_heads (0: heads)
  std::int64_t ffn = 0;         ///< intermediate_size
  double rope_theta = 10000.0;  ///< rope_theta
  double norm_eps = 1e-5;       ///< rms_norm_eps
};

template <class T>
class LlamaLayer final : public Layer<T> {
 public:
  using typename Layer<T>::ConstViews;
  using typename Layer<T>::GradViews;

  explicit LlamaLayer(const LlamaBlockConfig& c);

  std::string kind() const override { return "LlamaLayer"; }
  std::vector<ParamSpec> param_specs() const override { return subs_.specs(); }
  std::int64_t in_features() const override { return d_; }
  std::int64_t out_features() const override { return d_; }
  const LlamaBlockConfig& config() const { return config_; }

  void forward(Kokkos::View<const T*> x, ActShape shape, const ConstViews& params,
               Kokkos::View<T*> y) override;
  void backward(Kokkos::View<const T*> dy, const ConstViews& params, const GradViews& grads,
                Kokkos::View<T*> dx) override;
  void release() override;
  /// Incremental decoding: the block's sums with its attention's decode
  /// (nn/decode_step.hpp); drops any saved forward.
  bool decodes() const override { return true; }
  void decode(Kokkos::View<const T*> x, ActShape shape, const ConstViews& params,
              Kokkos::View<T*> y, DecodeStep<T>& step) override;
  /// Kept: the input, the packed q/k/v (3), the context, x1, the gate/up
  /// output (2 ffn / d); plus the backward's per-token scratch at the peak.
  double saved_elements_per_row() const override {
    return 14.0 * double(d_) + 4.0 * double(config_.ffn);
  }
  void set_fp8_policy(const Fp8Policy& p) override { subs_.set_fp8_policy(p); }
  bool assigns_grads() const override { return subs_.assigns_grads(); }
  void set_grad_write(GradWrite w) override { subs_.set_grad_write(w); }
  void fp8_scales(std::vector<Fp8Scale*>& out) override { subs_.fp8_scales(out); }

 private:
  detail::PreNormBlock<T> block();  // the shared x1 = x + attn(norm(x)), y = x1 + mlp(x1)
  LlamaBlockConfig config_;
  std::int64_t d_;
  RMSNorm<T> norm1_;
  CausalSelfAttention<T> attn_;
  SwiGLUMLP<T> mlp_;
  SubLayers<T> subs_{{"norm1", &norm1_}, {"attn", &attn_}, {"mlp", &mlp_}};
  bool saved_ = false;
  ActShape shape_{};
  Kokkos::View<const T*> x_;  // the input (RMSNorm1's output is rebuilt from it)
  Kokkos::View<T*> x1_;       // after the first residual [rows, d]
};

#define KSHARD_EXTERN_LAYER(T) extern template class LlamaLayer<T>;
KSHARD_FOR_EACH_COMPUTE_TYPE(KSHARD_EXTERN_LAYER)
#undef KSHARD_EXTERN_LAYER

}  // namespace kshard
