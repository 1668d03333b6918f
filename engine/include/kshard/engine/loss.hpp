#pragma once
// Losses: each returns the loss value on the host (as double, whatever T)
// and WRITES the gradient with respect to its input.
//
//   double l = kshard::mse_loss<float>(pred, target, dpred);
//   double l = kshard::cross_entropy_loss<float>(logits, rows, vocab, targets, dlogits);
//
// grad_scale multiplies the written gradient only (not the returned loss):
// e.g. 1/micro_batches when micro-batch gradients are accumulated.
#include <cstdint>

#include <Kokkos_Core.hpp>

namespace kshard {

/// mean over all n elements of (pred - target)^2; dpred = 2 (pred - target) / n.
template <class T>
double mse_loss(Kokkos::View<const T*> pred, Kokkos::View<const T*> target,
                Kokkos::View<T*> dpred, double grad_scale = 1.0);

/// Softmax cross-entropy over logits [rows, vocab] (row-major) with one
/// integer class per row; mean over the rows whose target is >= 0 (a
/// negative target, e.g. -100 as in PyTorch, marks a padding row: no loss, zero
/// gradient). Targets >= vocab throw kshard::Error. Target types: int32,
/// int64, or T (token ids stored like Embedding's input).
/// dlogits = (softmax(logits) - onehot(target)) / counted_rows.
template <class T, class Target>
double cross_entropy_loss(Kokkos::View<const T*> logits, std::int64_t rows, std::int64_t vocab,
                          Kokkos::View<const Target*> targets, Kokkos::View<T*> dlogits,
                          double grad_scale = 1.0);

}  // namespace kshard
