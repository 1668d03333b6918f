#pragma once
// The per-row kernel of the cross-entropy loss (loss.cpp) where the backend
// has a faster one than the portable Kokkos team kernel. Private to the engine.
//
// Per row r with a valid target t: lse = log sum_j exp(l_j), row_loss[r] =
// lse - l_t, dlogits[r, j] = g * (softmax_j - [j == t]) with g = grad_scale /
// result[1] (the counted rows, written on the device by the count kernel
// before); a row whose target is not a class gets row_loss 0 and a zero
// gradient row. dlogits may alias logits.
//
// CUDA: one 256-thread block per row, 16-byte loads, max and sum of
// exponentials in ONE pass (online rescaling, as in FlashAttention's softmax),
// then one pass that writes the gradient: the [rows, vocab] logits are read
// twice and written once (the portable kernel reads them three times). It
// serves float / bfloat16_t / float16_t with vocab a multiple of 16 bytes and
// 16-byte-aligned rows; everything else, and every host build, declines.
#include <cstdint>

namespace kshard::detail {

/// Returns false when the backend has no kernel for this case (nothing ran).
template <class T, class Target>
bool cross_entropy_rows(const T* logits, std::int64_t rows, std::int64_t vocab,
                        const Target* targets, T* dlogits, double grad_scale,
                        const double* result, double* row_loss);

}  // namespace kshard::detail
