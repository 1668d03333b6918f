#pragma once
// FusedAdam: Adam / AdamW over flat FSDP shards.
//
//   kshard::AdamOptions o;            // lr 1e-3, betas (0.9, 0.999), AdamW
//   o.weight_decay = 0.1f;
//   kshard::FusedAdam opt(o, mesh.shard_comm(), mesh.world());
//   for (std::size_t i = 0; i < model.num_units(); ++i)
//     opt.add_group(model.group(i));      // one FSDP unit: master, grad, 16-bit copy
//   ...                                   // backward + reduce-scatter fill `grad`
//   kshard::StepResult r = opt.step(loss_scale, /*max_grad_norm=*/1.0);
//   if (r.skipped) scaler.backoff();      // inf/NaN somewhere: nobody stepped
//
// One parameter group is one flat shard: fp32 master weights, the fp32
// gradient shard (reduce-scattered and already averaged), and optionally a
// bf16/fp16 copy of the parameters that the update kernel refreshes from the
// new master (the all-gather source). The moments m and v belong to the
// optimizer, are allocated by add_group (fp32 or bf16, AdamOptions::moment_dtype)
// and are reachable through state() for checkpoints.
//
// A step is:
//  1. per group, one reduction kernel: sum of squares (double) and count of
//     non-finite values of the gradient (and one tiny kernel totalling them);
//  2. two tiny all_reduces for all groups together: the sum of squares over
//     the SHARD communicator only (in HSDP the replicas hold identical shards,
//     so reducing over the world would count the norm once per replica), and
//     the non-finite flag over the WORLD, so that every rank skips together;
//  3. unless something was non-finite, per group ONE update kernel over the
//     whole shard (a flat range): gradient unscale (1/loss_scale), clipping
//     coefficient, L2 or decoupled weight decay, moments, bias correction,
//     master update and the low-precision model copy, all in one pass.
//
// Every rank takes part in every collective and every step, including ranks
// whose shard is empty or holds only FSDP padding; the step counter advances
// on all ranks alike. Constructor, add_group, grad_stats and step are
// collective over `world`: a bad argument on any rank is a kshard::Error on
// every rank. The update kernels are ordered on the default execution space;
// step() does not wait for them (the reduction results are waited for).
//
// Cost: the update reads master, grad, m, v and writes master, m, v: 28 B per
// parameter with fp32 state (+2 with a 16-bit model copy; 20 with bf16
// moments). The statistics are one more read of the gradient (4 B), needed
// before any update because of clipping and the skip; a caller that already
// has them (e.g. summed in the reduce-scatter's epilogue) calls apply().
// The step counter is a host integer: the skip decision comes to the host
// anyway (StepResult), so a device copy would buy nothing.
#include <cstddef>
#include <cstdint>
#include <vector>

#include <Kokkos_Core.hpp>

#include "kshard/dtype.hpp"
#include "kshard/engine/fsdp/low_precision_shard.hpp"
#include "kshard/mesh/communicator.hpp"
#include "kshard/numeric/types.hpp"

namespace kshard {

class ShardedGroup;

struct AdamOptions {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.f;
  /// true: AdamW (p *= 1 - lr * wd); false: Adam with L2 (g += wd * p).
  bool decoupled = true;
  bool bias_correction = true;
  /// Storage of m and v: DType::f32 or DType::bf16 (math is fp32 either way).
  DType moment_dtype = DType::f32;
  /// Ascend the objective instead (the gradient's sign is flipped first).
  bool maximize = false;
};

struct StepResult {
  bool skipped = false;          // true exactly when found_nonfinite
  bool found_nonfinite = false;  // inf/NaN in the gradient of some rank of the world
  double grad_norm = 0;          // global L2 norm of the unscaled gradient, before clipping
                                 // (NaN when found_nonfinite: there is no meaningful norm)
  double clip_coef = 1;          // factor applied to the unscaled gradient (1: no clipping)
  std::int64_t step = 0;         // step count after this call
};

/// Global gradient statistics, identical on every rank (grad_stats()).
struct GradStats {
  double sum_squares = 0;        // of the unscaled gradient, over the shard communicator
  bool found_nonfinite = false;  // on any rank of the world
  double norm() const;
};

/// One group's optimizer state: handles to the optimizer's own storage
/// (write into them to restore a checkpoint). Only the pair matching
/// moment_dtype is allocated.
struct AdamGroupState {
  DType moment_dtype = DType::f32;
  Kokkos::View<float*> exp_avg, exp_avg_sq;
  Kokkos::View<bfloat16_t*> exp_avg_bf16, exp_avg_sq_bf16;
};

class FusedAdam {
 public:
  /// Collective over `world`; `shard_comm` is the shard dimension of the mesh
  /// this rank is in (equal to `world` for plain FSDP).
  FusedAdam(AdamOptions options, Communicator shard_comm, Communicator world);
  // Move-only: a copy would share (and silently co-update) the moments.
  FusedAdam(const FusedAdam&) = delete;
  FusedAdam& operator=(const FusedAdam&) = delete;
  FusedAdam(FusedAdam&&) = default;
  FusedAdam& operator=(FusedAdam&&) = default;

  /// Registers one FSDP unit: its f32 master shard, f32 gradient shard and,
  /// when the group keeps one, its 16-bit copy
  /// (ShardedGroup::low_precision_shard()), as plain Views: the optimizer
  /// keeps no pointer to the group. The gradient shard is read as it is in
  /// memory: a lazy zero_grad() is written by ShardedGroup::settle_grad() /
  /// FsdpModel::prepare_optimizer_step() before step(). Collective over
  /// world. Returns the group index.
  int add_group(const ShardedGroup& group);
  /// Registers one flat shard given by its buffers (sizes may be 0), for
  /// shards that do not live in a ShardedGroup (tests, benchmarks).
  /// Collective over world. Returns the group index.
  int add_group(Kokkos::View<float*> master, Kokkos::View<float*> grad,
                LowPrecisionShard model = {});

  /// grad_stats() then apply(): the whole step. `loss_scale` > 0: gradients
  /// hold loss_scale x the true gradient; max_grad_norm 0: no clipping.
  StepResult step(float loss_scale = 1.f, double max_grad_norm = 0.0);

  /// Steps 1-2 above: reduction kernels and the two all_reduces. Collective.
  GradStats grad_stats(float loss_scale = 1.f);
  /// Step 2 alone, for statistics the caller computed locally while writing
  /// this rank's gradient shards (e.g. ShardedGroup's reduce-scatter
  /// accumulation): the sum of squares of the (scaled) gradient over all of
  /// this rank's groups and whether any element was inf/NaN. Collective; the
  /// result is what grad_stats() would return, without reading the gradient.
  GradStats combine_stats(double local_sum_squares, bool local_nonfinite, float loss_scale = 1.f);
  /// Step 3 above with statistics from grad_stats() (or computed by the
  /// caller, e.g. fused into the reduce-scatter; they must be global and
  /// agreed by every rank). Local: no communication.
  StepResult apply(const GradStats& stats, float loss_scale = 1.f, double max_grad_norm = 0.0);

  int num_groups() const noexcept { return int(groups_.size()); }
  std::size_t group_size(int g) const;
  /// Steps taken (skipped steps do not count). Part of the optimizer state.
  std::int64_t step_count() const noexcept { return step_; }
  /// Restores the counter from a checkpoint.
  void set_step_count(std::int64_t step);
  float lr() const noexcept { return options_.lr; }
  /// Takes effect at the next step; every rank must set the same value.
  void set_lr(float lr);
  const AdamOptions& options() const noexcept { return options_; }
  const AdamGroupState& state(int g) const;
  const Communicator& shard_comm() const noexcept { return shard_comm_; }
  const Communicator& world() const noexcept { return world_; }

 private:
  struct Group {
    Kokkos::View<float*> master, grad;
    LowPrecisionShard model;
    AdamGroupState state;
  };
  const Group& group(int g, const char* who) const;
  GradStats collect_stats(float loss_scale, double max_grad_norm);
  GradStats agree_stats(double sum, double nonfinite, float loss_scale, double max_grad_norm);

  AdamOptions options_;
  Communicator shard_comm_, world_;
  std::vector<Group> groups_;
  std::int64_t step_ = 0;
  Kokkos::View<double*> partials_;  // device scratch of the gradient statistics
};

}  // namespace kshard
