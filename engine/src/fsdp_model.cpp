#include "kshard/engine/fsdp_model.hpp"

#include "kshard/engine/loss.hpp"
#include "kshard/error.hpp"

namespace kshard {
namespace {

/// A View of exactly n elements carved from a buffer that only ever grows
/// (so per-step activations-gradient buffers are not reallocated).
Kokkos::View<float*> window(Kokkos::View<float*>& buf, std::int64_t n, const char* label) {
  if (std::int64_t(buf.extent(0)) < n)
    buf = Kokkos::View<float*>(Kokkos::view_alloc(std::string(label), Kokkos::WithoutInitializing),
                               std::size_t(n));
  return Kokkos::subview(buf, std::make_pair(std::int64_t(0), n));
}

}  // namespace

FsdpModel::FsdpModel(const DeviceMesh& mesh, std::vector<std::unique_ptr<Layer<float>>> layers,
                     Recipe recipe, FsdpOptions options)
    : mesh_(mesh), recipe_(std::move(recipe)), options_(options), layers_(std::move(layers)) {
  if (layers_.empty()) throw Error("FsdpModel with no layers", "at least one layer");
  for (std::size_t i = 0; i < layers_.size(); ++i) {
    if (!layers_[i]) throw Error("FsdpModel layer " + std::to_string(i) + " is null", "a layer");
    if (i > 0 && layers_[i]->in_features() != layers_[i - 1]->out_features())
      throw Error("layer " + std::to_string(i) + " (" + layers_[i]->kind() + ") takes " +
                      std::to_string(layers_[i]->in_features()) + " features but layer " +
                      std::to_string(i - 1) + " (" + layers_[i - 1]->kind() + ") gives " +
                      std::to_string(layers_[i - 1]->out_features()),
                  "consecutive layers with matching widths");
    groups_.emplace_back("layers." + std::to_string(i), layers_[i]->param_specs(), mesh_, recipe_);
  }
}

void FsdpModel::init_parameters(std::uint64_t seed) {
  for (auto& g : groups_) g.init_parameters(seed);
}

void FsdpModel::ensure_unsharded(std::size_t i) {
  if (!groups_[i].is_unsharded()) groups_[i].finish_unshard();
}

Kokkos::View<const float*> FsdpModel::forward(Kokkos::View<const float*> x, ActShape shape) {
  const std::size_t n = layers_.size();
  if (shape.features != layers_[0]->in_features())
    throw Error("model input has " + std::to_string(shape.features) + " features",
                std::to_string(layers_[0]->in_features()) + " (the first layer's input)");
  input_ = x;
  shapes_.assign(n + 1, shape);
  acts_.resize(n + 1);
  for (std::size_t i = 0; i < n; ++i) {
    shapes_[i + 1] = layers_[i]->output_shape(shapes_[i]);
    const std::size_t out = std::size_t(shapes_[i + 1].numel());
    if (acts_[i + 1].extent(0) != out)
      acts_[i + 1] = Kokkos::View<float*>(
          Kokkos::view_alloc("layers." + std::to_string(i) + ".out", Kokkos::WithoutInitializing),
          out);
  }
  for (std::size_t i = 0; i < n; ++i) {
    ensure_unsharded(i);
    if (options_.prefetch && i + 1 < n) groups_[i + 1].start_unshard();
    Kokkos::View<const float*> in = i == 0 ? x : Kokkos::View<const float*>(acts_[i]);
    layers_[i]->forward(in, shapes_[i], groups_[i].params(), acts_[i + 1]);
    // The last unit is needed first by backward: keep it (as FSDP2 does).
    if (options_.reshard_after_forward && i + 1 < n) groups_[i].reshard();
  }
  return acts_[n];
}

void FsdpModel::backward(Kokkos::View<const float*> dy, bool sync) {
  const std::size_t n = layers_.size();
  if (shapes_.size() != n + 1)
    throw Error("FsdpModel::backward before forward", "forward() first");
  if (std::int64_t(dy.extent(0)) != shapes_[n].numel())
    throw Error("backward with a gradient of " + std::to_string(dy.extent(0)) + " elements",
                std::to_string(shapes_[n].numel()) + " (the model output)");
  Kokkos::View<const float*> cur = dy;
  bool use_a = true;
  std::size_t reducing = n;  // unit whose reduce-scatter is in flight (n: none)
  for (std::size_t k = n; k-- > 0;) {
    ensure_unsharded(k);
    if (options_.prefetch && k > 0) groups_[k - 1].start_unshard();
    Kokkos::View<float*> dx =
        window(use_a ? dact_a_ : dact_b_, shapes_[k].numel(), "kshard.fsdp.dact");
    layers_[k]->backward(cur, groups_[k].params(), groups_[k].unsharded_grads(), dx);
    layers_[k]->release();
    if (sync) {
      groups_[k].start_reduce_grads();
      if (reducing < n) groups_[reducing].finish_reduce_grads();
      reducing = k;
    }
    groups_[k].reshard();
    cur = dx;
    use_a = !use_a;
  }
  if (reducing < n) groups_[reducing].finish_reduce_grads();
}

double FsdpModel::forward_backward_mse(Kokkos::View<const float*> x, ActShape shape,
                                       Kokkos::View<const float*> target, double grad_scale,
                                       bool sync) {
  auto out = forward(x, shape);
  auto d = window(dloss_, std::int64_t(out.extent(0)), "kshard.fsdp.dloss");
  const double loss = mse_loss<float>(out, target, d, grad_scale);
  backward(d, sync);
  return loss;
}

double FsdpModel::forward_backward_ce(Kokkos::View<const float*> x, ActShape shape,
                                      Kokkos::View<const std::int32_t*> targets,
                                      double grad_scale, bool sync) {
  auto out = forward(x, shape);
  const ActShape& os = shapes_.back();
  auto d = window(dloss_, std::int64_t(out.extent(0)), "kshard.fsdp.dloss");
  const double loss =
      cross_entropy_loss<float, std::int32_t>(out, os.rows(), os.features, targets, d, grad_scale);
  backward(d, sync);
  return loss;
}

void FsdpModel::zero_grad() {
  for (auto& g : groups_) g.zero_grad();
}

GradShardStats FsdpModel::local_grad_stats() const {
  GradShardStats t;
  for (const auto& g : groups_) {
    t.sum_squares += g.grad_stats().sum_squares;
    t.nonfinite += g.grad_stats().nonfinite;
  }
  return t;
}

void FsdpModel::after_optimizer_step() {
  for (auto& g : groups_)
    if (!g.model_param().data) g.refresh_low_precision();
}

std::int64_t FsdpModel::num_parameters() const {
  std::int64_t n = 0;
  for (const auto& g : groups_) n += g.index().param_numel();
  return n;
}

std::size_t FsdpModel::persistent_bytes() const {
  std::size_t b = 0;
  for (const auto& g : groups_) b += g.persistent_bytes();
  return b;
}

std::size_t FsdpModel::max_unit_bytes() const {
  std::size_t b = 0;
  for (const auto& g : groups_) b = std::max(b, g.unsharded_bytes());
  return b;
}

std::vector<std::vector<float>> FsdpModel::gather_master_parameters() const {
  std::vector<std::vector<float>> out;
  for (const auto& g : groups_) out.push_back(g.gather_master());
  return out;
}

}  // namespace kshard
