#include "kshard/engine/nn/layer_norm_mlp.hpp"

#include "kshard/kernels/gelu.hpp"
#include "kshard/error.hpp"

namespace kshard {

template <class T>
LayerNormMLP<T>::LayerNormMLP(std::int64_t features, std::int64_t hidden, double eps)
    : d_(features), hidden_(hidden), ln_(features, eps), fc1_(features, hidden),
      fc2_(hidden, features) {}

template <class T>
std::vector<ParamSpec> LayerNormMLP<T>::param_specs() const {
  return subs_.specs();
}

template <class T>
void LayerNormMLP<T>::forward(Kokkos::View<const T*> x, ActShape shape, const ConstViews& params,
                              Kokkos::View<T*> y) {
  detail::check_forward<T>(*this, x, shape, params, y);
  const std::int64_t rows = shape.rows();
  detail::ensure_size(a_, rows * hidden_, "kshard::LayerNormMLP::a");
  const ActShape hidden_shape{shape.batch, shape.seq, hidden_};
  {
    // The LayerNorm output (fc1's input) is rebuilt in backward from x by
    // the same kernel (bitwise equal): one row-wise pass instead of a saved
    // [rows, d] per layer.
    auto h = detail::scratch<T>(rows * d_, "kshard::LayerNormMLP::h");
    ln_.forward(x, shape, subs_.params("ln", params), h.view);
    // The GELU output ([rows, hidden], the largest activation of the layer)
    // is not kept: backward recomputes it from the pre-activation a_ (one
    // elementwise pass) for fc2's weight gradient. Saves 4d per row per
    // layer at d_ff = 4d.
    // On the fp8 path fc2 quantizes gelu(a_) itself (GELU applied in its
    // casts): fc1 writes only the pre-activation and g is never written.
    gelu_in_fc2_ = fc2_.fp8_runs(rows);
    if (gelu_in_fc2_) {
      fc1_.forward(h.view, shape, subs_.params("fc1", params), a_);
      fc2_.forward_fp8_of_gelu(a_, hidden_shape, subs_.params("fc2", params), y);
    } else {
      auto g = detail::scratch<T>(rows * hidden_, "kshard::LayerNormMLP::g");
      fc1_.forward_gelu(h.view, shape, subs_.params("fc1", params), a_, g.view);
      fc2_.forward(g.view, hidden_shape, subs_.params("fc2", params), y);
    }
  }
  x_ = x;
  shape_ = shape;
  saved_ = true;
}

template <class T>
void LayerNormMLP<T>::backward(Kokkos::View<const T*> dy, const ConstViews& params,
                               const GradViews& grads, Kokkos::View<T*> dx) {
  detail::check_backward<T>(*this, saved_, shape_, dy, params, grads, dx);
  const std::int64_t rows = shape_.rows();
  // One [rows, hidden] buffer serves the recomputed GELU output g and then
  // its gradient dg: Linear::backward computes fc2's weight gradient (which
  // reads g) before its input gradient (which overwrites g with dg).
  // (On the fp8 path fc2 casts gelu(a_)^T itself: g only receives dg.)
  auto g = detail::scratch<T>(rows * hidden_, "kshard::LayerNormMLP::g");
  if (!gelu_in_fc2_) {
    detail::gelu_forward<T>(a_, g.view);  // the forward's values (to rounding)
    fc2_.rebind_input(g.view);
  }
  fc2_.backward(dy, subs_.params("fc2", params), subs_.grads("fc2", grads), g.view);
  auto h = detail::scratch<T>(rows * d_, "kshard::LayerNormMLP::h");
  ln_.forward(x_, shape_, subs_.params("ln", params), h.view);  // bitwise the forward's
  fc1_.rebind_input(h.view);
  auto dh = detail::scratch<T>(rows * d_, "kshard::LayerNormMLP::dh");
  // g now holds dg, the gradient w.r.t. gelu(a_): on the fp8 path fc1's dy
  // casts apply GELU's backward as they load it; else it is written over dg.
  fc1_.backward_through_gelu(g.view, a_, subs_.params("fc1", params), subs_.grads("fc1", grads),
                             dh.view);
  ln_.backward(dh.view, subs_.params("ln", params), subs_.grads("ln", grads), dx);
}

template <class T>
void LayerNormMLP<T>::release() {
  ln_.release();
  fc1_.release();
  fc2_.release();
  x_ = {};
  saved_ = false;
  gelu_in_fc2_ = false;
}

#define KSHARD_INSTANTIATE_LAYER(T) template class LayerNormMLP<T>;
KSHARD_FOR_EACH_COMPUTE_TYPE(KSHARD_INSTANTIATE_LAYER)
#undef KSHARD_INSTANTIATE_LAYER

}  // namespace kshard
