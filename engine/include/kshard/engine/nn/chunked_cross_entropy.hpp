#pragma once
// The LM head and its cross-entropy loss in row chunks, so the [rows, vocab]
// logits never exist at once (the idea of Liger's fused linear cross-entropy;
// at 4096 tokens x 32000 classes they are 250 MiB in bf16, 500 MiB in f32).
//
//   kshard::Linear<bfloat16_t> head(d, vocab);
//   kshard::chunked_cross_entropy_async<bfloat16_t, std::int32_t>(
//       head, h, {batch, seq, d}, params, grads, targets, grad_scale, dh,
//       /*chunk_rows=*/1024, result);
//   double loss = kshard::cross_entropy_result(result, rows, vocab);  // waits
//
// For each chunk of up to chunk_rows consecutive rows: head.forward into one
// pooled [chunk_rows, vocab] buffer, the loss and its gradient written over
// those logits (the kernels of cross_entropy_loss), head.backward from them:
// grads += the chunk's parameter gradients, and the chunk's rows of dx
// written. So it is forward + cross_entropy_loss + backward of `head` (same
// loss, counted rows and grad_scale; parameter gradients summed chunk by
// chunk, so they differ from one pass in rounding only) with one chunk of
// logits alive instead of all of them. The head must be rows_independent().
//
// result (3 doubles of the default memory space) receives {mean loss, counted
// rows, bad targets} in stream order, as cross_entropy_loss_async; read it
// with cross_entropy_result(), which throws on a bad target. The head's saved
// forward is released at the end.
#include <cstdint>

#include "kshard/engine/nn/layer.hpp"

namespace kshard {

template <class T, class Target>
void chunked_cross_entropy_async(Layer<T>& head, Kokkos::View<const T*> x, ActShape shape,
                                 const typename Layer<T>::ConstViews& params,
                                 const typename Layer<T>::GradViews& grads,
                                 Kokkos::View<const Target*> targets, double grad_scale,
                                 Kokkos::View<T*> dx, std::int64_t chunk_rows,
                                 Kokkos::View<double*> result);

/// Rows per chunk so that one chunk of logits takes at most `bytes`: the
/// fewest chunks that fit, rows spread evenly (at least one row per chunk).
std::int64_t loss_chunk_rows(std::size_t bytes, std::int64_t rows, std::int64_t vocab,
                             std::size_t elem_bytes);

}  // namespace kshard
