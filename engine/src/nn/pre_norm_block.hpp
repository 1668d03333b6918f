#pragma once
// The pre-norm residual block both decoder blocks share (GPT-2's
// TransformerLayer, Llama's LlamaLayer), on their three named sub-layers:
//   x1 = x + attn(norm(x)),   y = x1 + mlp(x1)
// The norm's output (the attention's input) is not kept: backward rebuilds
// it from the block's input by the same kernel (bitwise the forward's) and
// hands it to the attention through rebind_input. Private to the engine.
#include "kshard/engine/nn/attention.hpp"
#include "kshard/engine/nn/sub_layers.hpp"

namespace kshard::detail {

template <class T>
struct PreNormBlock {
  Layer<T>& norm;
  CausalSelfAttention<T>& attn;
  Layer<T>& mlp;
  const SubLayers<T>& subs;
  const char *norm_name, *attn_name, *mlp_name;

  /// x1: [rows, d], kept by the block for backward; y written.
  void forward(Kokkos::View<const T*> x, ActShape shape, const typename Layer<T>::ConstViews& p,
               Kokkos::View<T*> x1, Kokkos::View<T*> y) const {
    const std::int64_t n = shape.numel();
    {
      auto h = scratch<T>(n, "kshard::PreNormBlock::h");
      norm.forward(x, shape, subs.params(norm_name, p), h.view);
      auto a = scratch<T>(n, "kshard::PreNormBlock::a");
      attn.forward(h.view, shape, subs.params(attn_name, p), a.view);
      add<T>(x, a.view, x1);
    }
    mlp.forward(x1, shape, subs.params(mlp_name, p), y);
    add<T>(x1, y, y);
  }

  /// Incremental decoding: the forward's sums with the attention reading
  /// and appending its cache (step); nothing kept (x1 is a pool block).
  void decode(Kokkos::View<const T*> x, ActShape shape, const typename Layer<T>::ConstViews& p,
              Kokkos::View<T*> y, DecodeStep<T>& step) const {
    const std::int64_t n = shape.numel();
    auto x1 = scratch<T>(n, "kshard::PreNormBlock::decode_x1");
    {
      auto h = scratch<T>(n, "kshard::PreNormBlock::h");
      norm.decode(x, shape, subs.params(norm_name, p), h.view, step);
      auto a = scratch<T>(n, "kshard::PreNormBlock::a");
      attn.decode(h.view, shape, subs.params(attn_name, p), a.view, step);
      add<T>(x, a.view, x1.view);
    }
    mlp.decode(x1.view, shape, subs.params(mlp_name, p), y, step);
    add<T>(x1.view, y, y);
  }

  /// x: the forward's input; grads +=, dx written.
  void backward(Kokkos::View<const T*> x, ActShape shape, Kokkos::View<const T*> dy,
                const typename Layer<T>::ConstViews& p, const typename Layer<T>::GradViews& g,
                Kokkos::View<T*> dx) const {
    const std::int64_t n = shape.numel();
    auto dx1 = scratch<T>(n, "kshard::PreNormBlock::dx1");
    auto dh = scratch<T>(n, "kshard::PreNormBlock::dh");
    // y = x1 + mlp(x1): dx1 = dy + mlp'(dy)
    mlp.backward(dy, subs.params(mlp_name, p), subs.grads(mlp_name, g), dx1.view);
    add<T>(dx1.view, dy, dx1.view);
    // x1 = x + attn(norm(x)): dx = dx1 + norm'(attn'(dx1)), the norm's output rebuilt.
    auto h = scratch<T>(n, "kshard::PreNormBlock::h");
    norm.forward(x, shape, subs.params(norm_name, p), h.view);
    attn.rebind_input(h.view);
    attn.backward(dx1.view, subs.params(attn_name, p), subs.grads(attn_name, g), dh.view);
    norm.backward(dh.view, subs.params(norm_name, p), subs.grads(norm_name, g), dx);
    add<T>(dx, dx1.view, dx);
  }
};

}  // namespace kshard::detail
