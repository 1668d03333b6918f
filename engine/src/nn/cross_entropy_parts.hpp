#pragma once
// The cross-entropy loss (loss.cpp) as its three device stages, so that a
// caller producing the logits in row chunks (chunked_cross_entropy.cpp) runs
// the same kernels as cross_entropy_loss. Private to the engine.
//
//   count_targets   over ALL rows first: every gradient divides by the number
//                   of counted rows, so it must be known before any chunk;
//   row_losses      per chunk: row_loss[r] and dlogits (may alias logits;
//                   null: forward only, no gradient);
//   mean_loss       after the last chunk: result(0) = sum of row_loss / counted
//                   (mean = false: the sum itself).
//
// result = {mean loss, counted rows, bad targets} in device memory, written in
// stream order on the default execution space instance (no host wait).
#include <cstdint>

#include <Kokkos_Core.hpp>

namespace kshard::detail::loss {

template <class T, class Target>
void count_targets(Kokkos::View<const Target*> targets, std::int64_t vocab,
                   Kokkos::View<double*> result);

/// rows = targets.extent(0) = row_loss.extent(0) rows of logits [rows, vocab].
template <class T, class Target>
void row_losses(const T* logits, std::int64_t rows, std::int64_t vocab,
                Kokkos::View<const Target*> targets, T* dlogits, double grad_scale,
                Kokkos::View<const double*> result, Kokkos::View<double*> row_loss);

void mean_loss(Kokkos::View<const double*> row_loss, Kokkos::View<double*> result,
               bool mean = true);

}  // namespace kshard::detail::loss
