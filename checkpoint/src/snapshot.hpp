#pragma once
// The asynchronous save's source: host copies of ALL of this rank's shard
// tensors, taken at once on the calling thread, so that the background
// thread writes the state of the moment of the save while training changes
// the live shards. Kept across saves (reallocated only when a size or the
// moment dtype changes): a save allocates nothing after the first. The
// buffers are in compat::StagingSpace, pinned host memory under CUDA, so the
// device-to-host copies run at full bandwidth; on host builds they are plain
// host memory and the copy is a memcpy (the live shards cannot be aliased,
// as the synchronous save's mirror views do, since they keep changing).
#include <cstddef>
#include <vector>

#include <Kokkos_Core.hpp>

#include "kshard/compat/kokkos.hpp"
#include "kshard/engine/fsdp/fsdp_model.hpp"
#include "kshard/optim/fused_adam.hpp"
#include "save_stages.hpp"

namespace kshard::detail {

class Snapshot final : public HostShards {
 public:
  /// Copies every unit's master and (with opt) both moments. Calling thread
  /// (Kokkos); fences first, so the optimizer's last update is in it.
  void take(FsdpModel& model, const FusedAdam* opt);
  /// Allocates what take() will fill, without copying: the first save then
  /// pays no allocation (pinned host memory is slow to allocate: on the
  /// H200 the large model's first save blocked 2.8 s for 6.4 GB, about 0.3 s
  /// of which a copy at PCIe speed accounts for).
  void reserve(FsdpModel& model, const FusedAdam* opt);
  /// Pointers into the copies: no Kokkos call, safe on any thread.
  const char* tensor(std::size_t unit, int kind) override;
  /// Host bytes held.
  std::size_t bytes() const;

 private:
  template <class T>
  using HostView = Kokkos::View<T*, compat::StagingSpace>;
  struct Unit {
    HostView<float> master, m32, v32;
    HostView<bfloat16_t> m16, v16;
    const char* data[3] = {nullptr, nullptr, nullptr};
  };
  /// Calls f(dst, src, kind, label) for each tensor unit u keeps: the master
  /// (kind 0) and, with opt, both moments (kinds 1, 2) in the optimizer's
  /// dtype; the views of what it does not keep are released.
  template <class F>
  void each_tensor(FsdpModel& model, const FusedAdam* opt, std::size_t u, F&& f);
  std::vector<Unit> units_;
};

}  // namespace kshard::detail
