#include "kshard/train/memory_estimate.hpp"

#include <algorithm>
#include <cstdio>

#include "kshard/mesh/agree.hpp"
#include "kshard/core/device_memory.hpp"
#include "kshard/engine/fsdp/param_index.hpp"
#include "kshard/error.hpp"
#include "kshard/mesh/session.hpp"

namespace kshard {
namespace {

std::string gib(double b) {
  char buf[32];
  if (b < 1024.0 * 1024.0 * 1024.0)
    std::snprintf(buf, sizeof buf, "%.1f MiB", b / (1024.0 * 1024.0));
  else
    std::snprintf(buf, sizeof buf, "%.2f GiB", b / (1024.0 * 1024.0 * 1024.0));
  return buf;
}

}  // namespace

std::string MemoryEstimate::describe() const {
  return gib(total()) + " (persistent " + gib(persistent) + ", two unsharded units " +
         gib(unsharded) + ", activations " + gib(activations) + ")";
}

MemoryEstimate MemoryEstimate::of(const std::vector<LayerDef>& layers, const Recipe& recipe,
                                  int shard_size, std::int64_t batch, std::int64_t seq,
                                  const FsdpOptions& options) {
  if (shard_size < 1 || batch < 1 || seq < 1)
    throw Error("memory estimate for shard size " + std::to_string(shard_size) + ", batch " +
                    std::to_string(batch) + ", seq " + std::to_string(seq),
                "positive sizes");
  MemoryEstimate e;
  const double compute = double(dtype_size(recipe.compute_dtype));
  const double rows = double(batch) * double(seq);
  double lp_per_elem = 0;
  if (recipe.fp8_init) lp_per_elem = 1;
  else if (options.keep_low_precision_shard && (recipe.gather_dtype == DType::bf16 ||
                                        recipe.gather_dtype == DType::f16))
    lp_per_elem = 2;
  // One rank per shard: the compute buffer is the master (fp32) or the kept
  // 16-bit shard itself, nothing from the pool (the wire formats' compute_bytes).
  const bool compute_is_shard =
      shard_size == 1 && (recipe.gather_dtype == DType::f32 || lp_per_elem == 2);
  const double compute_unsharded = compute_is_shard ? 0.0 : compute;
  double max_unit = 0, widest = 0, saved = 0, last_out = 0, first_unit = 0;
  for (std::size_t i = 0; i < layers.size(); ++i) {
    // A Layer<float> object only describes itself: nothing is allocated
    // before its first forward.
    const auto layer = layers[i].make<float>();
    std::vector<ParamSpec> specs = layer->param_specs();
    if (options.tie_word_embeddings && i + 1 == layers.size() && i > 0)
      specs.erase(std::remove_if(specs.begin(), specs.end(),
                                 [](const ParamSpec& s) { return s.name == "weight"; }),
                  specs.end());
    for (const ParamSpec& s : specs) e.params += s.numel();
    if (!specs.empty()) {
      const ParamIndex index(specs, shard_size, ParamIndex::default_align, recipe.fp8_block);
      e.persistent += double(index.shard_numel()) * (16.0 + lp_per_elem);
      const double unit = double(index.flat_numel()) * (compute_unsharded + 4.0);
      max_unit = std::max(max_unit, unit);
      if (i == 0) first_unit = unit;
    }
    const double in = double(layer->in_features()), out = double(layer->out_features());
    widest = std::max({widest, in, out});
    saved += rows * layer->saved_elements_per_row() * compute;
    last_out = out;
  }
  e.unsharded = 2.0 * max_unit + (options.tie_word_embeddings ? first_unit : 0.0);
  // Logits in f32 (the model's output copy) and the two backward buffers.
  e.activations = saved + rows * last_out * 4.0 + 2.0 * rows * widest * compute;
  return e;
}

double available_memory_per_rank() {
  const double bytes = memory::available_device_bytes();
  if (bytes <= 0) return 0;
  int sharers = 1;
  if (Session::active()) {
#if defined(KOKKOS_ENABLE_CUDA)
    sharers = Session::current().device_sharers();
#else
    sharers = Session::current().local_size();
#endif
  }
  return bytes / double(std::max(1, sharers));
}

void check_memory_fits(const Communicator& comm, const MemoryEstimate& estimate) {
  const double avail = available_memory_per_rank();
  const double need = estimate.total();
  // Short by how much, on the worst rank (0: fits everywhere or unknown).
  const double shortfall = avail > 0 && need > avail ? need - avail : 0.0;
  std::vector<double> worst = {shortfall, avail > 0 ? -avail : -1e300};
  host_all_reduce(comm, worst, ReduceOp::max);
  if (worst[0] > 0)
    throw Error("the run needs about " + estimate.describe() + " per rank for " +
                    std::to_string(estimate.params) + " parameters, but a rank has only " +
                    gib(-worst[1]) + " available (" +
#if defined(KOKKOS_ENABLE_CUDA)
                    "free GPU memory shared by its ranks"
#else
                    "MemAvailable shared by the node's ranks"
#endif
                    + ")",
                "a run that fits: more ranks (a larger shard dimension), a smaller --batch or "
                "--seq, or a smaller model");
}

}  // namespace kshard
