#pragma once
// The per-row kernel of the cross-entropy loss (loss.cpp) where the backend
// has a faster one than the portable Kokkos team kernel. For the engine's layers (kshard::detail: not a user API).
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

/// The (logits, target) type pairs of the cross-entropy loss: M(T, Target)
/// for each, so that loss.cpp and every backend instantiate the same list.
#define KSHARD_FOR_EACH_CE_PAIR(M)                                                       \
  M(float, std::int32_t) M(float, std::int64_t) M(double, std::int32_t)                  \
  M(double, std::int64_t) M(bfloat16_t, std::int32_t) M(float16_t, std::int32_t)

/// A backend's explicit instantiation of cross_entropy_rows for one pair.
#define KSHARD_INSTANTIATE_CE_ROWS(T, Target)                                            \
  template bool cross_entropy_rows<T, Target>(const T*, std::int64_t, std::int64_t,     \
                                              const Target*, T*, double, const double*, \
                                              double*);
