#pragma once
// LayerDef: a layer described once and built in whatever compute type the
// model's Recipe asks for (FSDP2's MixedPrecisionPolicy casts a module; here
// the model instantiates Layer<float>, Layer<bfloat16_t> or Layer<float16_t>).
//
//   std::vector<kshard::LayerDef> defs{
//       kshard::layer<kshard::Embedding>(vocab, d, seq),
//       kshard::layer<kshard::TransformerLayer>(d, heads, 4 * d),
//       kshard::layer<kshard::LayerNorm>(d),
//       kshard::layer<kshard::Linear>(d, vocab)};
//   kshard::FsdpModel model(mesh, defs, kshard::Recipe::parse("bf16"));
//
// The constructor arguments are copied and replayed for each type asked for.
#include <functional>
#include <memory>

#include "kshard/engine/nn/layer.hpp"

namespace kshard {

class LayerDef {
 public:
  template <template <class> class L, class... Args>
  static LayerDef of(Args... args) {
    LayerDef d;
    d.f32_ = [=] { return std::unique_ptr<Layer<float>>(new L<float>(args...)); };
    d.f64_ = [=] { return std::unique_ptr<Layer<double>>(new L<double>(args...)); };
    d.bf16_ = [=] { return std::unique_ptr<Layer<bfloat16_t>>(new L<bfloat16_t>(args...)); };
    d.f16_ = [=] { return std::unique_ptr<Layer<float16_t>>(new L<float16_t>(args...)); };
    return d;
  }

  /// The layer in compute type T (float, double, bfloat16_t, float16_t).
  template <class T>
  std::unique_ptr<Layer<T>> make() const {
    if constexpr (std::is_same_v<T, float>) return f32_();
    if constexpr (std::is_same_v<T, double>) return f64_();
    if constexpr (std::is_same_v<T, bfloat16_t>) return bf16_();
    if constexpr (std::is_same_v<T, float16_t>) return f16_();
  }

 private:
  std::function<std::unique_ptr<Layer<float>>()> f32_;
  std::function<std::unique_ptr<Layer<double>>()> f64_;
  std::function<std::unique_ptr<Layer<bfloat16_t>>()> bf16_;
  std::function<std::unique_ptr<Layer<float16_t>>()> f16_;
};

/// kshard::layer<kshard::Linear>(in, out) == LayerDef::of<kshard::Linear>(in, out).
template <template <class> class L, class... Args>
LayerDef layer(Args... args) {
  return LayerDef::of<L>(args...);
}

}  // namespace kshard
