#include "kshard/engine/nn/chunked_cross_entropy.hpp"

#include <algorithm>
#include <string>
#include <utility>

#include "kshard/kernels/cross_entropy_rows.hpp"
#include "cross_entropy_parts.hpp"
#include "kshard/error.hpp"
#include "kshard/core/buffer_pool.hpp"

namespace kshard {

std::int64_t loss_chunk_rows(std::size_t bytes, std::int64_t rows, std::int64_t vocab,
                             std::size_t elem_bytes) {
  const std::size_t row_bytes = std::size_t(std::max<std::int64_t>(vocab, 1)) * elem_bytes;
  const std::int64_t all = std::max<std::int64_t>(rows, 1);
  const std::int64_t fit = std::clamp<std::int64_t>(std::int64_t(bytes / row_bytes), 1, all);
  // The fewest chunks that fit, with the rows spread evenly over them (4096
  // rows in two chunks of 2048, not 2097 + 1999: whole GEMM tiles).
  const std::int64_t chunks = (all + fit - 1) / fit;
  return (all + chunks - 1) / chunks;
}

template <class T, class Target>
void chunked_cross_entropy_async(Layer<T>& head, Kokkos::View<const T*> x, ActShape shape,
                                 const typename Layer<T>::ConstViews& params,
                                 const typename Layer<T>::GradViews& grads,
                                 Kokkos::View<const Target*> targets, double grad_scale,
                                 Kokkos::View<T*> dx, std::int64_t chunk_rows,
                                 Kokkos::View<double*> result) {
  const std::int64_t rows = shape.rows(), in = head.in_features(), vocab = head.out_features();
  const std::string who = "chunked_cross_entropy(" + head.kind() + ", rows=" +
                          std::to_string(rows) + ", vocab=" + std::to_string(vocab) + ")";
  if (!head.rows_independent())
    throw Error(who + ": a " + head.kind() + " head mixes rows",
                "a head whose rows are independent (Linear, LayerNormLinear, ...)");
  if (rows <= 0 || chunk_rows <= 0)
    throw Error(who + " with chunks of " + std::to_string(chunk_rows) + " rows",
                "rows > 0 and chunk_rows > 0");
  if (shape.features != in)
    throw Error(who + ": input of " + std::to_string(shape.features) + " features",
                std::to_string(in) + " (the head's in_features)");
  detail::check_size(who, "x", x.extent(0), rows * in);
  detail::check_size(who, "dx", dx.extent(0), rows * in);
  detail::check_size(who, "targets", targets.extent(0), rows);
  if (result.extent(0) < 3) detail::check_size(who, "result", result.extent(0), 3);

  const std::int64_t chunk = std::min(chunk_rows, rows);
  detail::loss::count_targets<T, Target>(targets, vocab, result);
  memory::Block loss_block = memory::acquire(std::size_t(rows) * sizeof(double),
                                             "kshard::cross_entropy.row_loss");
  Kokkos::View<double*> row_loss = loss_block.view<double>(std::size_t(rows));
  memory::Block logits_block = memory::acquire(std::size_t(chunk * vocab) * sizeof(T),
                                               "kshard::chunked_cross_entropy.logits");
  using Range = std::pair<std::int64_t, std::int64_t>;
  for (std::int64_t r0 = 0; r0 < rows; r0 += chunk) {
    const std::int64_t rc = std::min(chunk, rows - r0);
    const Range xr{r0 * in, (r0 + rc) * in}, rr{r0, r0 + rc};
    Kokkos::View<T*> logits = logits_block.view<T>(std::size_t(rc * vocab));
    const ActShape cs{1, rc, in};
    head.forward(Kokkos::subview(x, xr), cs, params, logits);
    detail::loss::row_losses<T, Target>(logits.data(), rc, vocab, Kokkos::subview(targets, rr),
                                        logits.data(), grad_scale, result,
                                        Kokkos::subview(row_loss, rr));
    // The head's backward reads its input and dy (here the gradient written
    // over the logits), never its own output.
    head.backward(logits, params, grads, Kokkos::subview(dx, xr));
  }
  head.release();
  detail::loss::mean_loss(row_loss, result);
  // Both blocks go back to the pool with the kernels queued: later users are
  // ordered after them on the one stream (kshard/core/buffer_pool.hpp).
}

#define KSHARD_CHUNKED_CE_INSTANTIATE(T, Target)                                           \
  template void chunked_cross_entropy_async<T, Target>(                                    \
      Layer<T>&, Kokkos::View<const T*>, ActShape, const typename Layer<T>::ConstViews&,   \
      const typename Layer<T>::GradViews&, Kokkos::View<const Target*>, double,            \
      Kokkos::View<T*>, std::int64_t, Kokkos::View<double*>);
KSHARD_FOR_EACH_CE_PAIR(KSHARD_CHUNKED_CE_INSTANTIATE)
#undef KSHARD_CHUNKED_CE_INSTANTIATE

}  // namespace kshard
