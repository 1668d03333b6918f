#include "loss_head.hpp"

#include "kshard/engine/nn/chunked_cross_entropy.hpp"
#include "kshard/engine/nn/loss.hpp"
#include "kshard/error.hpp"
#include "kshard/numeric/types.hpp"

namespace kshard::detail {

template <class T>
void LossHead<T>::last_unit_backward(Layer<T>&, Kokkos::View<const T*>, const ActShape&,
                                     std::int64_t, const ConstViews&, const GradViews&,
                                     Kokkos::View<T*>) {
  throw Error("LossHead::last_unit_backward on a head that does not run the last unit",
              "a head with last_unit_chunk_bytes() > 0");
}

template <class T>
Kokkos::View<const T*> MseHead<T>::output_gradient(Kokkos::View<T*> out, const ActShape&) {
  grad_ = memory::acquire(out.extent(0) * sizeof(T), "kshard.loss.mse_grad");
  const auto d = grad_.view<T>(out.extent(0));
  loss_ = mse_loss<T, float>(out, target_, d, scale_);
  return d;
}

template <class T>
CrossEntropyHead<T>::CrossEntropyHead(Kokkos::View<const std::int32_t*> targets,
                                      double grad_scale, std::size_t chunk_bytes,
                                      Kokkos::View<double*> result)
    : targets_(targets), scale_(grad_scale), chunk_bytes_(chunk_bytes) {
  if (result.extent(0) == 3) {
    result_ = result;
  } else {
    own_ = memory::acquire(3 * sizeof(double), "kshard.loss.ce_result");
    result_ = own_.view<double>(3);
  }
}

template <class T>
Kokkos::View<const T*> CrossEntropyHead<T>::output_gradient(Kokkos::View<T*> logits,
                                                            const ActShape& shape) {
  rows_ = shape.rows();
  vocab_ = shape.features;
  // The gradient overwrites the logits: the last unit's backward reads its
  // input and dy, never its own output.
  cross_entropy_loss_async<T, std::int32_t>(logits, rows_, vocab_, targets_, logits, scale_,
                                            result_);
  return logits;
}

template <class T>
void CrossEntropyHead<T>::last_unit_backward(Layer<T>& last, Kokkos::View<const T*> input,
                                             const ActShape& in_shape, std::int64_t chunk_rows,
                                             const typename LossHead<T>::ConstViews& params,
                                             const typename LossHead<T>::GradViews& grads,
                                             Kokkos::View<T*> dx) {
  rows_ = in_shape.rows();
  vocab_ = last.out_features();
  chunked_cross_entropy_async<T, std::int32_t>(last, input, in_shape, params, grads, targets_,
                                               scale_, dx, chunk_rows, result_);
}

template <class T>
double CrossEntropyHead<T>::loss() {
  return cross_entropy_result(result_, rows_, vocab_);
}

#define KSHARD_LOSS_HEADS(T)          \
  template class LossHead<T>;         \
  template class MseHead<T>;          \
  template class CrossEntropyHead<T>;
KSHARD_LOSS_HEADS(float)
KSHARD_LOSS_HEADS(bfloat16_t)
KSHARD_LOSS_HEADS(float16_t)
#undef KSHARD_LOSS_HEADS

}  // namespace kshard::detail
