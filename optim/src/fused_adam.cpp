#include "kshard/optim/fused_adam.hpp"
#include "kshard/compat/kokkos.hpp"

#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <sstream>
#include <string>
#include <type_traits>

#include "grad_kernels.hpp"
#include "kshard/error.hpp"
#include "kshard/engine/fsdp/sharded_group.hpp"
#include "kshard/mesh/agree.hpp"
#include "kshard/numeric/convert.hpp"
#include "kshard/optim/grad_clip.hpp"

namespace kshard {
namespace {

using namespace detail;

/// Marks "no model-parameter copy" in the kernel's template arguments.
struct NoModel {};

/// Everything the update needs besides the data, precomputed on the host so
/// that the kernel has no branches on options: each option is a coefficient.
struct AdamCoefs {
  float gscale;        // (maximize ? -1 : 1) * clip_coef / loss_scale
  float l2;            // weight decay added to the gradient (Adam), else 0
  float decay;         // 1 - lr * wd (AdamW), else 1
  float beta1, one_minus_beta1, beta2, one_minus_beta2;
  float step_size;     // lr / (1 - beta1^t), or lr without bias correction
  float inv_sqrt_bc2;  // 1 / sqrt(1 - beta2^t), or 1
  float eps;
};

// Moments are loaded as float and stored with round-to-nearest-even.
KOKKOS_INLINE_FUNCTION float load(float x) { return x; }
KOKKOS_INLINE_FUNCTION float load(bfloat16_t x) { return to_float(x); }

/// The whole Adam update of one element: new master from the old one, the
/// gradient and the moments (updated in place). Shared by the device kernels.
KOKKOS_INLINE_FUNCTION float adam_element(const AdamCoefs& c, float p0, float grad, float& m,
                                          float& v) {
  const float g = grad * c.gscale + c.l2 * p0;
  m = c.beta1 * m + c.one_minus_beta1 * g;
  v = c.beta2 * v + c.one_minus_beta2 * (g * g);
  const float denom = compat::sqrt(v) * c.inv_sqrt_bc2 + c.eps;
  return p0 * c.decay - c.step_size * (m / denom);
}

// 16-byte and 8-byte vectors for the device kernel's wide loads and stores.
struct alignas(16) Float4 {
  float x[4];
};
struct alignas(8) Half4 {
  std::uint16_t x[4];
};

template <class T>
KOKKOS_INLINE_FUNCTION void load4(const T* p, float (&out)[4]) {
  if constexpr (std::is_same_v<T, float>) {
    const Float4 f = *reinterpret_cast<const Float4*>(p);
    for (int k = 0; k < 4; ++k) out[k] = f.x[k];
  } else {
    const Half4 h = *reinterpret_cast<const Half4*>(p);
    for (int k = 0; k < 4; ++k) out[k] = to_float(T{h.x[k]});
  }
}
template <class T>
KOKKOS_INLINE_FUNCTION void store4(T* p, const float (&in)[4]) {
  if constexpr (std::is_same_v<T, float>) {
    Float4 f;
    for (int k = 0; k < 4; ++k) f.x[k] = in[k];
    *reinterpret_cast<Float4*>(p) = f;
  } else {
    Half4 h;
    for (int k = 0; k < 4; ++k) h.x[k] = from_float<T>(in[k]).bits;
    *reinterpret_cast<Half4*>(p) = h;
  }
}

/// The device kernel, one pass over the shard: reads master, grad, m, v;
/// writes master, m, v (and the model copy) — 28 B per element with fp32
/// moments and no model copy, the minimum for this algorithm. With every
/// pointer aligned (Kokkos allocations are), index q < quads handles
/// elements 4q..4q+3 with 16-byte loads and stores (more bytes in flight per
/// thread: what an HBM GPU needs to approach its copy bandwidth); the few
/// indices after them take the ragged tail, one element each, so the group
/// is still one launch. quads == 0 gives the plain one-element-per-index kernel.
template <class M, class P>
struct AdamUpdate {
  float* master;
  const float* grad;
  M* m;
  M* v;
  P* model;
  std::int64_t quads;
  AdamCoefs c;

  KOKKOS_INLINE_FUNCTION void operator()(const std::int64_t q) const {
    if (q < quads) {
      const std::int64_t i = 4 * q;
      float p[4], g[4], mm[4], vv[4];
      load4(master + i, p);
      load4(grad + i, g);
      load4(m + i, mm);
      load4(v + i, vv);
      for (int k = 0; k < 4; ++k) p[k] = adam_element(c, p[k], g[k], mm[k], vv[k]);
      store4(master + i, p);
      store4(m + i, mm);
      store4(v + i, vv);
      if constexpr (!std::is_same_v<P, NoModel>) store4(model + i, p);
      return;
    }
    const std::int64_t i = 3 * quads + q;  // = 4 * quads + (q - quads)
    float mi = load(m[i]), vi = load(v[i]);
    const float p1 = adam_element(c, master[i], grad[i], mi, vi);
    master[i] = p1;
    m[i] = from_float<M>(mi);
    v[i] = from_float<M>(vi);
    if constexpr (!std::is_same_v<P, NoModel>) model[i] = from_float<P>(p1);
  }
};

inline bool aligned(const void* p, std::size_t bytes) {
  return reinterpret_cast<std::uintptr_t>(p) % bytes == 0;
}

#if defined(__SSE2__) && !defined(__CUDACC__)
#define KSHARD_OPTIM_HOST_SSE 1
// bf16 <-> float, four lanes, bit for bit what to_float / from_float do:
// widening sets the quiet bit of NaNs; narrowing rounds to nearest even, and
// NaNs keep sign and payload with the quiet bit set.
inline __m128 bf16x4_to_float(const bfloat16_t* p) {
  const __m128i h = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
  __m128i u = _mm_unpacklo_epi16(_mm_setzero_si128(), h);  // bits << 16
  const __m128i nan = _mm_cmpgt_epi32(_mm_and_si128(u, _mm_set1_epi32(0x7FFFFFFF)),
                                      _mm_set1_epi32(0x7F800000));
  u = _mm_or_si128(u, _mm_and_si128(nan, _mm_set1_epi32(0x00400000)));
  return _mm_castsi128_ps(u);
}
inline void float_to_bf16x4(bfloat16_t* p, __m128 x) {
  const __m128i u = _mm_castps_si128(x);
  const __m128i nan = _mm_cmpgt_epi32(_mm_and_si128(u, _mm_set1_epi32(0x7FFFFFFF)),
                                      _mm_set1_epi32(0x7F800000));
  const __m128i lsb = _mm_and_si128(_mm_srli_epi32(u, 16), _mm_set1_epi32(1));
  const __m128i rounded = _mm_add_epi32(_mm_add_epi32(u, _mm_set1_epi32(0x7FFF)), lsb);
  const __m128i quiet = _mm_or_si128(u, _mm_set1_epi32(0x00400000));
  __m128i r = _mm_or_si128(_mm_and_si128(nan, quiet), _mm_andnot_si128(nan, rounded));
  // High halves to 16 bits: SSE2 only packs with signed saturation, so shift
  // the range to signed and back.
  r = _mm_sub_epi32(_mm_srli_epi32(r, 16), _mm_set1_epi32(0x8000));
  r = _mm_add_epi16(_mm_packs_epi32(r, r), _mm_set1_epi16(std::int16_t(-0x8000)));
  _mm_storel_epi64(reinterpret_cast<__m128i*>(p), r);
}

// Four elements in an SSE register; fp16 model copies convert lane by lane
// (the same RNE as everywhere).
template <class T>
inline __m128 host_load4(const T* p) {
  if constexpr (std::is_same_v<T, float>) {
    return _mm_loadu_ps(p);
  } else if constexpr (std::is_same_v<T, bfloat16_t>) {
    return bf16x4_to_float(p);
  } else {
    alignas(16) float f[4];
    for (int k = 0; k < 4; ++k) f[k] = to_float(p[k]);
    return _mm_load_ps(f);
  }
}
template <class T>
inline void host_store4(T* p, __m128 x) {
  if constexpr (std::is_same_v<T, float>) {
    _mm_storeu_ps(p, x);
  } else if constexpr (std::is_same_v<T, bfloat16_t>) {
    float_to_bf16x4(p, x);
  } else {
    alignas(16) float f[4];
    _mm_store_ps(f, x);
    for (int k = 0; k < 4; ++k) p[k] = from_float<T>(f[k]);
  }
}
#endif

/// The same update on host execution spaces, one block of kHostBlock
/// elements per index. Without -fno-math-errno (a flag this library does not
/// impose on its users) GCC keeps a libm call per std::sqrt for errno and
/// vectorises nothing around it, which costs ~40% of the memory bandwidth on
/// one core; so on x86 the block is written with SSE2 intrinsics, four
/// elements at a time, with the operations of adam_element in the same
/// order (IEEE single precision, no contraction: what the scalar code
/// computes). Elsewhere, and for the ragged tail, the scalar element.
template <class M, class P>
struct AdamUpdateHost {
  float* master;
  const float* grad;
  M* m;
  M* v;
  P* model;
  std::int64_t n;
  AdamCoefs c;

  void operator()(const std::int64_t b) const {
    const std::int64_t begin = b * kHostBlock;
    const int len = int(n - begin < kHostBlock ? n - begin : kHostBlock);
    float* __restrict p = master + begin;
    const float* __restrict g = grad + begin;
    M* __restrict mm = m + begin;
    M* __restrict vv = v + begin;
    int j = 0;
#if defined(KSHARD_OPTIM_HOST_SSE)
    const __m128 gscale = _mm_set1_ps(c.gscale), l2 = _mm_set1_ps(c.l2),
                 decay = _mm_set1_ps(c.decay), beta1 = _mm_set1_ps(c.beta1),
                 omb1 = _mm_set1_ps(c.one_minus_beta1), beta2 = _mm_set1_ps(c.beta2),
                 omb2 = _mm_set1_ps(c.one_minus_beta2), step = _mm_set1_ps(c.step_size),
                 ibc2 = _mm_set1_ps(c.inv_sqrt_bc2), eps = _mm_set1_ps(c.eps);
    for (; j + 4 <= len; j += 4) {
      const __m128 p0 = _mm_loadu_ps(p + j);
      const __m128 gj = _mm_add_ps(_mm_mul_ps(_mm_loadu_ps(g + j), gscale), _mm_mul_ps(l2, p0));
      const __m128 mi = _mm_add_ps(_mm_mul_ps(beta1, host_load4(mm + j)), _mm_mul_ps(omb1, gj));
      const __m128 vi =
          _mm_add_ps(_mm_mul_ps(beta2, host_load4(vv + j)), _mm_mul_ps(omb2, _mm_mul_ps(gj, gj)));
      host_store4(mm + j, mi);
      host_store4(vv + j, vi);
      const __m128 denom = _mm_add_ps(_mm_mul_ps(_mm_sqrt_ps(vi), ibc2), eps);
      const __m128 p1 = _mm_sub_ps(_mm_mul_ps(p0, decay), _mm_mul_ps(step, _mm_div_ps(mi, denom)));
      _mm_storeu_ps(p + j, p1);
      if constexpr (!std::is_same_v<P, NoModel>) host_store4(model + begin + j, p1);
    }
#endif
    for (; j < len; ++j) {
      float mi = load(mm[j]), vi = load(vv[j]);
      const float p1 = adam_element(c, p[j], g[j], mi, vi);
      p[j] = p1;
      mm[j] = from_float<M>(mi);
      vv[j] = from_float<M>(vi);
      if constexpr (!std::is_same_v<P, NoModel>) model[begin + j] = from_float<P>(p1);
    }
  }
};

template <class M, class P>
void launch_update(const Kokkos::View<float*>& master, const Kokkos::View<float*>& grad,
                   M* m, M* v, P* model, const AdamCoefs& c) {
  const auto n = std::int64_t(master.size());
  if constexpr (is_host_exec_v<ExecSpace>) {
    if (!portable_kernels()) {
      AdamUpdateHost<M, P> k{master.data(), grad.data(), m, v, model, n, c};
      Kokkos::parallel_for("kshard.optim.adam_update", Range(0, host_blocks(n)), k);
      return;
    }
  }
  const std::size_t wide = sizeof(M) == 4 ? 16 : 8;
  bool vec = aligned(master.data(), 16) && aligned(grad.data(), 16) && aligned(m, wide) &&
             aligned(v, wide);
  if constexpr (!std::is_same_v<P, NoModel>) vec = vec && aligned(model, 8);
  const std::int64_t quads = vec ? n / 4 : 0;
  AdamUpdate<M, P> k{master.data(), grad.data(), m, v, model, quads, c};
  Kokkos::parallel_for("kshard.optim.adam_update", Range(0, n - 3 * quads), k);
}

template <class M>
void launch_update(const Kokkos::View<float*>& master, const Kokkos::View<float*>& grad,
                   M* m, M* v, const LowPrecisionShard& model, const AdamCoefs& c) {
  if (!model.present())
    launch_update<M, NoModel>(master, grad, m, v, nullptr, c);
  else if (model.dtype() == DType::bf16)
    launch_update<M, bfloat16_t>(master, grad, m, v, model.bf16().data(), c);
  else
    launch_update<M, float16_t>(master, grad, m, v, model.f16().data(), c);
}

/// Every rank learns whether some rank found a bad argument (agree_ok: that
/// rank throws its own message, the others the same one), so no rank is left
/// waiting in a later collective. `extra` values ride along (reduced with
/// max) and come back in place.
void agree(const Communicator& world, const std::string& local_problem,
           const std::string& expected, const char* who, std::vector<double>& extra) {
  std::optional<Error> err;
  if (!local_problem.empty()) err = Error(std::string(who) + ": " + local_problem, expected);
  agree_ok(world, err, extra);
}

std::string check_options(const AdamOptions& o) {
  std::ostringstream bad;
  auto finite = [](float x) { return std::isfinite(x); };
  if (!finite(o.lr) || o.lr < 0) bad << "lr = " << o.lr << "; ";
  if (!finite(o.beta1) || o.beta1 < 0 || o.beta1 >= 1) bad << "beta1 = " << o.beta1 << "; ";
  if (!finite(o.beta2) || o.beta2 < 0 || o.beta2 >= 1) bad << "beta2 = " << o.beta2 << "; ";
  if (!finite(o.eps) || o.eps < 0) bad << "eps = " << o.eps << "; ";
  if (!finite(o.weight_decay) || o.weight_decay < 0)
    bad << "weight_decay = " << o.weight_decay << "; ";
  if (o.moment_dtype != DType::f32 && o.moment_dtype != DType::bf16)
    bad << "moment_dtype = " << dtype_name(o.moment_dtype) << "; ";
  std::string s = bad.str();
  if (!s.empty()) s.resize(s.size() - 2);
  return s;
}

/// 52-bit FNV-1a of the options (exact as a double), so ranks can compare them.
double fingerprint(const AdamOptions& o) {
  std::uint64_t h = 1469598103934665603ull;
  auto mix = [&h](const void* p, std::size_t n) {
    const auto* b = static_cast<const unsigned char*>(p);
    for (std::size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 1099511628211ull;
  };
  for (float f : {o.lr, o.beta1, o.beta2, o.eps, o.weight_decay}) mix(&f, sizeof f);
  for (bool b : {o.decoupled, o.bias_correction, o.maximize}) mix(&b, sizeof b);
  mix(&o.moment_dtype, sizeof o.moment_dtype);
  return double(h & ((std::uint64_t(1) << 52) - 1));
}

}  // namespace

double GradStats::norm() const { return std::sqrt(sum_squares); }

// ---------------------------------------------------------------- FusedAdam

FusedAdam::FusedAdam(AdamOptions options, Communicator shard_comm, Communicator world)
    : options_(options), shard_comm_(std::move(shard_comm)), world_(std::move(world)) {
  if (!world_.valid() || !shard_comm_.valid())
    throw Error("FusedAdam: a null communicator", "the shard and world communicators of a mesh");
  std::string problem = check_options(options_);
  if (problem.empty() && (shard_comm_.size() > world_.size() ||
                          world_.size() % shard_comm_.size() != 0)) {
    problem = "shard communicator of " + std::to_string(shard_comm_.size()) +
              " ranks in a world of " + std::to_string(world_.size());
  }
  const double h = fingerprint(options_);
  std::vector<double> extra = {h, -h};
  agree(world_, problem,
        "lr >= 0, 0 <= beta1, beta2 < 1, eps >= 0, weight_decay >= 0, moment_dtype f32 or bf16, "
        "and a shard communicator whose size divides the world's",
        "FusedAdam", extra);
  if (extra[0] != -extra[1])
    throw Error("FusedAdam: ranks of " + world_.name() + " were given different AdamOptions",
                "the same options on every rank");
}

int FusedAdam::add_group(const ShardedGroup& group) {
  return add_group(group.master(), group.grad(), group.low_precision_shard());
}

int FusedAdam::add_group(Kokkos::View<float*> master, Kokkos::View<float*> grad,
                         LowPrecisionShard model) {
  const int g = int(groups_.size());
  std::ostringstream bad;
  const std::size_t n = master.size();
  if (grad.size() != n)
    bad << "master has " << n << " elements but grad has " << grad.size() << "; ";
  if (n > 0 && master.data() == grad.data()) bad << "master and grad are the same memory; ";
  if (model.present() && model.count() != n)
    bad << "model-parameter copy has " << model.count() << " elements for " << n
        << " master elements; ";
  std::string problem = bad.str();
  if (!problem.empty()) problem = "group " + std::to_string(g) + ": " + problem.substr(0, problem.size() - 2);
  std::vector<double> none;
  agree(world_, problem,
        "master and grad of equal size, distinct memory, and a bf16/f16 model copy of that size "
        "(or none)",
        "FusedAdam::add_group", none);

  Group grp{std::move(master), std::move(grad), std::move(model), {}};
  grp.state.moment_dtype = options_.moment_dtype;
  const std::string tag = "[" + std::to_string(g) + "]";
  if (options_.moment_dtype == DType::f32) {
    grp.state.exp_avg = Kokkos::View<float*>("kshard.optim.exp_avg" + tag, n);
    grp.state.exp_avg_sq = Kokkos::View<float*>("kshard.optim.exp_avg_sq" + tag, n);
  } else {
    grp.state.exp_avg_bf16 = Kokkos::View<bfloat16_t*>("kshard.optim.exp_avg" + tag, n);
    grp.state.exp_avg_sq_bf16 = Kokkos::View<bfloat16_t*>("kshard.optim.exp_avg_sq" + tag, n);
  }
  groups_.push_back(std::move(grp));
  if (device_stats() && partials_.size() == 0)
    partials_ = Kokkos::View<double*>(
        Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string("kshard.optim.grad_stats")),
        2 * stat_slots());
  return g;
}

GradStats FusedAdam::grad_stats(float loss_scale) { return collect_stats(loss_scale, 0.0); }

GradStats FusedAdam::collect_stats(float loss_scale, double max_grad_norm) {
  // 1. One reduction kernel per non-empty group, then one small kernel that
  // totals them (devices wait only there).
  GradStatsBatch batch(partials_);
  for (const Group& grp : groups_) batch.add(grp.grad);
  double local[2];
  batch.finish(local);
  return agree_stats(local[0], local[1], loss_scale, max_grad_norm);
}

GradStats FusedAdam::combine_stats(double local_sum_squares, bool local_nonfinite,
                                   float loss_scale) {
  return agree_stats(local_sum_squares, local_nonfinite ? 1.0 : 0.0, loss_scale, 0.0);
}

GradStats FusedAdam::agree_stats(double sum, double nonfinite, float loss_scale,
                                 double max_grad_norm) {
  // Bad arguments are agreed on in the flag's collective below: no extra message.
  std::string problem;
  if (!(std::isfinite(loss_scale) && loss_scale > 0))
    problem = "loss_scale = " + std::to_string(loss_scale) + " ";
  if (!(max_grad_norm >= 0) || !std::isfinite(max_grad_norm))
    problem += "max_grad_norm = " + std::to_string(max_grad_norm);
  const double ng = double(groups_.size());

  // 2. The non-finite flag over the world (every rank must skip together),
  // with the group count and the loss-scale check riding along; then the sum
  // of squares over the shard group only.
  std::vector<double> extra = {nonfinite, ng, -ng};
  agree(world_, problem, "a finite loss_scale > 0 and max_grad_norm >= 0 (0: no clipping)",
        "FusedAdam::step", extra);
  if (extra[1] != -extra[2])
    throw Error("FusedAdam::grad_stats: ranks hold between " + std::to_string(-extra[2]) +
                    " and " + std::to_string(extra[1]) + " parameter groups (this rank: " +
                    std::to_string(groups_.size()) + ")",
                "the same number of groups on every rank (add_group is collective)");
  std::vector<double> sums = {sum};
  host_all_reduce(shard_comm_, sums, ReduceOp::sum);
  sum = sums[0];

  GradStats s;
  const double inv = 1.0 / double(loss_scale);
  s.sum_squares = sum * inv * inv;
  s.found_nonfinite = extra[0] > 0;
  return s;
}

StepResult FusedAdam::apply(const GradStats& stats, float loss_scale, double max_grad_norm) {
  if (!(std::isfinite(loss_scale) && loss_scale > 0))
    throw Error("FusedAdam::apply: loss_scale = " + std::to_string(loss_scale),
                "a finite loss_scale > 0");
  if (!(max_grad_norm >= 0) || !std::isfinite(max_grad_norm))
    throw Error("FusedAdam::apply: max_grad_norm = " + std::to_string(max_grad_norm),
                "max_grad_norm >= 0 (0: no clipping)");
  StepResult r;
  r.grad_norm = stats.norm();
  r.found_nonfinite = stats.found_nonfinite || !std::isfinite(r.grad_norm);
  if (r.found_nonfinite) {
    // The finite part's norm would read like a real one (a log showing 0 or
    // a modest number while the run diverges): say NaN.
    r.grad_norm = std::numeric_limits<double>::quiet_NaN();
    r.skipped = true;
    r.step = step_;
    return r;
  }
  r.clip_coef = clip_coefficient(r.grad_norm, max_grad_norm);

  const AdamOptions& o = options_;
  const std::int64_t t = step_ + 1;
  const double b1 = o.beta1, b2 = o.beta2;
  const double bc1 = o.bias_correction ? 1.0 - std::pow(b1, double(t)) : 1.0;
  const double bc2 = o.bias_correction ? 1.0 - std::pow(b2, double(t)) : 1.0;
  AdamCoefs c;
  c.gscale = float((o.maximize ? -1.0 : 1.0) * r.clip_coef / double(loss_scale));
  c.l2 = o.decoupled ? 0.f : o.weight_decay;
  c.decay = o.decoupled ? float(1.0 - double(o.lr) * double(o.weight_decay)) : 1.f;
  c.beta1 = o.beta1;
  c.one_minus_beta1 = 1.f - o.beta1;
  c.beta2 = o.beta2;
  c.one_minus_beta2 = 1.f - o.beta2;
  c.step_size = float(double(o.lr) / bc1);
  c.inv_sqrt_bc2 = float(1.0 / std::sqrt(bc2));
  c.eps = o.eps;

  // 3. One update kernel per non-empty group. Empty groups have nothing to
  // update, but the step still counts on this rank like on every other.
  for (const Group& grp : groups_) {
    if (grp.master.size() == 0) continue;
    if (o.moment_dtype == DType::f32)
      launch_update<float>(grp.master, grp.grad, grp.state.exp_avg.data(),
                           grp.state.exp_avg_sq.data(), grp.model, c);
    else
      launch_update<bfloat16_t>(grp.master, grp.grad, grp.state.exp_avg_bf16.data(),
                                grp.state.exp_avg_sq_bf16.data(), grp.model, c);
  }
  step_ = t;
  r.step = step_;
  return r;
}

StepResult FusedAdam::step(float loss_scale, double max_grad_norm) {
  return apply(collect_stats(loss_scale, max_grad_norm), loss_scale, max_grad_norm);
}

const FusedAdam::Group& FusedAdam::group(int g, const char* who) const {
  if (g < 0 || g >= int(groups_.size()))
    throw Error(std::string(who) + ": group " + std::to_string(g),
                "a group index in [0, " + std::to_string(groups_.size()) + ")");
  return groups_[std::size_t(g)];
}

std::size_t FusedAdam::group_size(int g) const { return group(g, "FusedAdam::group_size").master.size(); }

const AdamGroupState& FusedAdam::state(int g) const { return group(g, "FusedAdam::state").state; }

void FusedAdam::set_step_count(std::int64_t step) {
  if (step < 0)
    throw Error("FusedAdam::set_step_count(" + std::to_string(step) + ")", "a step count >= 0");
  step_ = step;
}

void FusedAdam::set_lr(float lr) {
  if (!std::isfinite(lr) || lr < 0)
    throw Error("FusedAdam::set_lr(" + std::to_string(lr) + ")", "a finite lr >= 0");
  options_.lr = lr;
}

}  // namespace kshard
