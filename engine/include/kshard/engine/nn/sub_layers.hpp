#pragma once
// SubLayers: a composite layer's sub-layers, named once.
//
//   class TransformerLayer : public Layer<T> {
//     LayerNorm<T> ln1_; CausalSelfAttention<T> attn_; LayerNormMLP<T> mlp_;
//     SubLayers<T> subs_{{"ln1", &ln1_}, {"attn", &attn_}, {"mlp", &mlp_}};  // after them
//     std::vector<ParamSpec> param_specs() const override { return subs_.specs(); }
//     ... ln1_.forward(x, shape, subs_.params("ln1", params), h1);
//
// The composite's parameters are its sub-layers' in declaration order, each
// named "<sub-layer>.<its name>" ("ln1.gamma", "attn.qkv.weight": the names
// checkpoints and exports use); a sub-layer named "" adds its names as they
// are. Each sub-layer's slice of the parameter / gradient Views is found by
// its name, so adding a parameter to one sub-layer cannot shift another's
// (before, composites sliced by counted indices). The fp8 policy, the fp8
// scaling state and the gradient write mode (kernels/grad_write.hpp: each
// sub-layer's backward runs once per composite backward, so each writes its
// own slice) go to every sub-layer, in declaration order.
//
// It points into the composite that owns it, so it (and so the composite) is
// neither copied nor moved; layers live where they were built (LayerDef
// makes them on the heap).
#include <cstddef>
#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

#include "kshard/engine/nn/layer.hpp"

namespace kshard {

template <class T>
class SubLayers {
 public:
  using ConstViews = typename Layer<T>::ConstViews;
  using GradViews = typename Layer<T>::GradViews;
  struct Part {
    std::string name;
    Layer<T>* layer;
  };

  /// Names must be distinct; the sub-layers must be constructed already
  /// (declare the SubLayers member after them).
  SubLayers(std::initializer_list<Part> parts);
  SubLayers(const SubLayers&) = delete;
  SubLayers& operator=(const SubLayers&) = delete;

  /// Every sub-layer's specs, prefixed with its name, in declaration order.
  std::vector<ParamSpec> specs() const;
  /// The named sub-layer's parameter Views, out of the composite's `all`
  /// (kshard::Error for an unknown name or a list of the wrong length).
  ConstViews params(std::string_view name, const ConstViews& all) const;
  GradViews grads(std::string_view name, const GradViews& all) const;

  void set_fp8_policy(const Fp8Policy& policy);
  void fp8_scales(std::vector<Fp8Scale*>& out);
  /// Whether every sub-layer assigns_grads(); set_grad_write on each.
  bool assigns_grads() const;
  void set_grad_write(GradWrite w);

 private:
  struct Range {
    std::size_t first = 0, count = 0;
  };
  template <class Views>
  Views slice(std::string_view name, const Views& all) const;

  std::vector<Part> parts_;
  std::vector<Range> ranges_;
  std::size_t total_ = 0;
};

#define KSHARD_EXTERN_SUB_LAYERS(T) extern template class SubLayers<T>;
KSHARD_FOR_EACH_COMPUTE_TYPE(KSHARD_EXTERN_SUB_LAYERS)
#undef KSHARD_EXTERN_SUB_LAYERS

}  // namespace kshard
