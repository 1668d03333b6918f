#include "kshard/engine/nn/swiglu_mlp.hpp"

#include "kshard/error.hpp"

namespace kshard {

template <class T>
SwiGLUMLP<T>::SwiGLUMLP(std::int64_t features, std::int64_t ffn, double eps)
    : d_(features), ffn_(ffn), norm_(features, eps), gate_up_(features, 2 * ffn, false),
      down_(ffn, features, false), act_(ffn) {}

template <class T>
void SwiGLUMLP<T>::forward(Kokkos::View<const T*> x, ActShape shape, const ConstViews& params,
                           Kokkos::View<T*> y) {
  detail::check_forward<T>(*this, x, shape, params, y);
  const std::int64_t rows = shape.rows();
  detail::ensure_size(a_, rows * 2 * ffn_, "kshard::SwiGLUMLP::a");
  auto h = detail::scratch<T>(rows * d_, "kshard::SwiGLUMLP::h");
  norm_.forward(x, shape, subs_.params("norm", params), h.view);
  gate_up_.forward(h.view, shape, subs_.params("gate_up", params), a_);
  auto g = detail::scratch<T>(rows * ffn_, "kshard::SwiGLUMLP::g");
  act_.forward(a_, {shape.batch, shape.seq, 2 * ffn_}, {}, g.view);
  down_.forward(g.view, {shape.batch, shape.seq, ffn_}, subs_.params("down", params), y);
  x_ = x;
  shape_ = shape;
  saved_ = true;
}

template <class T>
void SwiGLUMLP<T>::backward(Kokkos::View<const T*> dy, const ConstViews& params,
                            const GradViews& grads, Kokkos::View<T*> dx) {
  detail::check_backward<T>(*this, saved_, shape_, dy, params, grads, dx);
  const std::int64_t rows = shape_.rows();
  // One [rows, ffn] buffer holds the rebuilt SwiGLU output g, then its
  // gradient: Linear::backward reads its input for the weight gradient
  // before it writes dx.
  auto g = detail::scratch<T>(rows * ffn_, "kshard::SwiGLUMLP::g");
  act_.forward(a_, {shape_.batch, shape_.seq, 2 * ffn_}, {}, g.view);
  down_.rebind_input(g.view);
  down_.backward(dy, subs_.params("down", params), subs_.grads("down", grads), g.view);
  auto da = detail::scratch<T>(rows * 2 * ffn_, "kshard::SwiGLUMLP::da");
  act_.backward(g.view, {}, {}, da.view);
  auto h = detail::scratch<T>(rows * d_, "kshard::SwiGLUMLP::h");
  norm_.forward(x_, shape_, subs_.params("norm", params), h.view);  // bitwise the forward's
  gate_up_.rebind_input(h.view);
  auto dh = detail::scratch<T>(rows * d_, "kshard::SwiGLUMLP::dh");
  gate_up_.backward(da.view, subs_.params("gate_up", params), subs_.grads("gate_up", grads),
                    dh.view);
  norm_.backward(dh.view, subs_.params("norm", params), subs_.grads("norm", grads), dx);
}

template <class T>
void SwiGLUMLP<T>::release() {
  norm_.release();
  gate_up_.release();
  down_.release();
  act_.release();
  x_ = {};
  saved_ = false;
}

#define KSHARD_INSTANTIATE_LAYER(T) template class SwiGLUMLP<T>;
KSHARD_FOR_EACH_COMPUTE_TYPE(KSHARD_INSTANTIATE_LAYER)
#undef KSHARD_INSTANTIATE_LAYER

}  // namespace kshard
