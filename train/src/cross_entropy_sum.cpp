#include "cross_entropy_sum.hpp"

#include "kshard/compat/kokkos.hpp"
#include "kshard/error.hpp"

namespace kshard::detail {

double cross_entropy_sum(Kokkos::View<const float*> logits, std::int64_t rows, std::int64_t vocab,
                         Kokkos::View<const std::int32_t*> targets) {
  if (rows < 0 || vocab < 1 || std::int64_t(logits.extent(0)) != rows * vocab ||
      std::int64_t(targets.extent(0)) != rows)
    throw Error("evaluation loss over " + std::to_string(logits.extent(0)) + " logits and " +
                    std::to_string(targets.extent(0)) + " targets for " + std::to_string(rows) +
                    " rows x vocab " + std::to_string(vocab),
                "rows x vocab logits and one target per row");
  double total = 0;
  Kokkos::parallel_reduce(
      "kshard.train.eval_cross_entropy", Kokkos::RangePolicy<>(0, rows),
      KOKKOS_LAMBDA(const std::int64_t r, double& acc) {
        const std::int32_t t = targets(r);
        if (t < 0 || t >= vocab) return;  // padding row (ids >= vocab were rejected on read)
        const std::int64_t base = r * vocab;
        float mx = logits(base);
        for (std::int64_t c = 1; c < vocab; ++c) mx = logits(base + c) > mx ? logits(base + c) : mx;
        double s = 0;
        for (std::int64_t c = 0; c < vocab; ++c) s += compat::exp(double(logits(base + c) - mx));
        acc += compat::log(s) + double(mx) - double(logits(base + t));
      },
      total);
  return total;
}

}  // namespace kshard::detail
