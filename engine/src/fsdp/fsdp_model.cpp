#include "kshard/engine/fsdp/fsdp_model.hpp"

#include <algorithm>
#include <functional>
#include <limits>
#include <optional>
#include <type_traits>

#include "kshard/kernels/cast.hpp"
#include "kshard/kernels/fp8_gemm.hpp"
#include "kshard/engine/nn/chunked_cross_entropy.hpp"
#include "kshard/engine/nn/embedding.hpp"
#include "../nn/loss_head.hpp"
#include "kshard/error.hpp"
#include "kshard/core/buffer_pool.hpp"

namespace kshard {
namespace detail {
namespace {

/// A View of exactly n elements carved from a buffer that only ever grows
/// (so per-step buffers are allocated once, at the first step).
template <class T>
Kokkos::View<T*> window(Kokkos::View<T*>& buf, std::int64_t n, const char* label) {
  if (std::int64_t(buf.extent(0)) < n)
    buf = Kokkos::View<T*>(Kokkos::view_alloc(std::string(label), Kokkos::WithoutInitializing),
                           std::size_t(n));
  return Kokkos::subview(buf, std::make_pair(std::int64_t(0), n));
}

}  // namespace

// y[b, :] = x[b, seq - 1, :]: each sequence's last row of [batch * seq, width]
// (outside the unnamed namespace: CUDA's extended lambdas want a named enclosing scope).
template <class T>
void take_last_rows(Kokkos::View<const T*> x, Kokkos::View<T*> y, std::int64_t batch,
                    std::int64_t seq, std::int64_t width) {
  Kokkos::parallel_for(
      "kshard::fsdp_take_last_rows", Kokkos::RangePolicy<>(0, batch * width),
      KOKKOS_LAMBDA(std::int64_t i) {
        const std::int64_t b = i / width, c = i - b * width;
        y(i) = x((b * seq + seq - 1) * width + c);
      });
}

// What the model reads: f32 features or int32 token ids.
struct ModelInput {
  Kokkos::View<const float*> x;
  Kokkos::View<const std::int32_t*> ids;
  bool token_ids = false;
  static ModelInput features(Kokkos::View<const float*> x) { return {x, {}, false}; }
  static ModelInput tokens(Kokkos::View<const std::int32_t*> ids) { return {{}, ids, true}; }
};

// Which loss head ends a training forward (nn/loss_head.hpp).
struct LossSpec {
  enum class Kind { mse, cross_entropy } kind;
  Kokkos::View<const float*> target;            // mse
  Kokkos::View<const std::int32_t*> targets;    // cross_entropy
  // cross_entropy: 3 doubles where the loss is left on the device
  // (queue_forward_backward_ce); empty: read, and returned.
  Kokkos::View<double*> result = {};
};

// The schedule in one compute type. Groups and options live in FsdpModel and
// are passed in, so a moved FsdpModel keeps working.
class FsdpCoreBase {
 public:
  virtual ~FsdpCoreBase() = default;
  virtual std::size_t size() const = 0;
  virtual const LayerKindInfo& info(std::size_t i) const = 0;
  // defer_bytes > 0: a last unit with independent rows is left to a chunked
  // pass (chunks of at most that many bytes of output: a loss head's, or
  // forward_chunks'), see run_forward.
  virtual void forward(std::vector<ShardedGroup>& g, const FsdpOptions& o, const ModelInput& in,
                       ActShape shape, std::size_t defer_bytes) = 0;
  virtual void forward_chunks(std::vector<ShardedGroup>& g, const FsdpOptions& o,
                              Kokkos::View<const std::int32_t*> ids, ActShape shape,
                              const FsdpModel::ChunkVisitor& visit) = 0;
  virtual Kokkos::View<const float*> output_f32() = 0;
  virtual Kokkos::View<const float*> decode(std::vector<ShardedGroup>& g, const FsdpOptions& o,
                                            KvCache& cache, Kokkos::View<const std::int32_t*> ids,
                                            ActShape shape) = 0;
  virtual void backward_f32(std::vector<ShardedGroup>& g, const FsdpOptions& o,
                            Kokkos::View<const float*> dy, bool sync) = 0;
  // forward, the loss head, backward; returns the head's loss (NaN, unread,
  // when the loss is left in loss.result).
  virtual double forward_backward(std::vector<ShardedGroup>& g, const FsdpOptions& o,
                                  const ModelInput& in, ActShape shape, const LossSpec& loss,
                                  double scale, bool sync) = 0;
  // fp8 products for every layer but a final Linear (the LM head stays bf16,
  // as TransformerEngine models keep their output projection out of fp8).
  virtual void set_fp8_policy(const Fp8Policy& policy) = 0;
  // The first layer's Layer::defer_token_check.
  virtual void defer_token_check(Kokkos::View<double*> counter) = 0;
  virtual void fp8_scales(std::vector<Fp8Scale*>& out) = 0;
  // Unit `unit`'s parameter `param` (its layer's spec index) is unit
  // `source`'s parameter `source_param`: not in unit's group (the groups are
  // built without it), read from and accumulated into source's.
  struct Tie {
    std::size_t unit, param, source, source_param;
  };
  virtual void tie(const Tie& t) = 0;
};

template <class T>
class FsdpCore final : public FsdpCoreBase {
 public:
  explicit FsdpCore(std::vector<std::unique_ptr<Layer<T>>> layers) : layers_(std::move(layers)) {
    for (std::size_t i = 0; i < layers_.size(); ++i) {
      if (!layers_[i]) throw Error("FsdpModel layer " + std::to_string(i) + " is null", "a layer");
      info_.push_back({layers_[i]->kind(), layers_[i]->in_features(),
                       layers_[i]->out_features(), layers_[i]->param_specs(),
                       layers_[i]->takes_token_ids(), layers_[i]->decodes()});
    }
  }

  std::size_t size() const override { return layers_.size(); }
  const LayerKindInfo& info(std::size_t i) const override { return info_.at(i); }
  void set_fp8_policy(const Fp8Policy& policy) override {
    const bool head = !layers_.empty() && layers_.back()->kind() == "Linear";
    for (std::size_t i = 0; i < layers_.size() - (head ? 1 : 0); ++i)
      layers_[i]->set_fp8_policy(policy);
  }
  void defer_token_check(Kokkos::View<double*> counter) override {
    layers_.front()->defer_token_check(counter);
  }
  void fp8_scales(std::vector<Fp8Scale*>& out) override {
    for (auto& l : layers_) l->fp8_scales(out);
  }
  void tie(const Tie& t) override { tie_ = t; }

  void forward(std::vector<ShardedGroup>& g, const FsdpOptions& o, const ModelInput& in,
               ActShape shape, std::size_t defer_bytes) override {
    check_input(shape);
    const bool ids = in.token_ids;
    if (ids && !layers_[0]->takes_token_ids())
      throw Error("FsdpModel::forward with token ids, but layer 0 is a " + layers_[0]->kind(),
                  "a first layer that takes token ids (Embedding)");
    if (!ids && layers_[0]->takes_token_ids())
      throw Error("FsdpModel::forward with f32 features, but layer 0 (" + layers_[0]->kind() +
                      ") takes token ids",
                  "int32 token ids: forward(Kokkos::View<const std::int32_t*>, shape)");
    if (ids) {
      run_forward(g, o, {}, in.ids, shape, defer_bytes);
    } else if constexpr (std::is_same_v<T, float>) {
      run_forward(g, o, in.x, {}, shape, defer_bytes);
    } else {
      auto xt = window(input_buf_, std::int64_t(in.x.extent(0)), "kshard.fsdp.input");
      cast_from_f32<T>(in.x, xt);
      run_forward(g, o, xt, {}, shape, defer_bytes);
    }
  }

  void forward_chunks(std::vector<ShardedGroup>& g, const FsdpOptions& o,
                      Kokkos::View<const std::int32_t*> ids, ActShape shape,
                      const FsdpModel::ChunkVisitor& visit) override {
    forward(g, o, ModelInput::tokens(ids), shape, o.loss_chunk_bytes);
    const ActShape& os = shapes_.back();
    if (!head_deferred_) {
      visit(0, os.rows(), output_f32());
      return;
    }
    // The head's forward chunk by chunk into pooled buffers (f32 copies for
    // 16-bit compute), each visited before the next overwrites it.
    const DeferredHead h = take_deferred_head();
    const std::size_t k = h.unit;
    g[k].finish_unshard();  // a no-op when unsharded
    const auto params = params_of(g, k);
    const std::int64_t in = shapes_[k].features, chunk = h.chunk_rows;
    const memory::Block out_block =
        memory::acquire(std::size_t(chunk * os.features) * sizeof(T), "kshard.fsdp.out_chunk");
    const memory::Block f32_block = memory::acquire(
        std::is_same_v<T, float> ? 0 : std::size_t(chunk * os.features) * sizeof(float),
        "kshard.fsdp.out_chunk_f32");
    for (std::int64_t r0 = 0; r0 < os.rows(); r0 += chunk) {
      const std::int64_t rc = std::min(chunk, os.rows() - r0);
      const Kokkos::View<T*> out = out_block.view<T>(std::size_t(rc * os.features));
      layers_[k]->forward(Kokkos::subview(h.input, std::make_pair(r0 * in, (r0 + rc) * in)),
                          ActShape{1, rc, in}, params, out);
      if constexpr (std::is_same_v<T, float>) {
        visit(r0, rc, out);
      } else {
        const Kokkos::View<float*> out32 = f32_block.view<float>(std::size_t(rc * os.features));
        cast_to_f32<T>(out, out32);
        visit(r0, rc, out32);
      }
    }
    layers_[k]->release();
  }

  Kokkos::View<const float*> output_f32() override {
    if constexpr (std::is_same_v<T, float>) {
      return acts_.back();
    } else {
      auto out = window(out_f32_, std::int64_t(acts_.back().extent(0)), "kshard.fsdp.out_f32");
      cast_to_f32<T>(acts_.back(), out);
      return out;
    }
  }

  Kokkos::View<const float*> decode(std::vector<ShardedGroup>& g, const FsdpOptions& o,
                                    KvCache& cache, Kokkos::View<const std::int32_t*> ids,
                                    ActShape shape) override {
    const std::size_t n = layers_.size();
    const std::int64_t batch = shape.batch, seq = shape.seq;
    // Everything checked before the first all-gather, so a bad call is an
    // error on every rank and no collective is left half done.
    if (batch != cache.batch() || seq <= 0 || shape.features != 1 ||
        std::int64_t(ids.extent(0)) != shape.rows())
      throw Error("FsdpModel::decode of " + std::to_string(ids.extent(0)) + " ids as batch=" +
                      std::to_string(batch) + ", seq=" + std::to_string(seq) +
                      ", features=" + std::to_string(shape.features) +
                      " with a cache for batch " + std::to_string(cache.batch()),
                  "batch = the cache's, seq > 0, features = 1, batch * seq ids");
    if (cache.length() + seq > cache.capacity())
      throw Error("FsdpModel::decode of " + std::to_string(seq) + " tokens per sequence after " +
                      std::to_string(cache.length()) + " cached ones",
                  "at most the cache's capacity, " + std::to_string(cache.capacity()) +
                      " tokens (clear() it, or a larger KvCache)");
    auto* store = dynamic_cast<KvStore*>(cache.storage());
    if (store == nullptr || store->layers.size() != n) {
      if (cache.length() != 0)
        throw Error("FsdpModel::decode with a cache of " + std::to_string(cache.length()) +
                        " tokens filled by another model",
                    "an empty cache or one this model filled");
      auto fresh = std::make_unique<KvStore>();
      fresh->layers.resize(n);
      store = fresh.get();
      cache.set_storage(std::move(fresh));
    }
    // A rows-independent head runs on each sequence's last row alone: a
    // prefill computes vocab logits for one row per sequence, not seq.
    const bool last_rows_only = seq > 1 && n > 1 && layers_.back()->rows_independent();
    ActShape s{batch, seq, 1};
    Kokkos::View<const T*> cur;
    bool use_a = true;
    for (std::size_t i = 0; i < n; ++i) {
      g[i].finish_unshard();  // a no-op when unsharded
      if (o.prefetch && i + 1 < n) g[i + 1].start_unshard();
      const auto params = params_of(g, i);
      DecodeStep<T> step{cache.length(), cache.capacity(), &store->layers[i]};
      if (i + 1 == n && last_rows_only) {
        auto last = window(dec_last_, batch * s.features, "kshard.fsdp.decode_last");
        take_last_rows<T>(cur, last, batch, seq, s.features);
        cur = last;
        s = ActShape{batch, 1, s.features};
      }
      const ActShape os = layers_[i]->output_shape(s);
      Kokkos::View<T*> out = window(use_a ? dec_a_ : dec_b_, os.numel(), "kshard.fsdp.decode_act");
      if (i == 0)
        layers_[0]->decode_tokens(ids, s, params, out, step);
      else
        layers_[i]->decode(cur, s, params, out, step);
      if (o.reshard_after_forward && i + 1 < n && !(tie_ && i == tie_->source)) g[i].reshard();
      cur = out;
      s = os;
      use_a = !use_a;
    }
    cache.advance(seq);
    // The logits of each sequence's last token (a head whose rows are not
    // independent ran on every row), as f32: f32 logits are returned as they
    // are, valid until the next call, like output_f32().
    const std::int64_t width = s.features;
    if (s.seq != 1) {
      auto last = window(dec_last_, batch * width, "kshard.fsdp.decode_last");
      take_last_rows<T>(cur, last, batch, s.seq, width);
      cur = last;
    }
    if constexpr (std::is_same_v<T, float>) {
      return cur;
    } else {
      auto out = window(dec_out_f32_, batch * width, "kshard.fsdp.decode_out");
      cast_to_f32<T>(cur, out);
      return out;
    }
  }

  void backward_f32(std::vector<ShardedGroup>& g, const FsdpOptions& o,
                    Kokkos::View<const float*> dy, bool sync) override {
    check_backward(dy.extent(0));
    if constexpr (std::is_same_v<T, float>) {
      run_backward(g, o, dy, sync);
    } else {
      auto d = window(dloss_, std::int64_t(dy.extent(0)), "kshard.fsdp.dloss");
      cast_from_f32<T>(dy, d);
      run_backward(g, o, d, sync);
    }
  }

  double forward_backward(std::vector<ShardedGroup>& g, const FsdpOptions& o,
                          const ModelInput& in, ActShape shape, const LossSpec& loss,
                          double scale, bool sync) override {
    std::unique_ptr<LossHead<T>> head;
    if (loss.kind == LossSpec::Kind::mse)
      head = std::make_unique<MseHead<T>>(loss.target, scale);
    else
      head = std::make_unique<CrossEntropyHead<T>>(loss.targets, scale, o.loss_chunk_bytes,
                                                   loss.result);
    forward(g, o, in, shape, head->last_unit_chunk_bytes());
    if (head_deferred_) {
      const DeferredHead h = take_deferred_head();
      run_backward(g, o, {}, sync,
                   [&](const ConstViews& p, const GradViews& gr, Kokkos::View<T*> dx) {
                     head->last_unit_backward(*layers_[h.unit], h.input, shapes_[h.unit],
                                              h.chunk_rows, p, gr, dx);
                   });
    } else {
      run_backward(g, o, head->output_gradient(acts_.back(), shapes_.back()), sync);
    }
    return loss.result.extent(0) != 0 ? std::numeric_limits<double>::quiet_NaN() : head->loss();
  }

 private:
  // The head run_forward left out (head_deferred_), taken by the one chunked
  // pass that runs it: its unit, its input and the rows per chunk of output.
  struct DeferredHead {
    std::size_t unit;
    Kokkos::View<const T*> input;
    std::int64_t chunk_rows;
  };
  DeferredHead take_deferred_head() {
    const ActShape& os = shapes_.back();
    DeferredHead h{layers_.size() - 1, head_input_,
                   loss_chunk_rows(defer_bytes_, os.rows(), os.features, sizeof(T))};
    head_deferred_ = false;
    head_input_ = {};
    return h;
  }

  void check_input(const ActShape& shape) const {
    if (shape.features != layers_[0]->in_features())
      throw Error("model input has " + std::to_string(shape.features) + " features",
                  std::to_string(layers_[0]->in_features()) + " (the first layer's input)");
  }
  void check_backward(std::size_t n) const {
    if (shapes_.size() != layers_.size() + 1)
      throw Error("FsdpModel::backward before forward", "forward() first");
    if (std::int64_t(n) != shapes_.back().numel())
      throw Error("backward with a gradient of " + std::to_string(n) + " elements",
                  std::to_string(shapes_.back().numel()) + " (the model output)");
  }

  // defer_bytes > 0 and a last unit whose rows are independent: that unit's
  // forward is left to a chunked pass (a loss head's, forward_chunks') of at
  // most defer_bytes of output per chunk, and its output buffer (the logits)
  // is not allocated, or is given back.
  void run_forward(std::vector<ShardedGroup>& g, const FsdpOptions& o, Kokkos::View<const T*> x,
                   Kokkos::View<const std::int32_t*> ids, ActShape shape,
                   std::size_t defer_bytes) {
    const std::size_t n = layers_.size();
    head_deferred_ = defer_bytes > 0 && layers_.back()->rows_independent() &&
                     !(n == 1 && ids.data() != nullptr);
    defer_bytes_ = defer_bytes;
    const std::size_t run = head_deferred_ ? n - 1 : n;
    shapes_.assign(n + 1, shape);
    acts_.resize(n + 1);
    if (head_deferred_) acts_[n] = {};
    for (std::size_t i = 0; i < n; ++i) {
      shapes_[i + 1] = layers_[i]->output_shape(shapes_[i]);
      const std::size_t out = std::size_t(shapes_[i + 1].numel());
      if (i < run && acts_[i + 1].extent(0) != out)
        acts_[i + 1] = Kokkos::View<T*>(Kokkos::view_alloc("layers." + std::to_string(i) + ".out",
                                                           Kokkos::WithoutInitializing),
                                        out);
    }
    head_input_ = head_deferred_ ? (n == 1 ? x : Kokkos::View<const T*>(acts_[n - 1]))
                                 : Kokkos::View<const T*>();
    for (std::size_t i = 0; i < run; ++i) {
      g[i].finish_unshard();  // a no-op when unsharded
      if (o.prefetch && i + 1 < n) g[i + 1].start_unshard();
      const auto params = params_of(g, i);
      if (i == 0 && ids.data() != nullptr)
        layers_[0]->forward_tokens(ids, shapes_[0], params, acts_[1]);
      else
        layers_[i]->forward(i == 0 ? x : Kokkos::View<const T*>(acts_[i]), shapes_[i], params,
                            acts_[i + 1]);
      // The last unit is needed first by backward: keep it (as FSDP2 does);
      // a tied source is read again by its tied unit.
      if (o.reshard_after_forward && i + 1 < n && !(tie_ && i == tie_->source)) g[i].reshard();
    }
  }

  using ConstViews = typename Layer<T>::ConstViews;
  using GradViews = typename Layer<T>::GradViews;
  /// Unit n-1's backward done another way (the chunked head + loss).
  using TopBackward = std::function<void(const ConstViews&, const GradViews&, Kokkos::View<T*>)>;

  void run_backward(std::vector<ShardedGroup>& g, const FsdpOptions& o, Kokkos::View<const T*> dy,
                    bool sync, const TopBackward& top = {}) {
    const std::size_t n = layers_.size();
    Kokkos::View<const T*> cur = dy;
    bool use_a = true;
    std::size_t reducing = n;  // unit whose reduce-scatter is in flight (n: none)
    for (std::size_t k = n; k-- > 0;) {
      g[k].finish_unshard();  // a no-op when unsharded
      if (o.prefetch && k > 0) g[k - 1].start_unshard();
      Kokkos::View<T*> dx = window(use_a ? dact_a_ : dact_b_, shapes_[k].numel(), "kshard.fsdp.dact");
      // The first backward into a unit's gradients since zero_grad() or its
      // last reduction WRITES them (no zero fill, no read of the old values
      // in the weight-gradient GEMMs) where the layer can; a tied parameter
      // gets two backward contributions, so its two units add.
      const bool tied = tie_ && (k == tie_->unit || k == tie_->source);
      const GradWrite write = !tied && layers_[k]->assigns_grads() && g[k].grads_unwritten()
                                  ? GradWrite::assign
                                  : GradWrite::add;
      const GradViews grads = grads_of(g, k, write);
      layers_[k]->set_grad_write(write);
      if (top && k + 1 == n)
        top(params_of(g, k), grads, dx);
      else
        layers_[k]->backward(cur, params_of(g, k), grads, dx);
      layers_[k]->release();
      if (sync) {
        g[k].start_reduce_grads();
        if (reducing < n) g[reducing].finish_reduce_grads();
        reducing = k;
      }
      g[k].reshard();
      cur = dx;
      use_a = !use_a;
    }
    if (reducing < n) g[reducing].finish_reduce_grads();
  }

  // Unit k's parameters (gradients) in its layer's spec order: its group's,
  // with a tied one taken from the source unit's group.
  ConstViews params_of(std::vector<ShardedGroup>& g, std::size_t k) const {
    ConstViews v = g[k].params<T>();
    if (tie_ && k == tie_->unit)
      v.insert(v.begin() + std::ptrdiff_t(tie_->param), g[tie_->source].params<T>().at(tie_->source_param));
    return v;
  }
  GradViews grads_of(std::vector<ShardedGroup>& g, std::size_t k, GradWrite write) const {
    GradViews v = g[k].unsharded_grads(write);
    if (tie_ && k == tie_->unit)
      v.insert(v.begin() + std::ptrdiff_t(tie_->param),
               g[tie_->source].unsharded_grads().at(tie_->source_param));
    return v;
  }

  std::vector<std::unique_ptr<Layer<T>>> layers_;
  std::optional<Tie> tie_;
  std::vector<LayerKindInfo> info_;
  std::vector<ActShape> shapes_;          // input shape of each unit, and the output
  std::vector<Kokkos::View<T*>> acts_;    // acts_[i]: input of unit i (acts_[0] unused)
  bool head_deferred_ = false;             // the last forward left the head to a chunked pass
  std::size_t defer_bytes_ = 0;            // its most output bytes per chunk
  Kokkos::View<const T*> head_input_;      // the head's input then
  Kokkos::View<T*> dact_a_, dact_b_, dloss_, input_buf_;
  Kokkos::View<float*> out_f32_;
  // decode(): its activations (two, alternating), each sequence's last row,
  // its f32 logits; and the cache storage in this compute type.
  Kokkos::View<T*> dec_a_, dec_b_, dec_last_;
  Kokkos::View<float*> dec_out_f32_;
  struct KvStore final : KvStorage {
    std::vector<AttentionKv<T>> layers;  // one per unit (empty: not attention)
    std::size_t bytes() const override {
      std::size_t b = 0;
      for (const auto& l : layers) b += (l.k.extent(0) + l.v.extent(0)) * sizeof(T);
      return b;
    }
  };
};

template <class T>
std::unique_ptr<FsdpCoreBase> make_core(const std::vector<LayerDef>& defs) {
  std::vector<std::unique_ptr<Layer<T>>> layers;
  for (const auto& d : defs) layers.push_back(d.make<T>());
  return std::make_unique<FsdpCore<T>>(std::move(layers));
}

// tie_word_embeddings: the last layer's "weight" is the first layer's.
FsdpCoreBase::Tie word_embedding_tie(const FsdpCoreBase& core) {
  const std::size_t last = core.size() - 1;
  const auto& first = core.info(0);
  const auto& head = core.info(last);
  const auto find = [](const LayerKindInfo& li) {
    const auto it = std::find_if(li.specs.begin(), li.specs.end(),
                                 [](const ParamSpec& p) { return p.name == "weight"; });
    return it == li.specs.end() ? li.specs.size() : std::size_t(it - li.specs.begin());
  };
  const std::size_t fw = find(first), hw = find(head);
  if (last == 0 || !first.takes_token_ids || fw == first.specs.size())
    throw Error("tie_word_embeddings with a first layer " + first.kind +
                    (last == 0 ? " and no other layer" : ""),
                "an Embedding first (token ids in, a \"weight\" table) and a head after it");
  if (hw == head.specs.size() || head.specs[hw].shape != first.specs[fw].shape)
    throw Error("tie_word_embeddings: the last layer (" + head.kind + ") has " +
                    (hw == head.specs.size() ? std::string("no \"weight\"")
                                             : "a weight of shape " + shape_text(head.specs[hw].shape)) +
                    ", the embedding's is " + shape_text(first.specs[fw].shape),
                "a last layer whose \"weight\" has the embedding's shape [vocab, d] (a Linear(d, vocab))");
  return {last, hw, 0, fw};
}

}  // namespace detail

FsdpModel::FsdpModel(const DeviceMesh& mesh, const std::vector<LayerDef>& layers, Recipe recipe,
                     FsdpOptions options)
    : mesh_(mesh), recipe_(std::move(recipe)), options_(options) {
  if (layers.empty()) throw Error("FsdpModel with no layers", "at least one layer");
  switch (recipe_.compute_dtype) {
    case DType::f32: core_ = detail::make_core<float>(layers); break;
    case DType::bf16: core_ = detail::make_core<bfloat16_t>(layers); break;
    case DType::f16: core_ = detail::make_core<float16_t>(layers); break;
    default:
      throw Error(std::string("recipe compute dtype ") + dtype_name(recipe_.compute_dtype),
                  "f32, bf16 or f16");
  }
  if (recipe_.fp8_compute.enabled()) {
    std::string why;
    const bool blocks = recipe_.fp8_compute.scaling == Fp8Scaling::block;
    if (!fp8_gemm_available(&why, blocks))
      throw Error("recipe '" + recipe_.name + "' on " + why,
                  blocks ? "a Hopper GPU (compute capability 9.0) for fp8-block, or fp8-current / "
                           "fp8-delayed (8.9+), or recipe fp32, bf16, fp16 or fp8 (fp8 "
                           "all-gather, bf16 compute), which run on any GPU"
                         : "a GPU with fp8 tensor cores (compute capability 8.9+: Ada, Hopper, "
                           "Blackwell) for the fp8 compute recipes, or recipe fp32, bf16, fp16 "
                           "or fp8 (fp8 all-gather, bf16 compute), which run on any GPU");
    core_->set_fp8_policy(recipe_.fp8_compute);
    if (recipe_.fp8_compute.scaling == Fp8Scaling::delayed) {
      std::vector<Fp8Scale*> scales;
      core_->fp8_scales(scales);
      fp8_history_ = std::make_unique<Fp8AmaxHistory>(
          scales, recipe_.fp8_compute.amax_history_len, recipe_.fp8_compute.amax_algo);
    }
  }
  build_groups();
}

FsdpModel::FsdpModel(const DeviceMesh& mesh, std::vector<std::unique_ptr<Layer<float>>> layers,
                     Recipe recipe, FsdpOptions options)
    : mesh_(mesh), recipe_(std::move(recipe)), options_(options) {
  if (layers.empty()) throw Error("FsdpModel with no layers", "at least one layer");
  if (recipe_.compute_dtype != DType::f32)
    throw Error("FsdpModel of Layer<float> objects with recipe '" + recipe_.name +
                    "', which computes in " + dtype_name(recipe_.compute_dtype),
                "LayerDefs (kshard::layer<...>(...)) so the model builds its layers in the "
                "recipe's compute dtype");
  core_ = std::make_unique<detail::FsdpCore<float>>(std::move(layers));
  build_groups();
}

FsdpModel::~FsdpModel() = default;
FsdpModel::FsdpModel(FsdpModel&&) noexcept = default;
FsdpModel& FsdpModel::operator=(FsdpModel&&) noexcept = default;

void FsdpModel::build_groups() {
  // Totals, the bad-id count and room for 8 queued losses (it grows).
  stats_total_ = Kokkos::View<double*>("kshard.fsdp.grad_stats_total", 3 + 3 * 8);
  for (std::size_t i = 0; i < core_->size(); ++i) {
    const auto& li = core_->info(i);
    if (i > 0 && li.in_features != core_->info(i - 1).out_features)
      throw Error("layer " + std::to_string(i) + " (" + li.kind + ") takes " +
                      std::to_string(li.in_features) + " features but layer " +
                      std::to_string(i - 1) + " (" + core_->info(i - 1).kind + ") gives " +
                      std::to_string(core_->info(i - 1).out_features),
                  "consecutive layers with matching widths");
  }
  std::optional<detail::FsdpCoreBase::Tie> tie;
  if (options_.tie_word_embeddings) tie = detail::word_embedding_tie(*core_);
  for (std::size_t i = 0; i < core_->size(); ++i) {
    std::vector<ParamSpec> specs = core_->info(i).specs;
    if (tie && i == tie->unit) specs.erase(specs.begin() + std::ptrdiff_t(tie->param));
    groups_.emplace_back("layers." + std::to_string(i), specs, mesh_, recipe_,
                         options_.keep_low_precision_shard);
  }
  if (tie) core_->tie(*tie);
}


std::string FsdpModel::layer_kind(std::size_t i) const { return core_->info(i).kind; }

void FsdpModel::init_parameters(std::uint64_t seed) {
  for (auto& g : groups_) g.init_parameters(seed);
}

Kokkos::View<const float*> FsdpModel::forward(Kokkos::View<const float*> x, ActShape shape) {
  core_->forward(groups_, options_, detail::ModelInput::features(x), shape, 0);
  return core_->output_f32();
}

Kokkos::View<const float*> FsdpModel::forward(Kokkos::View<const std::int32_t*> ids,
                                              ActShape shape) {
  core_->forward(groups_, options_, detail::ModelInput::tokens(ids), shape, 0);
  return core_->output_f32();
}

void FsdpModel::forward_chunks(Kokkos::View<const std::int32_t*> ids, ActShape shape,
                               const ChunkVisitor& visit) {
  core_->forward_chunks(groups_, options_, ids, shape, visit);
}

bool FsdpModel::can_decode() const {
  if (!core_->info(0).takes_token_ids) return false;
  for (std::size_t i = 0; i < core_->size(); ++i)
    if (!core_->info(i).decodes) return false;
  return true;
}

Kokkos::View<const float*> FsdpModel::decode(KvCache& cache, Kokkos::View<const std::int32_t*> ids,
                                             ActShape shape) {
  if (!can_decode()) {
    std::string kinds;
    for (std::size_t i = 0; i < core_->size(); ++i)
      kinds += (i ? ", " : "") + core_->info(i).kind;
    throw Error("FsdpModel::decode on layers " + kinds,
                "an Embedding first and then layers that decode incrementally (TransformerLayer, "
                "LlamaLayer, CausalSelfAttention, and rows-independent ones: norms, Linear, MLPs)");
  }
  return core_->decode(groups_, options_, cache, ids, shape);
}

void FsdpModel::backward(Kokkos::View<const float*> dy, bool sync) {
  core_->backward_f32(groups_, options_, dy, sync);
}

double FsdpModel::forward_backward_mse(Kokkos::View<const float*> x, ActShape shape,
                                       Kokkos::View<const float*> target, double grad_scale,
                                       bool sync) {
  using L = detail::LossSpec;
  return core_->forward_backward(groups_, options_, detail::ModelInput::features(x), shape,
                                 L{L::Kind::mse, target, {}}, grad_scale, sync);
}

double FsdpModel::forward_backward_ce(Kokkos::View<const float*> x, ActShape shape,
                                      Kokkos::View<const std::int32_t*> targets,
                                      double grad_scale, bool sync) {
  using L = detail::LossSpec;
  return core_->forward_backward(groups_, options_, detail::ModelInput::features(x), shape,
                                 L{L::Kind::cross_entropy, {}, targets}, grad_scale, sync);
}

double FsdpModel::forward_backward_ce(Kokkos::View<const std::int32_t*> ids, ActShape shape,
                                      Kokkos::View<const std::int32_t*> targets,
                                      double grad_scale, bool sync) {
  using L = detail::LossSpec;
  return core_->forward_backward(groups_, options_, detail::ModelInput::tokens(ids), shape,
                                 L{L::Kind::cross_entropy, {}, targets}, grad_scale, sync);
}

void FsdpModel::queue_forward_backward_ce(Kokkos::View<const std::int32_t*> ids, ActShape shape,
                                          Kokkos::View<const std::int32_t*> targets,
                                          double grad_scale, bool sync) {
  // The scratch holds the statistics' totals, the queued calls' count of bad
  // token ids, then slot k of the queue: doubles [3 + 3k, 6 + 3k). It grows
  // (copying what is queued) when full: a few times in a run at most.
  const std::size_t k = queued_rows_.size();
  const std::size_t need = 3 + 3 * (k + 1);
  if (stats_total_.extent(0) < need) {
    Kokkos::View<double*> grown("kshard.fsdp.grad_stats_total",
                                3 + 3 * std::max<std::size_t>(8, 2 * (k + 1)));
    Kokkos::deep_copy(Kokkos::subview(grown, std::make_pair(std::size_t(0), stats_total_.extent(0))),
                      stats_total_);
    stats_total_ = grown;
  }
  const Kokkos::View<double*> bad_ids = Kokkos::subview(stats_total_, std::make_pair(2, 3));
  if (k == 0) fill<double>(bad_ids, 0.0);
  // The embedding counts bad ids into the scratch instead of waiting for the
  // device to check them (the queue has no wait until prepare_optimizer_step).
  struct Deferred {
    detail::FsdpCoreBase& core;
    ~Deferred() { core.defer_token_check({}); }
  } deferred{*core_};
  core_->defer_token_check(bad_ids);
  using L = detail::LossSpec;
  core_->forward_backward(
      groups_, options_, detail::ModelInput::tokens(ids), shape,
      L{L::Kind::cross_entropy, {}, targets, Kokkos::subview(stats_total_, std::make_pair(need - 3, need))},
      grad_scale, sync);
  queued_rows_.push_back(shape.rows());
}

void FsdpModel::zero_grad() {
  for (auto& g : groups_) g.zero_grad();
}

PreparedStep FsdpModel::prepare_optimizer_step() {
  // The groups' statistics are summed on the device, in stream order, and come
  // to the host in ONE copy with the queued losses: the step's only wait for
  // the backward pass.
  const std::vector<std::int64_t> queued = std::move(queued_rows_);
  queued_rows_.clear();
  for (auto& g : groups_)
    g.settle_grad();  // a shard still pending zero (no reduction since zero_grad) is zeroed now
  // One kernel totals the groups' statistics in group order (their Views live
  // as long as the groups: the addresses are gathered once).
  if (stats_sources_.extent(0) != groups_.size()) {
    stats_sources_ = Kokkos::View<std::uintptr_t*>("kshard.fsdp.grad_stats_sources", groups_.size());
    auto h = Kokkos::create_mirror_view(stats_sources_);
    for (std::size_t i = 0; i < groups_.size(); ++i)
      h(i) = reinterpret_cast<std::uintptr_t>(groups_[i].grad_stats_device().data());
    Kokkos::deep_copy(stats_sources_, h);
  }
  const Kokkos::View<double*> total = stats_total_;
  const Kokkos::View<const std::uintptr_t*> sources = stats_sources_;
  const std::int64_t groups = std::int64_t(groups_.size());
  Kokkos::parallel_for(
      "kshard::fsdp_sum_grad_stats", Kokkos::RangePolicy<>(0, 1), KOKKOS_LAMBDA(int) {
        double sum = 0.0, nonfinite = 0.0;
        for (std::int64_t i = 0; i < groups; ++i) {
          const double* s = reinterpret_cast<const double*>(sources(i));
          sum += s[0];
          nonfinite += s[1];
        }
        total(0) = sum;
        total(1) = nonfinite;
      });
  // Into a host buffer kept for it: create_mirror_view_and_copy would read
  // the device View's label first (Kokkos keeps it in the allocation's header
  // on the device), a second blocking copy, measured as one more wait per step.
  const std::size_t n = 3 + 3 * queued.size();
  if (stats_host_.extent(0) < n)
    stats_host_ = Kokkos::View<double*, Kokkos::HostSpace>("kshard.fsdp.grad_stats_host",
                                                           stats_total_.extent(0));
  const auto range = std::make_pair(std::size_t(0), n);
  const auto h = Kokkos::subview(stats_host_, range);
  Kokkos::deep_copy(h, Kokkos::subview(stats_total_, range));
  PreparedStep r{GradShardStats{h(0), std::int64_t(h(1))}, {}};
  if (!queued.empty() && h(2) != 0)
    throw Error("queue_forward_backward_ce (" + std::to_string(queued.size()) +
                    " calls since the last optimizer step): " +
                    std::to_string(std::int64_t(h(2))) + " token ids are not integers in [0, " +
                    std::to_string(core_->info(0).specs.at(0).shape.at(0)) + ")",
                "every id an integer in [0, vocab)");
  for (std::size_t k = 0; k < queued.size(); ++k) {
    const double bad = h(3 + 3 * k + 2);
    if (bad != 0)
      throw Error("queue_forward_backward_ce (call " + std::to_string(k + 1) + " of " +
                      std::to_string(queued.size()) + " since the last optimizer step, rows=" +
                      std::to_string(queued[k]) + ", vocab=" +
                      std::to_string(core_->info(core_->size() - 1).out_features) + "): " +
                      std::to_string(std::int64_t(bad)) +
                      " targets are >= vocab",
                  "targets in [0, vocab), or negative to ignore a row");
    r.losses.push_back(h(3 + 3 * k));
  }
  return r;
}

void FsdpModel::finish_optimizer_step() {
  for (auto& g : groups_)
    if (!g.low_precision_shard().present()) g.refresh_low_precision();
  if (fp8_history_) {
    // One all-reduce of every tensor's scaling values: the amaxes become the
    // max over all ranks (each saw its own activations and gradients), the
    // scales are equal everywhere already.
    mesh_.world().all_reduce(fp8_history_->amax_and_scales(), ReduceOp::max);
    fp8_history_->update();
  }
}

std::vector<float> FsdpModel::fp8_state() const {
  return fp8_history_ ? fp8_history_->state() : std::vector<float>{};
}

void FsdpModel::set_fp8_state(const std::vector<float>& state) {
  if (!fp8_history_) {
    if (state.empty()) return;
    throw Error("fp8 scaling state of " + std::to_string(state.size()) + " values for recipe '" +
                    recipe_.name + "'",
                "no state (only delayed-scaling recipes keep one)");
  }
  fp8_history_->set_state(state);
}

}  // namespace kshard
