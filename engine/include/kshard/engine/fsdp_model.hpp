#pragma once
// FsdpModel: a sequence of layers, each wrapped as one FSDP unit
// (ShardedGroup "layers.<i>"), and the schedule that drives them.
//
//   std::vector<std::unique_ptr<kshard::Layer<float>>> layers;
//   layers.push_back(std::make_unique<kshard::Embedding<float>>(vocab, d));
//   layers.push_back(std::make_unique<kshard::TransformerLayer<float>>(d, heads, 4 * d));
//   layers.push_back(std::make_unique<kshard::Linear<float>>(d, vocab));
//   kshard::FsdpModel model(mesh, std::move(layers), kshard::Recipe::parse("bf16"));
//   model.init_parameters(seed);
//   double loss = model.forward_backward_ce(tokens, {batch, seq, 1}, targets);
//   // then the optimizer steps every group's shard (kshard::optim), and
//   model.after_optimizer_step();
//
// Forward: unit i is unsharded (ONE all-gather) before its forward; unit i+1's
// all-gather is started before unit i computes (prefetch); with
// reshard_after_forward every unit but the last frees its full parameters
// after its forward (ZeRO-3), otherwise they stay until backward (ZeRO-2
// style, no second all-gather). Backward runs in reverse, re-unsharding where
// resharded (prefetching the next unit), accumulating into the unit's
// unsharded gradient and, when `sync`, starting its reduce-scatter at once so
// that it overlaps the next unit's backward; the previous unit's reduction is
// completed then, which bounds memory to two units' gradients. With
// sync=false (no_sync) gradients stay unsharded and accumulate across
// micro-batches until a backward with sync=true reduces them once.
#include <cstdint>
#include <memory>
#include <vector>

#include "kshard/engine/layer.hpp"
#include "kshard/engine/recipe.hpp"
#include "kshard/engine/sharded_group.hpp"

namespace kshard {

struct FsdpOptions {
  bool reshard_after_forward = true;
  bool prefetch = true;
};

class FsdpModel {
 public:
  FsdpModel(const DeviceMesh& mesh, std::vector<std::unique_ptr<Layer<float>>> layers,
            Recipe recipe, FsdpOptions options = {});

  std::size_t num_units() const noexcept { return layers_.size(); }
  Layer<float>& layer(std::size_t i) { return *layers_.at(i); }
  ShardedGroup& group(std::size_t i) { return groups_.at(i); }
  const Recipe& recipe() const noexcept { return recipe_; }
  const FsdpOptions& options() const noexcept { return options_; }
  const DeviceMesh& mesh() const noexcept { return mesh_; }

  void init_parameters(std::uint64_t seed);

  /// Runs every unit's forward; the returned output stays valid until the
  /// next forward. x must stay unchanged until backward.
  Kokkos::View<const float*> forward(Kokkos::View<const float*> x, ActShape shape);
  /// Backward from dL/d(output) of the last forward.
  void backward(Kokkos::View<const float*> dy, bool sync = true);

  /// forward + mean-squared-error loss + backward. grad_scale multiplies the
  /// loss gradient (1/micro-batches, times the fp16 loss scale). Returns the
  /// local (this rank's batch) unscaled loss.
  double forward_backward_mse(Kokkos::View<const float*> x, ActShape shape,
                              Kokkos::View<const float*> target, double grad_scale = 1.0,
                              bool sync = true);
  /// forward + softmax cross-entropy over the last layer's outputs (logits
  /// [rows, vocab]) against integer targets + backward.
  double forward_backward_ce(Kokkos::View<const float*> x, ActShape shape,
                             Kokkos::View<const std::int32_t*> targets, double grad_scale = 1.0,
                             bool sync = true);

  void zero_grad();
  /// This rank's gradient statistics over all units (see
  /// ShardedGroup::grad_stats): feed them to FusedAdam::combine_stats() and
  /// apply() to step without re-reading the gradients.
  GradShardStats local_grad_stats() const;
  /// Re-derive the low-precision shards the optimizer did not write (fp8_init).
  void after_optimizer_step();

  /// Parameters of the whole model.
  std::int64_t num_parameters() const;
  /// Bytes of master + grad (+ low-precision) shards on this rank.
  std::size_t persistent_bytes() const;
  /// Bytes of the largest unit when unsharded.
  std::size_t max_unit_bytes() const;
  /// Every unit's f32 master parameters, all-gathered (for tests and export).
  std::vector<std::vector<float>> gather_master_parameters() const;

 private:
  void ensure_unsharded(std::size_t i);

  DeviceMesh mesh_;
  Recipe recipe_;
  FsdpOptions options_;
  std::vector<std::unique_ptr<Layer<float>>> layers_;
  std::vector<ShardedGroup> groups_;
  std::vector<ActShape> shapes_;                // input shape of each unit, and the output
  std::vector<Kokkos::View<float*>> acts_;      // acts_[i]: input of unit i (acts_[0] unused)
  Kokkos::View<const float*> input_;
  Kokkos::View<float*> dact_a_, dact_b_, dloss_;
};

}  // namespace kshard
