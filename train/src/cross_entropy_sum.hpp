#pragma once
// The evaluation's loss kernel (private): forward only, no gradient.
#include <cstdint>

#include <Kokkos_Core.hpp>

namespace kshard::detail {

/// Sum over the rows whose target is >= 0 of the softmax cross-entropy
/// log(sum_c exp(logits[r, c])) - logits[r, target[r]] of f32 logits
/// [rows, vocab] (row-major), each row computed in double from the f32
/// logits. One row per thread: the evaluation is not on the training path,
/// and a row's value does not depend on how rows are spread over threads or
/// ranks (only the final sum's order does).
double cross_entropy_sum(Kokkos::View<const float*> logits, std::int64_t rows, std::int64_t vocab,
                         Kokkos::View<const std::int32_t*> targets);

}  // namespace kshard::detail
