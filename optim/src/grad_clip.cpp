#include "kshard/optim/grad_clip.hpp"

#include <cmath>
#include <string>

#include "grad_kernels.hpp"
#include "kshard/error.hpp"

namespace kshard {
namespace {

using namespace detail;

/// Scratch of the device statistics, kept between calls (clipping runs every
/// step; a fresh device allocation each time would cost more than the
/// kernels) and released when Kokkos finalises.
Kokkos::View<double*, MemSpace>& norm_slots() {
  static Kokkos::View<double*, MemSpace> slots;
  if (slots.size() == 0 && device_stats()) {
    slots = Kokkos::View<double*, MemSpace>(
        Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string("kshard.cache:optim_norm_slots")),
        2 * stat_slots());
    Kokkos::push_finalize_hook([] { norm_slots() = Kokkos::View<double*, MemSpace>(); });
  }
  return slots;
}

/// This rank's sum of squares over all Views: one reduction kernel per
/// non-empty View, one total.
double local_sum_squares(const std::vector<Kokkos::View<float*>>& grads) {
  GradStatsBatch batch(norm_slots());
  for (const auto& g : grads) batch.add(g);
  double r[2];
  batch.finish(r);
  return r[0];
}

}  // namespace

double grad_norm(const std::vector<Kokkos::View<float*>>& grads, const Communicator& shard_comm) {
  double sum = local_sum_squares(grads);
  Kokkos::View<double*, Kokkos::HostSpace, Kokkos::MemoryUnmanaged> buf(&sum, 1);
  shard_comm.all_reduce(buf, ReduceOp::sum);
  return std::sqrt(sum);
}

double clip_coefficient(double norm, double max_norm) noexcept {
  if (!(max_norm > 0.0) || !std::isfinite(norm)) return 1.0;
  const double c = max_norm / (norm + 1e-6);
  return c < 1.0 ? c : 1.0;
}

double clip_grad_norm(const std::vector<Kokkos::View<float*>>& grads, double max_norm,
                      const Communicator& shard_comm, bool error_if_nonfinite) {
  const double norm = grad_norm(grads, shard_comm);
  if (!std::isfinite(norm)) {
    // The norm is the same on every rank of shard_comm, so all throw together.
    if (error_if_nonfinite)
      throw Error("clip_grad_norm: the global gradient norm is " + std::to_string(norm),
                  "finite gradients (an inf or NaN is in some rank's shard)");
    return norm;
  }
  const double coef = clip_coefficient(norm, max_norm);
  if (coef < 1.0) {
    for (const auto& g : grads)
      if (g.size() > 0)
        Kokkos::parallel_for("kshard.optim.clip_scale", Range(0, std::int64_t(g.size())),
                             ScaleInPlace{g, float(coef)});
  }
  return norm;
}

}  // namespace kshard
