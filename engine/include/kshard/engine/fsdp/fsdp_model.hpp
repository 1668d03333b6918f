#pragma once
// FsdpModel: a sequence of layers, each wrapped as one FSDP unit
// (ShardedGroup "layers.<i>"), and the schedule that drives them. The layers
// run in the recipe's compute dtype (f32 for fp32, bf16 for bf16 and fp8,
// f16 for fp16), FSDP2's param_dtype.
//
//   std::vector<kshard::LayerDef> defs{kshard::layer<kshard::Embedding>(vocab, d),
//                                      kshard::layer<kshard::TransformerLayer>(d, heads, 4 * d),
//                                      kshard::layer<kshard::Linear>(d, vocab)};
//   kshard::FsdpModel model(mesh, defs, kshard::Recipe::parse("bf16"));
//   model.init_parameters(seed);
//   double loss = model.forward_backward_ce(token_ids, {batch, seq, 1}, targets);
//   PreparedStep local = model.prepare_optimizer_step();   // local.grads: statistics
//   // then the optimizer steps every group's shard (kshard::optim), and
//   model.finish_optimizer_step();
//
// A training loop that wants one wait per step queues its micro-batches
// (queue_forward_backward_ce: the loss stays on the device) and gets every
// loss with the gradient statistics from prepare_optimizer_step's one copy.
//
// Forward: unit i is unsharded (ONE all-gather) before its forward; unit i+1's
// all-gather is started before unit i computes (prefetch); with
// reshard_after_forward every unit but the last frees its full parameters
// after its forward (ZeRO-3), otherwise they stay until backward (ZeRO-2
// style, no second all-gather). Backward runs in reverse, re-unsharding where
// resharded (prefetching the next unit), accumulating into the unit's f32
// unsharded gradient and, when `sync`, starting its reduce-scatter at once so
// that it overlaps the next unit's backward; the previous unit's reduction is
// completed then, which bounds memory to two units' gradients. With
// sync=false (no_sync) gradients stay unsharded and accumulate across
// micro-batches until a backward with sync=true reduces them once.
//
// Memory: activations are kept by the layers and reused from step to step;
// unsharded parameters, unsharded gradients, reduce-scatter buffers and
// backward workspaces come from the buffer pool; forward_backward_ce runs the
// head and the loss in row chunks of pooled logits (FsdpOptions::
// loss_chunk_bytes), else the cross-entropy gradient overwrites the logits.
// So after the first step nothing is allocated.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kshard/engine/nn/layer.hpp"
#include "kshard/engine/nn/layer_def.hpp"
#include "kshard/engine/fsdp/kv_cache.hpp"
#include "kshard/engine/fsdp/memory_footprint.hpp"
#include "kshard/engine/fsdp/recipe.hpp"
#include "kshard/engine/fsdp/sharded_group.hpp"

namespace kshard {

struct FsdpOptions {
  bool reshard_after_forward = true;
  bool prefetch = true;
  /// bf16/fp16: keep a 16-bit copy of each shard (see ShardedGroup).
  bool keep_low_precision_shard = false;
  /// forward_backward_ce with a last layer whose rows are independent (the
  /// LM head): the head, the loss and the head's backward run in row chunks
  /// whose logits take at most this many bytes (chunked_cross_entropy.hpp),
  /// so the [rows, vocab] logits are never kept. 0: one forward writes all
  /// the logits and the loss gradient overwrites them, as for any last layer.
  /// 256 MiB: at the large benchmark model (4096 x 32000 logits) two chunks
  /// in f32 and one in bf16, where the step's peak is elsewhere (the layers'
  /// backward) and fewer, larger head GEMMs are faster (measured on the H200:
  /// f32 +0.5 % over 128 MiB's four chunks, same peak).
  std::size_t loss_chunk_bytes = std::size_t(256) << 20;
  /// Language models: the last layer's "weight" IS the first layer's (an
  /// Embedding's [vocab, d] table): one parameter, sharded once, in unit 0
  /// (Hugging Face's tie_word_embeddings; GPT-2, Gemma, small Llamas). The
  /// head reads unit 0's unsharded table, so unit 0 stays unsharded from its
  /// forward to the end of its backward (as FSDP2's root module keeps the
  /// tied weight), and the head's backward adds into unit 0's gradient before
  /// the embedding's does: the gradient is the sum of both uses. The last
  /// unit keeps its other parameters (a bias); the first layer must take
  /// token ids and the two shapes agree, else kshard::Error.
  bool tie_word_embeddings = false;
};

namespace detail {
class FsdpCoreBase;  // the schedule in one compute type (fsdp_model.cpp)
/// What the model knows of a layer whatever its compute type.
struct LayerKindInfo {
  std::string kind;
  std::int64_t in_features = 0, out_features = 0;
  std::vector<ParamSpec> specs;
  bool takes_token_ids = false;
  bool decodes = false;  // Layer::decodes()
};
}  // namespace detail

/// What prepare_optimizer_step() brings to the host, in one copy.
struct PreparedStep {
  GradShardStats grads;  ///< this rank's gradient statistics over all units
  /// The loss of each queue_forward_backward_ce() since the last
  /// prepare_optimizer_step(), in call order (this rank's unscaled losses).
  std::vector<double> losses;
};

class FsdpModel {
 public:
  /// Layers built in the recipe's compute dtype.
  FsdpModel(const DeviceMesh& mesh, const std::vector<LayerDef>& layers, Recipe recipe,
            FsdpOptions options = {});
  /// Ready-made f32 layers: only for recipes that compute in f32 (fp32).
  FsdpModel(const DeviceMesh& mesh, std::vector<std::unique_ptr<Layer<float>>> layers,
            Recipe recipe, FsdpOptions options = {});
  ~FsdpModel();
  FsdpModel(FsdpModel&&) noexcept;
  FsdpModel& operator=(FsdpModel&&) noexcept;

  std::size_t num_units() const noexcept { return groups_.size(); }
  ShardedGroup& group(std::size_t i) { return groups_.at(i); }
  const ShardedGroup& group(std::size_t i) const { return groups_.at(i); }
  /// "TransformerLayer", ... of unit i.
  std::string layer_kind(std::size_t i) const;
  const Recipe& recipe() const noexcept { return recipe_; }
  const FsdpOptions& options() const noexcept { return options_; }
  const DeviceMesh& mesh() const noexcept { return mesh_; }

  void init_parameters(std::uint64_t seed);

  /// Runs every unit's forward on f32 features (rounded to the compute dtype;
  /// a model that starts with an Embedding takes int32 ids, below: kshard::Error).
  /// Returns the output as f32 (a copy for 16-bit compute), valid until the
  /// next forward. x must stay unchanged until backward.
  Kokkos::View<const float*> forward(Kokkos::View<const float*> x, ActShape shape);
  /// The same on int32 token ids (a first layer that takes_token_ids()).
  Kokkos::View<const float*> forward(Kokkos::View<const std::int32_t*> ids, ActShape shape);
  /// Receives one chunk of forward_chunks' output: rows [first_row, first_row
  /// + rows) of it, [rows, out_features] f32, valid during the call.
  using ChunkVisitor =
      std::function<void(std::int64_t first_row, std::int64_t rows, Kokkos::View<const float*>)>;
  /// forward(ids) for evaluation, without keeping the whole output: a last
  /// layer with independent rows (the LM head) runs in row chunks of at most
  /// FsdpOptions::loss_chunk_bytes of output, each handed to `visit` (as f32)
  /// before the next is computed; any other last layer, or loss_chunk_bytes =
  /// 0: one call with the whole output. Units stay unsharded as after forward().
  void forward_chunks(Kokkos::View<const std::int32_t*> ids, ActShape shape,
                      const ChunkVisitor& visit);
  /// Whether decode() can run this model: a first layer that takes token ids
  /// (Embedding) and only layers that decode incrementally after it
  /// (attention blocks, or layers whose rows are independent: Layer::decodes()).
  bool can_decode() const;
  /// Incremental decoding with a key/value cache (kv_cache.hpp), for
  /// generation: runs shape.seq NEW tokens per sequence (ids [batch * seq],
  /// sequence-major; shape.batch = cache.batch(), features 1) at positions
  /// cache.length() .. through every unit, each attention layer appending
  /// their keys and values to the cache and attending over all cached ones,
  /// and returns the logits of each sequence's LAST new token, [batch,
  /// out_features] f32, valid until the next decode or forward. A prefill is
  /// a decode of the whole prompt into an empty cache, a step one of one
  /// token. The last row of each sequence equals the forward's over all the
  /// cached tokens (up to summation order); a rows-independent head runs on
  /// those rows alone. Units are unsharded and resharded as forward() does
  /// them (the same all-gathers, prefetch and reshard_after_forward), nothing
  /// is kept for backward and any saved forward is dropped. kshard::Error
  /// (before any collective) when !can_decode(), the batch differs from the
  /// cache's or the tokens do not fit its capacity.
  Kokkos::View<const float*> decode(KvCache& cache, Kokkos::View<const std::int32_t*> ids,
                                    ActShape shape);
  /// Backward from dL/d(output) of the last forward (rounded to the compute dtype).
  void backward(Kokkos::View<const float*> dy, bool sync = true);

  /// forward + mean-squared-error loss + backward. grad_scale multiplies the
  /// loss gradient (1/micro-batches, times the fp16 loss scale). Returns the
  /// local (this rank's batch) unscaled loss.
  double forward_backward_mse(Kokkos::View<const float*> x, ActShape shape,
                              Kokkos::View<const float*> target, double grad_scale = 1.0,
                              bool sync = true);
  /// forward + softmax cross-entropy over the last layer's outputs (logits
  /// [rows, vocab]) against integer targets (negative: ignored row) +
  /// backward. A last layer with independent rows (a Linear head) runs with
  /// its loss in row chunks (FsdpOptions::loss_chunk_bytes) and its logits
  /// are not kept: forward()'s output is not available afterwards.
  double forward_backward_ce(Kokkos::View<const float*> x, ActShape shape,
                             Kokkos::View<const std::int32_t*> targets, double grad_scale = 1.0,
                             bool sync = true);
  double forward_backward_ce(Kokkos::View<const std::int32_t*> ids, ActShape shape,
                             Kokkos::View<const std::int32_t*> targets, double grad_scale = 1.0,
                             bool sync = true);

  /// forward_backward_ce(ids, ...) without waiting for the device: the loss
  /// stays there, with the counts of bad targets and of bad token ids (the
  /// embedding counts them instead of checking them at once:
  /// Layer::defer_token_check), until prepare_optimizer_step() brings them to
  /// the host together with the gradient statistics. The GPU then never idles
  /// while the host waits for a number in the middle of a step (a training
  /// step waits once, not at each forward for its ids, at each backward for
  /// its loss and again for the statistics). Bad ids and targets are reported
  /// there; the gradients of such a step are not to be used.
  void queue_forward_backward_ce(Kokkos::View<const std::int32_t*> ids, ActShape shape,
                                 Kokkos::View<const std::int32_t*> targets,
                                 double grad_scale = 1.0, bool sync = true);

  void zero_grad();
  /// Before an optimizer step: writes every unit's pending lazy zero_grad
  /// (ShardedGroup::settle_grad: a unit no reduction reached since) and
  /// returns this rank's gradient statistics over all units (see
  /// ShardedGroup::grad_stats; feed them to FusedAdam::combine_stats() and
  /// apply() to step without re-reading the gradients) and the queued losses,
  /// in one device-to-host copy. A queued micro-batch with targets >= vocab
  /// or token ids outside [0, vocab) is a kshard::Error here (local: the
  /// caller agrees on it across ranks);
  /// the queue is empty afterwards either way.
  PreparedStep prepare_optimizer_step();
  /// After it: re-derives the low-precision shards the optimizer did not
  /// write (fp8_init); under delayed fp8 scaling, max-reduces this step's
  /// amaxes over all ranks and moves every scale to its history (collective:
  /// every rank calls it once per optimizer step, skipped steps included).
  void finish_optimizer_step();
  /// Delayed fp8 scaling's state (scales, amax histories, history position;
  /// Fp8AmaxHistory::state), the same on every rank; empty for other recipes.
  /// Checkpoints keep it, so a resumed run scales as the uninterrupted one.
  std::vector<float> fp8_state() const;
  /// Restores fp8_state(); kshard::Error if it does not fit this model.
  void set_fp8_state(const std::vector<float>& state);

  /// Parameters of the whole model.
  std::int64_t num_parameters() const { return memory_footprint().parameters; }
  /// Parameters, persistent shard bytes on this rank, the largest unsharded unit.
  MemoryFootprint memory_footprint() const { return MemoryFootprint::of(groups_); }

 private:
  void build_groups();

  DeviceMesh mesh_;
  Recipe recipe_;
  FsdpOptions options_;
  std::vector<ShardedGroup> groups_;
  std::unique_ptr<detail::FsdpCoreBase> core_;
  // Device scratch of prepare_optimizer_step(): the statistics' totals (2
  // doubles), the queued calls' bad token ids (1), then 3 per queued loss
  // ({mean, counted rows, bad targets}).
  Kokkos::View<double*> stats_total_;
  std::vector<std::int64_t> queued_rows_;  // rows of each queued call, in order
  Kokkos::View<std::uintptr_t*> stats_sources_;  // each group's grad_stats_device() address
  Kokkos::View<double*, Kokkos::HostSpace> stats_host_;  // where the one copy lands
  std::unique_ptr<Fp8AmaxHistory> fp8_history_;  // delayed fp8 scaling only
};

}  // namespace kshard
