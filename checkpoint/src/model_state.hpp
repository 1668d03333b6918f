#pragma once
// What a checkpoint reads from and writes into: per FSDP unit, this rank's
// master shard and (with an optimizer) Adam's two moment shards, copied to
// host memory for I/O (Kokkos::deep_copy; a no-op alias on host builds).
#include <cstdint>
#include <cstddef>
#include <string>
#include <vector>

#include <Kokkos_Core.hpp>

#include "kshard/engine/fsdp/fsdp_model.hpp"
#include "kshard/optim/fused_adam.hpp"
#include "save_stages.hpp"

namespace kshard::detail {

/// The tensors saved per parameter, in file order.
inline const char* const kTensorKinds[3] = {"master", "exp_avg", "exp_avg_sq"};

/// FusedAdam's group g must be unit g's shard (as kshard-train registers
/// them); else kshard::Error.
void check_optimizer_matches(FsdpModel& model, const FusedAdam& opt);

/// Host copies of one unit's shard tensors.
struct UnitHost {
  Kokkos::View<float*, Kokkos::HostSpace> master, m32, v32;
  Kokkos::View<bfloat16_t*, Kokkos::HostSpace> m16, v16;
  /// Bytes of tensor `kind` (0 master, 1 exp_avg, 2 exp_avg_sq).
  const char* data(int kind) const;
};
UnitHost copy_to_host(ShardedGroup& group, const AdamGroupState* state);

/// The synchronous save's source: the live shards, one unit copied to the
/// host at a time (Kokkos calls: the calling thread only).
class LiveShards final : public HostShards {
 public:
  LiveShards(FsdpModel& model, const FusedAdam* opt) : model_(model), opt_(opt) {}
  const char* tensor(std::size_t unit, int kind) override;

 private:
  FsdpModel& model_;
  const FusedAdam* opt_;
  std::size_t unit_ = SIZE_MAX;
  UnitHost host_;
};

/// "layers.1.attn.qkv.weight".
std::string full_name(const ShardedGroup& group, std::size_t param);

}  // namespace kshard::detail
