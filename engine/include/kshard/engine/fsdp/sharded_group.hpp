#pragma once
// ShardedGroup: one FSDP unit — the parameters of one module, flattened into
// one padded buffer split evenly over the mesh's shard dimension.
//
//   kshard::ShardedGroup g("layers.0", layer.param_specs(), mesh, recipe);
//   g.init_parameters(seed);           // each rank fills only its shard
//   g.unshard();                       // ONE all-gather into a contiguous buffer
//   layer.forward(x, s, g.params<T>(), y);   // T: the recipe's compute dtype
//   g.reshard();                       // free it
//   ...
//   g.unshard();
//   layer.backward(dy, g.params(), g.unsharded_grads(), dx);
//   g.reduce_grads();                  // ONE reduce-scatter (avg) into g.grad()
//   g.reshard();
//
// Per rank, between steps, a group holds: the f32 master shard (the sharded
// parameter, updated by the optimizer), the f32 gradient shard, and, per
// recipe, the low-precision shard the all-gather sends (bf16/f16 copy written
// by the optimizer's kernel, or fp8 + block scales with fp8_init). While
// unsharded it also holds the compute buffer in the recipe's compute dtype:
// for fp32/bf16/fp16 the all-gather writes it directly (the parameters are
// Views into it, no upcast copy); fp8 gathers its packed bytes and
// dequantizes them into a bf16 compute buffer. During backward it holds the
// f32 unsharded gradient buffer (layers write f32 gradients). All of these
// unsharded buffers come from the buffer pool (kshard/core/buffer_pool.hpp),
// so a steady-state step allocates no device memory. HSDP (2-D mesh):
// gradients are reduce-scattered over the shard dimension, then all-reduced
// (avg) over the replicate one.
//
// What differs by recipe (what travels, in which dtype, through which
// buffers) is the recipe's wire format (engine/src/fsdp/wire_format.hpp,
// private), picked once at construction; this class keeps what every recipe
// shares: the order of starts, waits and finishes, the lazy zero_grad, the
// compute buffer and the unsharded gradient.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <Kokkos_Core.hpp>

#include "kshard/kernels/cast.hpp"
#include "kshard/engine/fsdp/low_precision_shard.hpp"
#include "kshard/engine/fsdp/param_index.hpp"
#include "kshard/engine/fsdp/recipe.hpp"
#include "kshard/core/buffer_pool.hpp"
#include "kshard/mesh/device_mesh.hpp"

namespace kshard {

namespace detail {
struct ShardContext;
class GatherWire;
class ReduceWire;
}  // namespace detail

/// Where a group's parameters are (FSDP2's ShardedState): sharded (only the
/// shards exist), gathering (the all-gather is in flight), unsharded (the
/// full parameters are in the compute buffer).
enum class ParamState { sharded, gathering, unsharded };
/// Where its gradients are (the gradient half of FSDP2's TrainingState):
/// none held unsharded, accumulating (backward writes the unsharded
/// gradient; no_sync micro-batches add to it), reducing (the reduce-scatter
/// is in flight).
enum class GradState { none, accumulating, reducing };
/// The gradient shard between steps: current, or zero pending (zero_grad()
/// is lazy: the next reduction writes the shard instead of adding to it).
enum class ShardGrad { current, zero_pending };

const char* state_name(ParamState s) noexcept;
const char* state_name(GradState s) noexcept;

class ShardedGroup {
 public:
  /// keep_low_precision_shard (bf16/fp16 recipes): keep a 16-bit copy of the
  /// shard between steps, written by the optimizer's update kernel, and
  /// all-gather it as is (2 B/param more memory, one cast pass per unshard
  /// less); false (the default, as FSDP2): cast the master into a pool block
  /// at each unshard.
  ShardedGroup(std::string name, const std::vector<ParamSpec>& specs, const DeviceMesh& mesh,
               Recipe recipe, bool keep_low_precision_shard = false);
  ShardedGroup(const ShardedGroup&) = delete;
  ShardedGroup& operator=(const ShardedGroup&) = delete;
  ShardedGroup(ShardedGroup&&);  // defined where the wire formats are complete
  ~ShardedGroup();

  const std::string& name() const noexcept { return name_; }
  const ParamIndex& index() const noexcept { return index_; }
  const Recipe& recipe() const noexcept { return recipe_; }
  int shard_rank() const noexcept { return shard_rank_; }

  /// Deterministic init of every parameter (key: "<group>.<param>"): each
  /// rank fills its own slice, identical to an unsharded fill.
  void init_parameters(std::uint64_t seed);
  /// Sets the master shard from a full flat parameter vector (tests, loading).
  void set_full_parameters(Kokkos::View<const float*> flat);

  Kokkos::View<float*> master() const noexcept { return master_; }
  /// The f32 gradient shard as it is in memory: while shard_grad() is
  /// zero_pending it still holds the values before zero_grad() (settle_grad()
  /// writes the zeros).
  Kokkos::View<float*> grad() const noexcept { return grad_; }
  /// Writes a pending zero_grad() into the shard (nothing if none is
  /// pending): what a reader of grad() calls first, e.g. before an optimizer
  /// step (FsdpModel::prepare_optimizer_step does it for every unit).
  void settle_grad();
  ShardGrad shard_grad() const noexcept { return shard_grad_; }
  /// The low-precision shard the optimizer's kernel keeps equal to
  /// cast(master) (bf16/f16 recipes with keep_low_precision_shard); none
  /// (present() false) otherwise. FusedAdam::add_group(ShardedGroup&) reads it.
  LowPrecisionShard low_precision_shard() const noexcept;
  /// Re-derives the low-precision shard from the master (after init, after an
  /// optimizer step that did not write it, and for fp8_init: re-quantize).
  void refresh_low_precision();

  // ---- unshard / reshard ----
  // sharded --start_unshard--> gathering --finish_unshard--> unsharded
  // --reshard--> sharded. Each call is a no-op from the state it leads to;
  // finish_unshard from sharded starts first; reshard while gathering
  // completes the collective first (a collective in flight must complete).
  void start_unshard();
  void finish_unshard();
  void unshard() {
    start_unshard();
    finish_unshard();
  }
  ParamState param_state() const noexcept { return param_state_; }
  /// Full parameters (Views of the compute buffer) in the compute dtype T
  /// (recipe().compute_dtype; else kshard::Error), valid while unsharded.
  template <class T>
  std::vector<Kokkos::View<const T*>> params() const;
  /// The whole compute buffer (padded) in the compute dtype, while unsharded.
  template <class T>
  Kokkos::View<const T*> flat_params() const;
  void reshard();

  // ---- gradients ----
  // none --unsharded_grads--> accumulating --start_reduce_grads--> reducing
  // --finish_reduce_grads--> none. unsharded_grads while reducing is a
  // kshard::Error (the buffer is in flight); start/finish from an earlier
  // state run the steps before them (a rank with nothing to add still takes
  // part in the collective, with zeros).
  /// Full-size f32 gradient Views (acquired and zeroed on first use; kept
  /// across backward passes until reduced, so no_sync micro-batches accumulate).
  /// With one rank per shard, one replica and an f32 reduction they are Views
  /// of the gradient shard itself (nothing to reduce: no second buffer); a
  /// zero_grad() before the reduction then also drops what they accumulated.
  /// With GradWrite::assign the caller promises to WRITE every parameter
  /// element before anything reads them (a backward whose layer
  /// assigns_grads()): the zero fill is skipped (padding and alignment gaps
  /// are still zeroed), which saves a pass over the gradients per step. Only
  /// while grads_unwritten(), else kshard::Error.
  const std::vector<Kokkos::View<float*>>& unsharded_grads(GradWrite write = GradWrite::add);
  /// Whether the Views the next unsharded_grads() hands out hold nothing yet
  /// (no backward since the last reduction, or a zero_grad() pending on a
  /// shard that is its own gradient): then a writing backward may skip the fill.
  bool grads_unwritten() const;
  GradState grad_state() const noexcept { return grad_state_; }
  void start_reduce_grads();
  void finish_reduce_grads();
  void reduce_grads() {
    start_reduce_grads();
    finish_reduce_grads();
  }
  /// Zeroes the gradient shard lazily (shard_grad() becomes zero_pending):
  /// the next reduction WRITES the shard instead of adding to it (f32 reduce
  /// dtype: the reduce-scatter lands in the shard itself), which saves a fill
  /// and a read of every element per step; settle_grad() writes the zeros
  /// where no reduction came. Gradients accumulating unsharded are dropped
  /// too (FSDP2's zero_grad); while reducing it is a kshard::Error.
  void zero_grad();
  /// Sum of squares and inf/NaN count of the gradient shard as the group last
  /// wrote it (computed in the same kernel that accumulates each reduction;
  /// zero after zero_grad()), so the optimizer need not read it again.
  /// grad_stats() copies them to the host (waits for the reduction);
  /// grad_stats_device() is the 2-element device View they live in.
  GradShardStats grad_stats() const;
  Kokkos::View<const double*> grad_stats_device() const noexcept { return grad_stats_; }

  /// The f32 master parameters of the whole group (all-gathered; padding
  /// dropped), on the host. Collective over the shard communicator.
  std::vector<float> gather_master() const;

  /// Bytes held between steps (master, grad, low-precision shard) on this rank.
  std::size_t persistent_bytes() const noexcept;
  /// Bytes one unshard of this group takes from the pool (gather + compute
  /// buffers; no compute buffer where the kept shard already is the full
  /// parameters, one rank per shard), without the unsharded gradient (4 B
  /// per padded element).
  std::size_t unsharded_bytes() const noexcept;

 private:
  /// The state the wire formats work on (built per call: the group is movable).
  detail::ShardContext context() const;
  void check_compute_type(DType t, const char* what) const;
  /// Zeroes the elements of a full flat gradient outside every parameter.
  void zero_grad_gaps(Kokkos::View<float*> full);
  [[noreturn]] void bad_transition(const char* what, const char* state,
                                   const char* expected) const;

  std::string name_;
  Recipe recipe_;
  ParamIndex index_;
  Communicator shard_comm_, replicate_comm_;
  int shard_rank_ = 0;

  Kokkos::View<float*> master_, grad_;

  // The recipe's wire format: parameters out (owns the low-precision shard
  // kept between steps and the gather's send/receive blocks) and gradients
  // back (owns the reduce-scatter's blocks).
  std::unique_ptr<detail::GatherWire> gather_wire_;
  std::unique_ptr<detail::ReduceWire> reduce_wire_;

  // Unsharded state (pool blocks).
  ParamState param_state_ = ParamState::sharded;
  memory::Block compute_;   // the full parameters in the compute dtype
  Request gather_req_;      // while gathering

  // Gradient reduction.
  GradState grad_state_ = GradState::none;
  ShardGrad shard_grad_ = ShardGrad::current;
  memory::Block grad_full_;  // f32 unsharded gradient (unless grads_in_shard_)
  std::vector<Kokkos::View<float*>> grad_views_;
  bool grads_in_shard_ = false;  // grad_views_ are Views of grad_ (accumulates_in_shard)
  // Flat offsets outside every parameter (alignment gaps, padding): zeroed in
  // an unsharded gradient the layers assign (they write the parameters only).
  Kokkos::View<std::int64_t*> grad_gaps_;
  bool grad_gaps_built_ = false;
  Request reduce_req_;
  GradWrite reduce_write_ = GradWrite::add;  // how the reduction in flight lands in grad_
  Kokkos::View<double*> grad_stats_;  // {sum of squares, inf/NaN count} on the device
};

}  // namespace kshard
