#pragma once
// MemoryEstimate: what a training run will need per rank, worked out from
// the model description BEFORE anything is allocated, so that a run that
// cannot fit says so instead of being killed (host: by the OOM killer;
// CUDA: by an allocation failure deep inside a step).
//
//   kshard::MemoryEstimate e = kshard::MemoryEstimate::of(defs, recipe, mesh.shard_size(),
//                                                         batch, seq, fsdp_options);
//   kshard::check_memory_fits(mesh.world(), e);   // kshard::Error on every rank if not
//
// The estimate (bytes per rank):
//  - persistent: 16 B/param/N — f32 master, f32 gradient, Adam's two f32
//    moments of this rank's shard (N = shard dimension; padding included) —
//    plus 2 B/param/N for a kept 16-bit shard, or 1 for an fp8 one;
//  - unsharded: two units at once (the one computing and the one being
//    prefetched or reduced): the largest unit's parameters in the compute
//    dtype plus its f32 gradient, twice; with tie_word_embeddings also the
//    embedding unit, which stays unsharded through the step (its weight is
//    counted once, in the embedding);
//  - activations: one micro-batch's saved activations, from the layer kinds
//    (a TransformerLayer keeps ~18 values per token per feature of width,
//    other layers their input and output) plus the logits in f32 and two
//    backward buffers of the widest activation. An estimate, not a bound:
//    workspaces of the attention and the GEMMs come on top.
// Available memory: free device memory (CUDA: cudaMemGetInfo) or the host's
// MemAvailable (/proc/meminfo), divided among the ranks that share it.
#include <cstdint>
#include <string>
#include <vector>

#include "kshard/engine/nn/layer_def.hpp"
#include "kshard/engine/fsdp/fsdp_model.hpp"
#include "kshard/engine/fsdp/recipe.hpp"
#include "kshard/mesh/communicator.hpp"

namespace kshard {

struct MemoryEstimate {
  std::int64_t params = 0;
  double persistent = 0, unsharded = 0, activations = 0;
  double total() const noexcept { return persistent + unsharded + activations; }
  /// "1.2 GiB (persistent 0.5 GiB, two unsharded units 0.2 GiB, activations 0.5 GiB)".
  std::string describe() const;

  static MemoryEstimate of(const std::vector<LayerDef>& layers, const Recipe& recipe,
                           int shard_size, std::int64_t batch, std::int64_t seq,
                           const FsdpOptions& options = {});
};

/// Bytes this rank can expect to use: the device's free memory (CUDA) or the
/// host's available memory, divided by the number of ranks sharing it.
/// 0 when unknown (then nothing is checked).
double available_memory_per_rank();

/// Collective over comm: when the estimate exceeds the available memory on
/// some rank, a kshard::Error on every rank saying both numbers.
void check_memory_fits(const Communicator& comm, const MemoryEstimate& estimate);

}  // namespace kshard
