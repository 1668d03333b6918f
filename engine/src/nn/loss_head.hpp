#pragma once
// A LossHead ends a training forward: it turns the model's output into the
// loss and the gradient the backward pass starts from. The schedule
// (FsdpModel) only runs units: before the forward it asks the head whether
// the head runs the last unit itself, then hands the head either the model's
// output or that last unit. Private to the engine.
//
//   MseHead           mean squared error against f32 targets (the output
//                     gradient in a pooled buffer).
//   CrossEntropyHead  softmax cross-entropy against int32 targets: the
//                     gradient written over the logits (no second
//                     logits-sized buffer); or, when the last unit's rows are
//                     independent (an LM head) and chunk bytes > 0, that unit's
//                     forward, the loss and its backward in row chunks
//                     (chunked_cross_entropy.hpp): the logits never exist whole.
//
// The loss stays on the device until the backward is queued behind it, so
// the GPU never idles while the host waits for a number: loss() is read last.
#include <cstdint>

#include <Kokkos_Core.hpp>

#include "kshard/core/buffer_pool.hpp"
#include "kshard/engine/nn/layer.hpp"

namespace kshard::detail {

template <class T>
class LossHead {
 public:
  using ConstViews = typename Layer<T>::ConstViews;
  using GradViews = typename Layer<T>::GradViews;
  virtual ~LossHead() = default;

  /// The most bytes of output one chunk may take when this head runs the
  /// last unit itself (which the schedule allows for a unit whose rows are
  /// independent); 0: it never does (the schedule then runs every unit and
  /// calls output_gradient).
  virtual std::size_t last_unit_chunk_bytes() const { return 0; }
  /// dL/d(out) times the gradient scale, queued on the device; `out` (the
  /// model's output) may be overwritten by it.
  virtual Kokkos::View<const T*> output_gradient(Kokkos::View<T*> out, const ActShape& shape) = 0;
  /// When the schedule left the last unit to the head: `last`'s forward on
  /// `input`, the loss and `last`'s backward (grads +=, dx written), in
  /// chunks of chunk_rows rows.
  virtual void last_unit_backward(Layer<T>& last, Kokkos::View<const T*> input,
                                  const ActShape& in_shape, std::int64_t chunk_rows,
                                  const ConstViews& params, const GradViews& grads,
                                  Kokkos::View<T*> dx);
  /// This rank's unscaled loss (reads the device: call once the backward is queued).
  virtual double loss() = 0;
};

template <class T>
class MseHead final : public LossHead<T> {
 public:
  MseHead(Kokkos::View<const float*> target, double grad_scale)
      : target_(target), scale_(grad_scale) {}
  Kokkos::View<const T*> output_gradient(Kokkos::View<T*> out, const ActShape& shape) override;
  double loss() override { return loss_; }

 private:
  Kokkos::View<const float*> target_;
  double scale_;
  memory::Block grad_;  // dL/d(out), alive until the head goes (after the backward)
  double loss_ = 0;
};

template <class T>
class CrossEntropyHead final : public LossHead<T> {
 public:
  /// chunk_bytes: the most bytes of logits one chunk may take (0: no chunks).
  /// result: 3 doubles where the loss is left on the device for the caller
  /// to read later ({mean loss, counted rows, bad targets}); empty: a pool
  /// block of the head's own, read by loss().
  CrossEntropyHead(Kokkos::View<const std::int32_t*> targets, double grad_scale,
                   std::size_t chunk_bytes, Kokkos::View<double*> result = {});
  std::size_t last_unit_chunk_bytes() const override { return chunk_bytes_; }
  Kokkos::View<const T*> output_gradient(Kokkos::View<T*> out, const ActShape& shape) override;
  void last_unit_backward(Layer<T>& last, Kokkos::View<const T*> input, const ActShape& in_shape,
                          std::int64_t chunk_rows, const typename LossHead<T>::ConstViews& params,
                          const typename LossHead<T>::GradViews& grads,
                          Kokkos::View<T*> dx) override;
  double loss() override;

 private:
  Kokkos::View<const std::int32_t*> targets_;
  double scale_;
  std::size_t chunk_bytes_;
  memory::Block own_;              // result_'s memory when the caller gave none
  Kokkos::View<double*> result_;  // {mean loss, counted rows, bad targets}, on the device
  std::int64_t rows_ = 0, vocab_ = 0;
};

}  // namespace kshard::detail
