#pragma once
// Losses: each returns the loss value on the host (as double, whatever T)
// and WRITES the gradient with respect to its input.
//
//   double l = kshard::mse_loss<float>(pred, target, dpred);
//   double l = kshard::cross_entropy_loss<float>(logits, rows, vocab, targets, dlogits);
//
// grad_scale multiplies the written gradient only (not the returned loss):
// e.g. 1/micro_batches when micro-batch gradients are accumulated.
// T: any compute type (kshard/numeric/compute.hpp); the loss, the softmax
// statistics and the gradient are computed in accum_t<T> and the gradient
// stored as T.
#include <cstdint>
#include <type_traits>

#include <Kokkos_Core.hpp>

#include "kshard/numeric/compute.hpp"

namespace kshard {

/// mean over all n elements of (pred - target)^2; dpred = 2 (pred - target) / n.
/// The target is T or (for 16-bit T) float.
template <class T, class U = T>
double mse_loss(Kokkos::View<const T*> pred,
                typename std::common_type<Kokkos::View<const U*>>::type target,  // U not deduced
                Kokkos::View<T*> dpred, double grad_scale = 1.0);

/// Softmax cross-entropy over logits [rows, vocab] (row-major) with one
/// integer class per row; mean over the rows whose target is >= 0 (a
/// negative target, e.g. -100 as in PyTorch, marks a padding row: no loss, zero
/// gradient). Targets >= vocab throw kshard::Error. Target types: int32
/// or int64 (class ids are integers; there is no floating-point id path).
/// dlogits = (softmax(logits) - onehot(target)) / counted_rows. dlogits may
/// be logits itself (in place: no second logits-sized buffer).
template <class T, class Target>
double cross_entropy_loss(Kokkos::View<const T*> logits, std::int64_t rows, std::int64_t vocab,
                          Kokkos::View<const Target*> targets, Kokkos::View<T*> dlogits,
                          double grad_scale = 1.0);

/// The same without waiting for the device (a training step launches its
/// backward behind it): result (3 doubles of the default memory space)
/// receives {mean loss, counted rows, bad targets} in stream order. A bad
/// target's row is treated as ignored; cross_entropy_result() reads the result
/// (waits) and throws kshard::Error when a target was bad.
template <class T, class Target>
void cross_entropy_loss_async(Kokkos::View<const T*> logits, std::int64_t rows,
                              std::int64_t vocab, Kokkos::View<const Target*> targets,
                              Kokkos::View<T*> dlogits, double grad_scale,
                              Kokkos::View<double*> result);
double cross_entropy_result(Kokkos::View<const double*> result, std::int64_t rows,
                            std::int64_t vocab);

/// The forward-only mode (evaluation): the sum over the rows whose target is
/// >= 0 of each row's softmax cross-entropy, and how many rows that is; no
/// gradient is written. The per-row loss is the one cross_entropy_loss
/// computes (its kernels, accum_t<T> arithmetic), so an evaluation and a
/// training step agree on every row; a row's value does not depend on how
/// rows are spread over chunks or ranks. Targets >= vocab throw
/// kshard::Error. Waits for the device.
struct CrossEntropySum {
  double sum = 0;         ///< of the counted rows' losses
  std::int64_t rows = 0;  ///< counted rows (target >= 0)
};
template <class T, class Target>
CrossEntropySum cross_entropy_sum(Kokkos::View<const T*> logits, std::int64_t rows,
                                  std::int64_t vocab, Kokkos::View<const Target*> targets);

}  // namespace kshard
