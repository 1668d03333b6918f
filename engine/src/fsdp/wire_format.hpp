#pragma once
// The wire formats of a ShardedGroup (private to the engine): how one FSDP
// unit's parameters travel from the f32 master shards to the compute buffer
// (GatherWire), and how its f32 unsharded gradient travels back to the f32
// gradient shards (ReduceWire).
//
// A recipe's wire format is one of each, because the Recipe sets the gather
// dtype and the reduce dtype independently (FSDP2's param_dtype and
// reduce_dtype); bf16 and fp16 share the 16-bit gather but reduce in f32 and
// f16 respectively:
//
//   recipe  gather                                       reduce
//   fp32    f32: the master as is                        f32
//   bf16    16-bit: master cast to bf16 (or kept copy)   f32
//   fp16    16-bit: master cast to f16 (or kept copy)    16-bit (f16)
//   fp8     fp8 block-scaled: e4m3 + one f32 scale per   f32
//           block, dequantized into a bf16 buffer
//
// ShardedGroup picks them once, at construction (make_wire_format), and keeps
// what every recipe shares: when a gather or reduction starts and finishes,
// the waits on the device, the lazy zero_grad, the compute buffer and the
// unsharded gradient. A format owns its wire buffers (pool blocks held for one
// gather or reduction) and the low-precision shard kept between steps.
#include <cstddef>
#include <memory>
#include <string>

#include <Kokkos_Core.hpp>

#include "kshard/engine/fsdp/low_precision_shard.hpp"
#include "kshard/engine/fsdp/param_index.hpp"
#include "kshard/engine/fsdp/recipe.hpp"
#include "kshard/kernels/cast.hpp"
#include "kshard/core/buffer_pool.hpp"
#include "kshard/mesh/communicator.hpp"

namespace kshard::detail {

/// What a wire format works on: the group's shard state, handed over on each
/// call (ShardedGroup is movable, so a format keeps no reference into it).
struct ShardContext {
  const std::string& name;
  const ParamIndex& index;
  const Recipe& recipe;
  const Communicator& shard_comm;
  const Communicator& replicate_comm;
  const Kokkos::View<float*>& master;      // f32 master shard
  const Kokkos::View<float*>& grad;        // f32 gradient shard
  const Kokkos::View<double*>& grad_stats; // {sum of squares, inf/NaN count}

  std::size_t shard() const { return std::size_t(index.shard_numel()); }
  std::size_t flat() const { return std::size_t(index.flat_numel()); }
};

/// Parameters out: master shards -> the full parameters in the compute dtype.
class GatherWire {
 public:
  virtual ~GatherWire() = default;
  /// Re-derives the low-precision shard kept between steps from the master
  /// (nothing when the format keeps none).
  virtual void refresh(const ShardContext& c) = 0;
  /// The kept 16-bit shard the optimizer writes; none otherwise.
  virtual LowPrecisionShard low_precision_shard() const { return {}; }
  /// Bytes of the low-precision shard kept between steps.
  virtual std::size_t persistent_bytes() const = 0;
  /// Starts the all-gather. A format that gathers straight into the compute
  /// buffer acquires `compute` here. Returns the gather's request (a
  /// completed one when nothing has to travel).
  virtual Request start(const ShardContext& c, memory::Block& compute) = 0;
  /// Called once the group made the device wait for that request: gives the
  /// send buffer back and fills `compute` if start() did not.
  virtual void finish(const ShardContext& c, memory::Block& compute) = 0;
  /// Bytes held while unsharded besides the compute buffer.
  virtual std::size_t gather_bytes(const ShardContext&) const { return 0; }
  /// Bytes the compute buffer takes from the pool while unsharded: the full
  /// parameters in the compute dtype, or none where a buffer kept anyway
  /// (the master, the kept 16-bit shard) already is them (one rank per shard).
  virtual std::size_t compute_bytes(const ShardContext& c) const {
    return dtype_size(c.recipe.compute_dtype) * c.flat();
  }
};

/// Gradients back: the f32 unsharded gradient -> the f32 gradient shard.
class ReduceWire {
 public:
  virtual ~ReduceWire() = default;
  /// One rank per shard and a reduction that needs no collective of the
  /// shard dimension: the gradient is accumulated from `full` directly.
  virtual bool reduces_locally(const ShardContext&) const { return false; }
  /// Whether the layers may accumulate straight into the gradient shard (the
  /// unsharded gradient IS the shard: one rank per shard, one replica, an f32
  /// reduction). The group then hands out Views of the shard and calls only
  /// finish() with an empty `full` and GradWrite::none (statistics only).
  virtual bool accumulates_in_shard(const ShardContext&) const { return false; }
  /// Starts the reduce-scatter (avg) of `full` (f32, the padded flat size).
  /// `write` is how the result lands in the gradient shard (add, or assign
  /// after zero_grad); a format that reduce-scatters into the shard itself
  /// sets it to GradWrite::none.
  virtual Request start(const ShardContext& c, const memory::Block& full, GradWrite& write) = 0;
  /// Whether finish() still reads `full` (false: the group gives it back as
  /// soon as start() returns).
  virtual bool reads_full_until_finish() const = 0;
  /// Called once the group made the device wait for that request: (HSDP)
  /// averages over the replicas, accumulates into the gradient shard with the
  /// optimizer's statistics, gives the wire buffers back.
  virtual void finish(const ShardContext& c, const memory::Block& full, GradWrite write) = 0;

 protected:
  /// HSDP: v = avg of v over the replicate dimension, ordered on the device
  /// (no host wait). Nothing with one replica.
  template <class T>
  void average_over_replicas(const ShardContext& c, Kokkos::View<T*> v) {
    if (c.replicate_comm.size() <= 1) return;
    replicate_req_ = c.replicate_comm.all_reduce_async(v, v, ReduceOp::avg);
    replicate_req_.wait_on_device();
  }

 private:
  Request replicate_req_;
};

/// A recipe's wire format: its gather and its reduction.
struct WireFormat {
  std::unique_ptr<GatherWire> gather;
  std::unique_ptr<ReduceWire> reduce;
};

/// The one place that maps a Recipe to its wire format; kshard::Error for a
/// gather dtype other than f32/bf16/f16/e4m3 or a reduce dtype other than
/// f32/bf16/f16. keep_low_precision_shard: see ShardedGroup's constructor.
WireFormat make_wire_format(const ShardContext& c, bool keep_low_precision_shard);

// The implementations, one per file (wire_gather_*.cpp, wire_reduce_*.cpp).
std::unique_ptr<GatherWire> make_f32_gather();
std::unique_ptr<GatherWire> make_16bit_gather(const ShardContext& c, bool keep_low_precision_shard);
std::unique_ptr<GatherWire> make_fp8_gather(const ShardContext& c);
std::unique_ptr<ReduceWire> make_f32_reduce();
std::unique_ptr<ReduceWire> make_16bit_reduce(DType reduce_dtype);

/// A typed window onto a byte buffer (wire buffers change dtype by recipe).
template <class T>
Kokkos::View<T*, Kokkos::MemoryTraits<Kokkos::Unmanaged>> typed(
    const Kokkos::View<std::uint8_t*>& bytes, std::size_t offset_bytes, std::size_t n) {
  return Kokkos::View<T*, Kokkos::MemoryTraits<Kokkos::Unmanaged>>(
      reinterpret_cast<T*>(bytes.data() + offset_bytes), n);
}

}  // namespace kshard::detail
