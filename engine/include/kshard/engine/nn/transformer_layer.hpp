#pragma once
// TransformerLayer: a pre-LN GPT block.
//   x1 = x + CausalSelfAttention(LayerNorm1(x))
//   y  = x1 + LayerNormMLP(x1)          (LayerNormMLP = LN2, fc1, GELU, fc2)
// The residual adds live here (not in the sub-layers), so each sub-layer is
// a plain function of its input.
// Params, in order (12):
//   ln1.gamma [d], ln1.beta [d],
//   attn.qkv.weight [3d, d], attn.qkv.bias [3d], attn.proj.weight [d, d], attn.proj.bias [d],
//   mlp.ln.gamma [d], mlp.ln.beta [d], mlp.fc1.weight [ff, d], mlp.fc1.bias [ff],
//   mlp.fc2.weight [d, ff], mlp.fc2.bias [d]
//
//   kshard::TransformerLayer<float> block(/*d_model=*/768, /*heads=*/12, /*d_ff=*/3072);
//   block.forward(x, {batch, seq, 768}, params, y);
#include "kshard/engine/nn/attention.hpp"
#include "kshard/engine/nn/layer_norm.hpp"
#include "kshard/engine/nn/layer_norm_mlp.hpp"
#include "kshard/engine/nn/sub_layers.hpp"

namespace kshard {
namespace detail {
template <class T>
struct PreNormBlock;
}  // namespace detail

template <class T>
class TransformerLayer final : public Layer<T> {
 public:
  using typename Layer<T>::ConstViews;
  using typename Layer<T>::GradViews;

  TransformerLayer(std::int64_t d_model, std::int64_t heads, std::int64_t d_ff,
                   double eps = 1e-5);

  std::string kind() const override { return "TransformerLayer"; }
  std::vector<ParamSpec> param_specs() const override;
  std::int64_t in_features() const override { return d_; }
  std::int64_t out_features() const override { return d_; }
  std::int64_t heads() const { return attn_.heads(); }
  std::int64_t d_ff() const { return mlp_.hidden_features(); }

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
  /// Kept from forward to backward: the input, q/k/v (3), the attention
  /// context, the residual sum, the MLP's pre-activation (4): 10 x width;
  /// plus, while this block's backward runs, its per-token scratch (rebuilt
  /// LayerNorm and GELU outputs, gradient buffers): ~18 x width at the peak.
  double saved_elements_per_row() const override { return 18.0 * double(d_); }
  void set_fp8_policy(const Fp8Policy& p) override { subs_.set_fp8_policy(p); }
  bool assigns_grads() const override { return subs_.assigns_grads(); }
  void set_grad_write(GradWrite w) override { subs_.set_grad_write(w); }
  void fp8_scales(std::vector<Fp8Scale*>& out) override { subs_.fp8_scales(out); }

 private:
  detail::PreNormBlock<T> block();  // the shared x1 = x + attn(norm(x)), y = x1 + mlp(x1)
  std::int64_t d_;
  LayerNorm<T> ln1_;
  CausalSelfAttention<T> attn_;
  LayerNormMLP<T> mlp_;
  SubLayers<T> subs_{{"ln1", &ln1_}, {"attn", &attn_}, {"mlp", &mlp_}};
  bool saved_ = false;
  ActShape shape_{};
  // The forward input (LN1's input, which the caller keeps for LN1's
  // backward anyway): LN1's output is not saved but rebuilt from it in
  // backward (one row-wise pass for one [rows, d] activation less per layer).
  Kokkos::View<const T*> x_;
  Kokkos::View<T*> x1_;   // after the first residual [rows, d]
};

#define KSHARD_EXTERN_LAYER(T) extern template class TransformerLayer<T>;
KSHARD_FOR_EACH_COMPUTE_TYPE(KSHARD_EXTERN_LAYER)
#undef KSHARD_EXTERN_LAYER

}  // namespace kshard
