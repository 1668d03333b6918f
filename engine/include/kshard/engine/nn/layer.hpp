#pragma once
// kshard::Layer — the interface between a model's layers and the engine's
// sharded parameter groups.
//
// A layer knows nothing about sharding. It describes its parameters
// (ParamSpec: name, shape, initialiser), and its forward/backward take one
// View per parameter, in spec order. The engine decides where those Views
// live: for an FSDP unit they are consecutive slices of ONE flat all-gathered
// buffer (and the gradients slices of one flat buffer that is then
// reduce-scattered), so no copy-in or copy-out is needed.
//
//   kshard::Linear<float> fc(/*in=*/512, /*out=*/2048);
//   auto params = kshard::allocate_parameters(fc);  // or subviews of one flat buffer
//   kshard::init_parameters(fc, params, /*seed=*/1, "layers.0.");
//   auto grads = kshard::allocate_parameters(fc);   // zero-filled
//   kshard::ActShape s{batch, seq, 512};
//   Kokkos::View<float*> y("y", s.rows() * fc.out_features());
//   fc.forward(x, s, kshard::const_views(params), y);         // saves what backward needs
//   ...                                                      // loss -> dy
//   fc.backward(dy, kshard::const_views(params), grads, dx);  // grads += dW, db; dx written
//   fc.release();                                            // drop saved activations
//
// Contract
// - Activations are row-major [rows = batch*seq, features] in flat, contiguous
//   1-D Views of the default memory space; every View must have exactly the
//   number of elements its shape implies (else kshard::Error).
// - forward() keeps a HANDLE (not a copy) of inputs that backward needs, so x
//   must stay unchanged until backward() (or release()). backward() needs the
//   same parameter VALUES as forward() (they may be different Views, as after
//   FSDP's reshard-after-forward and re-all-gather).
// - backward() ACCUMULATES (+=) into grads, so micro-batches can accumulate
//   without a copy; the caller zeroes grads when a step starts. It WRITES dx.
//   It may be called more than once after one forward (each call adds again).
//   A layer that assigns_grads() can instead WRITE (=) every gradient element
//   in its next backward() (set_grad_write(GradWrite::assign),
//   kernels/grad_write.hpp):
//   the caller then need not zero the gradients (FSDP's first backward of a
//   step does this).
// - dy, dx and x must not alias one another; dy may be the layer's own y
//   (no layer reads its output in backward: the loss gradient can overwrite
//   the logits).
// - Layers own their saved activations, sized on first use and reused while
//   shapes stay the same (so a steady-state step allocates nothing);
//   release() drops the saved forward (handles to inputs) but keeps those
//   buffers for the next forward. Backward-only workspaces come from the
//   buffer pool for the duration of one backward(). One object holds one
//   saved forward: a second forward replaces it (two micro-batches in flight
//   at once need two layer objects; they may share parameter Views).
// - Parameter and gradient Views may be subviews of one flat buffer (what an
//   FSDP unit passes); they must not overlap each other.
// - Not thread-safe; kernels run on the default execution space instance.
// - Compute types T: float, bfloat16_t and float16_t (training; FSDP2's
//   param_dtype, chosen by the Recipe) and double (finite-difference checks).
//   Parameters and activations are T; every sum, statistic and exponential
//   is computed in accum_t<T> (f32 for the 16-bit types); parameter gradients
//   are accum_t<T> (Grad), written straight from the f32 accumulators of the
//   GEMMs, so micro-batches accumulate without rounding to 16 bits.
// - A layer that consumes token ids (Embedding) says so (takes_token_ids())
//   and implements forward_tokens(); the model feeds it int32 ids.
// - Incremental decoding (generation with a KV cache, FsdpModel::decode):
//   decode() / decode_tokens() compute what forward() would for the rows of
//   a few NEW tokens per sequence that follow step.position cached ones
//   (nn/decode_step.hpp), keep nothing for backward and drop any saved
//   forward. Rows-independent layers need nothing more (the default runs
//   forward() and release()); attention layers read and append their cache;
//   the Embedding adds the position table at the tokens' positions. A layer
//   that can do this says so (decodes()).
#include <cstdint>
#include <string>
#include <vector>

#include <Kokkos_Core.hpp>

#include "kshard/engine/nn/decode_step.hpp"
#include "kshard/engine/nn/fp8_policy.hpp"
#include "kshard/kernels/grad_write.hpp"
#include "kshard/engine/nn/init.hpp"
#include "kshard/core/buffer_pool.hpp"
#include "kshard/numeric/compute.hpp"

namespace kshard {

struct ParamSpec {
  std::string name;                 ///< local name, e.g. "weight", "ln1.gamma"
  std::vector<std::int64_t> shape;  ///< row-major, e.g. {out, in}
  Init init;
  std::int64_t numel() const;
};

/// "[out, in]": a shape as messages write it.
std::string shape_text(const std::vector<std::int64_t>& shape);

struct ActShape {
  std::int64_t batch = 0, seq = 0, features = 0;
  std::int64_t rows() const { return batch * seq; }
  std::int64_t numel() const { return rows() * features; }
};

template <class T>
class Layer {
 public:
  using Grad = accum_t<T>;
  using ConstViews = std::vector<Kokkos::View<const T*>>;
  /// Parameter-gradient Views (one per spec).
  using GradViews = std::vector<Kokkos::View<Grad*>>;
  using Views = GradViews;

  virtual ~Layer() = default;
  virtual std::string kind() const = 0;                    ///< "Linear", "TransformerLayer", ...
  virtual std::vector<ParamSpec> param_specs() const = 0;  ///< names, shapes, init
  virtual std::int64_t in_features() const = 0;
  virtual std::int64_t out_features() const = 0;

  /// x: [rows, in_features]; params: one View per spec, in spec order;
  /// y: [rows, out_features], written. Saves what backward needs.
  virtual void forward(Kokkos::View<const T*> x, ActShape shape, const ConstViews& params,
                       Kokkos::View<T*> y) = 0;
  /// dy: [rows, out_features] of the last forward. grads += dL/dparams; dx written.
  virtual void backward(Kokkos::View<const T*> dy, const ConstViews& params,
                        const GradViews& grads, Kokkos::View<T*> dx) = 0;
  /// True for layers whose input is token ids (shape.features == 1).
  virtual bool takes_token_ids() const { return false; }
  /// forward() on int32 token ids; backward() then writes dx (zeros) as usual.
  virtual void forward_tokens(Kokkos::View<const std::int32_t*> ids, ActShape shape,
                              const ConstViews& params, Kokkos::View<T*> y);
  /// Token-id layers: while `counter` (one device double) is set,
  /// forward_tokens adds the number of ids outside [0, vocab) to counter(0)
  /// instead of waiting for the device to check them: the caller reads it
  /// later and must not use that forward's results (or its backward's
  /// gradients) when it is not 0. Such ids stand for row 0 meanwhile, so
  /// nothing outside the table is read or written. An empty View restores the
  /// synchronous check (kshard::Error from forward_tokens). Others: ignored.
  virtual void defer_token_check(Kokkos::View<double*> counter) { (void)counter; }
  /// Drops the saved forward (activation buffers stay allocated for reuse).
  virtual void release() {}
  /// Whether decode() (or decode_tokens()) works: rows-independent layers,
  /// attention layers and the Embedding.
  virtual bool decodes() const { return rows_independent(); }
  /// Incremental decoding on shape.seq new tokens per sequence (see above):
  /// x [rows, in_features], y [rows, out_features] written, nothing saved.
  /// The default (rows-independent layers) is forward() then release();
  /// otherwise kshard::Error.
  virtual void decode(Kokkos::View<const T*> x, ActShape shape, const ConstViews& params,
                      Kokkos::View<T*> y, DecodeStep<T>& step);
  /// decode() on int32 token ids (a layer that takes_token_ids()); the
  /// default is kshard::Error.
  virtual void decode_tokens(Kokkos::View<const std::int32_t*> ids, ActShape shape,
                             const ConstViews& params, Kokkos::View<T*> y, DecodeStep<T>& step);
  /// True when every output row depends on the same input row alone (Linear,
  /// LayerNorm, an MLP; not attention), so forward + backward over consecutive
  /// row ranges, one after the other, equal one pass over all rows (the
  /// gradients accumulate): what lets a loss run the LM head in row chunks
  /// (chunked_cross_entropy.hpp) without keeping all of its output.
  virtual bool rows_independent() const { return false; }
  /// Activation elements per row (token) kept between forward and backward,
  /// in the compute dtype, counting the output the next layer reads: what
  /// a memory estimate charges per token before anything is allocated. The
  /// default (input + output) fits a layer that keeps its input and writes
  /// its output; composites that keep more say so.
  virtual double saved_elements_per_row() const {
    return double(in_features()) + double(out_features());
  }
  /// Sets how this layer's Linear products compute in fp8 (nn/fp8_policy.hpp):
  /// a Linear in bf16 keeps it, composite layers pass it to their Linears,
  /// every other layer ignores it. The model calls this from its Recipe.
  virtual void set_fp8_policy(const Fp8Policy& policy) { (void)policy; }
  /// Appends the scaling state of this layer's fp8 operands (x, W, dy of
  /// each Linear that has an fp8 policy) in a fixed order: what the model
  /// puts under one amax history for delayed scaling.
  virtual void fp8_scales(std::vector<Fp8Scale*>& out) { (void)out; }
  /// Whether backward() can ASSIGN the parameter gradients (write every
  /// element, GradWrite::assign). Layers without parameters trivially can;
  /// layers with parameters say so; composites can when all their sub-layers can.
  virtual bool assigns_grads() const { return param_specs().empty(); }
  /// How the NEXT backward() writes the parameter gradients; after that call
  /// it is GradWrite::add again (so a second backward, or the next
  /// micro-batch, adds). Composites pass it to their sub-layers. assign on a
  /// layer that cannot (assigns_grads() false), or none, is a kshard::Error.
  virtual void set_grad_write(GradWrite w);

  ActShape output_shape(ActShape in) const { return {in.batch, in.seq, out_features()}; }

 protected:
  /// The write mode of this backward(), reset to add: a layer that computes
  /// parameter gradients itself calls it once per backward().
  GradWrite take_grad_write() noexcept {
    const GradWrite w = grad_write_;
    grad_write_ = GradWrite::add;
    return w;
  }

 private:
  GradWrite grad_write_ = GradWrite::add;
};

/// Total number of parameter elements of a layer.
std::int64_t param_numel(const std::vector<ParamSpec>& specs);

/// One fresh View per spec (label = spec name), zero-filled.
template <class T>
std::vector<Kokkos::View<T*>> allocate_parameters(const Layer<T>& layer);
/// One fresh gradient View (accum_t<T>) per spec, zero-filled.
template <class T>
std::vector<Kokkos::View<accum_t<T>*>> allocate_gradients(const Layer<T>& layer);

/// fill_init of every parameter, keyed by prefix + spec name (see init.hpp);
/// 16-bit T: the f32 initial values rounded (what a bf16/f16 all-gather sends).
template <class T>
void init_parameters(const Layer<T>& layer, const std::vector<Kokkos::View<T*>>& params,
                     std::uint64_t seed, const std::string& prefix = "");

template <class T>
std::vector<Kokkos::View<const T*>> const_views(const std::vector<Kokkos::View<T*>>& v) {
  return std::vector<Kokkos::View<const T*>>(v.begin(), v.end());
}

namespace detail {
// Shared argument checks: throw kshard::Error naming the layer and the View.
template <class T>
void check_forward(const Layer<T>& layer, const Kokkos::View<const T*>& x, const ActShape& shape,
                   const std::vector<Kokkos::View<const T*>>& params, const Kokkos::View<T*>& y);
template <class T>
void check_backward(const Layer<T>& layer, bool have_forward, const ActShape& shape,
                    const Kokkos::View<const T*>& dy,
                    const std::vector<Kokkos::View<const T*>>& params,
                    const std::vector<Kokkos::View<accum_t<T>*>>& grads,
                    const Kokkos::View<T*>& dx);
void check_size(const std::string& who, const char* what, std::size_t have, std::int64_t want);
/// One parameter View per spec, each of the spec's size (check_forward does this too).
template <class T>
void check_param_views(const Layer<T>& layer, const std::string& who,
                       const std::vector<Kokkos::View<const T*>>& params);

/// Resizes a workspace to exactly n elements (contents undefined) if its size differs.
template <class T>
void ensure_size(Kokkos::View<T*>& v, std::int64_t n, const char* label) {
  if (static_cast<std::int64_t>(v.extent(0)) != n || v.data() == nullptr)
    v = Kokkos::View<T*>(Kokkos::view_alloc(std::string(label), Kokkos::WithoutInitializing),
                         static_cast<std::size_t>(n));
}

/// A backward workspace of n elements from the buffer pool, given back when
/// it goes out of scope (its kernels are ordered on the one stream).
template <class T>
struct Scratch {
  memory::Block block;
  Kokkos::View<T*, Kokkos::MemoryTraits<Kokkos::Unmanaged>> view;
};
template <class T>
Scratch<T> scratch(std::int64_t n, const char* label) {
  Scratch<T> s;
  s.block = memory::acquire(std::size_t(n) * sizeof(T), label);
  s.view = s.block.template view<T>(std::size_t(n));
  return s;
}

// Elementwise helpers shared by the layers (layer.cpp).
/// y[r, c] += b[c]
template <class T>
void add_row_vector(Kokkos::View<T*> y, Kokkos::View<const T*> b, std::int64_t rows,
                    std::int64_t cols);
/// db[c] += sum_r dy[r, c] (U = T or accum_t<T>; db[c] = ... with
/// GradWrite::assign), as a GEMM with a ones vector (kept in `ones`)
/// accumulating in f32 straight into db.
template <class U>
void accumulate_column_sums(Kokkos::View<const U*> dy, std::int64_t rows, std::int64_t cols,
                            Kokkos::View<accum_t<U>*> db, Kokkos::View<U*>& ones,
                            GradWrite write = GradWrite::add);
/// out = a + b (out may be a or b), summed in accum_t<T> and rounded once.
template <class T>
void add(Kokkos::View<const T*> a, Kokkos::View<const T*> b, Kokkos::View<T*> out);
}  // namespace detail

}  // namespace kshard
