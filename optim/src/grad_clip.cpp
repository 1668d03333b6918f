#include "kshard/optim/grad_clip.hpp"

#include <cmath>
#include <string>

#include "grad_kernels.hpp"
#include "kshard/error.hpp"

namespace kshard {
namespace {

using namespace optim_detail;

/// This rank's sum of squares over all Views: one reduction kernel per
/// non-empty View into one device buffer, one copy to the host, summed there
/// in View order (deterministic).
double local_sum_squares(const std::vector<Kokkos::View<float*>>& grads) {
  if (grads.empty()) return 0.0;
  Kokkos::View<double*, MemSpace> partials(
      Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string("kshard.optim.norm_partials")),
      2 * grads.size());
  for (std::size_t k = 0; k < grads.size(); ++k)
    if (grads[k].size() > 0) launch_sum_squares(grads[k], partials.data() + 2 * k);
  auto host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), partials);
  double sum = 0.0;
  for (std::size_t k = 0; k < grads.size(); ++k)
    if (grads[k].size() > 0) sum += host(2 * k);
  return sum;
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
