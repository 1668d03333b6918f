#pragma once
// Gradient norm and clipping by the global norm over the shard group.
//
//   std::vector<Kokkos::View<float*>> grads = {unit0.grad, unit1.grad};
//   double norm = kshard::clip_grad_norm(grads, /*max_norm=*/1.0, mesh.shard_comm());
//
// Each shard's sum of squares is accumulated in double by one reduction
// kernel per View, summed on the host and all-reduced once over
// `shard_comm`: the shard dimension only, because in HSDP the replicas hold
// identical shards and a reduction over the world would count each element
// once per replica. Every rank of shard_comm must call with the same number
// of Views (sizes may differ, be 0, or hold padding zeros).
#include <vector>

#include <Kokkos_Core.hpp>

#include "kshard/mesh/communicator.hpp"

namespace kshard {

/// Global L2 norm (sqrt of the double sum of squares) of the gradient shards.
/// Non-finite when some element is inf or NaN. Collective over shard_comm.
double grad_norm(const std::vector<Kokkos::View<float*>>& grads, const Communicator& shard_comm);

/// Scales the gradients in place by clip_coefficient(norm, max_norm) and
/// returns the pre-clip global norm. A non-finite norm leaves the gradients
/// untouched (and throws kshard::Error on every rank when
/// error_if_nonfinite). Collective over shard_comm.
double clip_grad_norm(const std::vector<Kokkos::View<float*>>& grads, double max_norm,
                      const Communicator& shard_comm, bool error_if_nonfinite = false);

/// PyTorch's coefficient: min(1, max_norm / (norm + 1e-6)); 1 when
/// max_norm <= 0 (no clipping) or the norm is not finite.
double clip_coefficient(double norm, double max_norm) noexcept;

}  // namespace kshard
