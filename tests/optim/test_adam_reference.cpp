// FusedAdam against an independent double-precision Adam/AdamW, one rank,
// for every combination of decoupled x bias_correction x weight_decay (0,
// 0.1) x moment dtype (f32, bf16) x model copy (none, bf16, f16) x loss scale
// (1, 1024) x clipping (off, on): 192 cases, 6 steps each, on seeded random
// data whose gradients span three decades.
//
// Tolerances (RefAdam::step derives them; all compared as |x - ref| <= 2 * bound,
// the factor 2 covering the second-order terms the bound leaves out):
//  - master weights: the a-priori bound accumulated by RefAdam. With fp32
//    moments it is a few 1e-7 relative to |p| plus ~1e-9 absolute per step:
//    the "~1e-6 relative" of fp32. With bf16 moments each stored moment is
//    rounded to 8 significant bits (RNE: relative error <= 2^-8 per store);
//    earlier roundings decay geometrically, so after t steps m and v may be
//    off by t * 2^-8 of m_abs / v_abs, and each update lr*m^/(sqrt(v^)+eps)
//    by ~1.5 t 2^-8 of lr*m_abs^/(sqrt(v^)+eps): after 6 steps a few 1e-5
//    absolute for lr = 1e-3, i.e. ~1e-4 relative to typical |p|.
//  - m, v: t (4u + u_s) m_abs and t (5u + u_s) v_abs, u = 2^-24, u_s the
//    storage roundoff (2^-24 or 2^-8), m_abs / v_abs the m / v recurrences
//    on |g| and g^2 with the L2 term taken in absolute value (no cancellation).
//  - model copy: exactly the round-to-nearest-even of the kernel's own new
//    master (independent rounding model), in both bf16 and fp16.
//  - grad_norm and clip_coef: 1e-12 relative (both sums are in double).
#include <kshard/testing/harness.hpp>

#include <boost/test/data/monomorphic.hpp>
#include <boost/test/data/test_case.hpp>

#include <algorithm>
#include <sstream>

#include <kshard/optim/fused_adam.hpp>

#include "optim_test_util.hpp"

namespace kt = kshard::testing;
namespace bdata = boost::unit_test::data;
using namespace optim_test;

namespace {

struct Case {
  bool decoupled, bias_correction;
  float weight_decay;
  kshard::DType moments;
  int model;  // 0 none, 1 bf16, 2 f16
  float loss_scale;
  bool clip;
  std::string describe() const {
    std::ostringstream s;
    s << (decoupled ? "AdamW" : "Adam+L2") << (bias_correction ? " bias-corrected" : " uncorrected")
      << " wd=" << weight_decay << " moments=" << kshard::dtype_name(moments)
      << " model=" << (model == 0 ? "none" : model == 1 ? "bf16" : "f16")
      << " loss_scale=" << loss_scale << (clip ? " clipped" : " unclipped");
    return s.str();
  }
};

Case make_case(int k) {
  Case c;
  c.decoupled = k & 1;
  c.bias_correction = (k >> 1) & 1;
  c.weight_decay = ((k >> 2) & 1) ? 0.1f : 0.f;
  c.moments = ((k >> 3) & 1) ? kshard::DType::bf16 : kshard::DType::f32;
  c.loss_scale = ((k >> 4) & 1) ? 1024.f : 1.f;
  c.clip = (k >> 5) & 1;
  c.model = (k >> 6) % 3;
  return c;
}
constexpr int kCases = 2 * 2 * 2 * 2 * 2 * 2 * 3;

struct Outcome {
  double worst_p = 0, worst_m = 0, worst_v = 0;  // error / allowed, max over elements and steps
  bool model_exact = true, norms_ok = true, steps_ok = true;
  std::string first_problem;
};

RefOptions ref_options(const kshard::AdamOptions& o) {
  RefOptions r;
  r.lr = o.lr;
  r.beta1 = o.beta1;
  r.beta2 = o.beta2;
  r.eps = o.eps;
  r.weight_decay = o.weight_decay;
  r.decoupled = o.decoupled;
  r.bias_correction = o.bias_correction;
  r.maximize = o.maximize;
  return r;
}

template <class T>
std::vector<double> decode_all(const Kokkos::View<T*>& v) {
  std::vector<double> out;
  for (const T& x : to_host(v)) out.push_back(decode(x));
  return out;
}

/// Runs `steps` steps of FusedAdam and of RefAdam side by side on n params.
/// lr_schedule (optional) sets a new lr before each step, through set_lr.
Outcome run_case(const kshard::AdamOptions& opts, int model, float loss_scale, bool clip,
                 std::size_t n, int steps, std::uint64_t seed,
                 const std::vector<float>& lr_schedule = {}, std::size_t offset = 0) {
  Outcome out;
  Data data(seed);
  const std::vector<float> p0 = data.params(n);
  const std::vector<double> scale = data.scales(n);
  const double u_store = opts.moment_dtype == kshard::DType::bf16 ? std::ldexp(1.0, -8)
                                                                  : std::ldexp(1.0, -24);
  RefAdam ref(ref_options(opts), p0, u_store);

  const auto& world = kt::world();
  kshard::FusedAdam opt(opts, world, world);
  // offset > 0: the Views start `offset` elements into their allocations,
  // so they are not 16-byte aligned (the wide-load kernel must not be used).
  Vec master_mem("test.master", n + offset), grad_mem("test.grad", n + offset);
  Kokkos::View<kshard::bfloat16_t*> bf16_mem("test.model_bf16", model == 1 ? n + offset : 0);
  Kokkos::View<kshard::float16_t*> f16_mem("test.model_f16", model == 2 ? n + offset : 0);
  Vec master(master_mem.data() + offset, n), grad(grad_mem.data() + offset, n);
  from_host(master, p0);
  Kokkos::View<kshard::bfloat16_t*> model_bf16(bf16_mem.data() + (model == 1 ? offset : 0),
                                               model == 1 ? n : 0);
  Kokkos::View<kshard::float16_t*> model_f16(f16_mem.data() + (model == 2 ? offset : 0),
                                             model == 2 ? n : 0);
  kshard::LowPrecisionShard mp;  // unmanaged Views when offset > 0: unaligned copies
  if (model == 1) mp = model_bf16;
  if (model == 2) mp = model_f16;
  const int g = opt.add_group(master, grad, mp);

  for (int s = 0; s < steps; ++s) {
    if (!lr_schedule.empty()) {
      opt.set_lr(lr_schedule[std::size_t(s)]);
      ref.o.lr = lr_schedule[std::size_t(s)];
    }
    // The buffer holds loss_scale x gradient in fp32; the reference gets
    // exactly what the kernel is meant to see after unscaling.
    const std::vector<double> g_raw = data.grads(scale);
    std::vector<float> g_buf(n);
    std::vector<double> g_true(n);
    for (std::size_t i = 0; i < n; ++i) {
      g_buf[i] = float(g_raw[i] * loss_scale);
      g_true[i] = double(g_buf[i]) / double(loss_scale);
    }
    from_host(grad, g_buf);
    const double norm = RefAdam::norm(g_true);
    const double max_norm = clip ? 0.5 * norm : 0.0;  // clipping on: coefficient ~0.5
    const double coef = RefAdam::clip_coef(norm, max_norm);

    const kshard::StepResult r = opt.step(loss_scale, max_norm);
    ref.step(g_true, coef);

    if (r.skipped || r.found_nonfinite || r.step != s + 1 || opt.step_count() != s + 1) {
      out.steps_ok = false;
      if (out.first_problem.empty()) out.first_problem = "step bookkeeping at step " + std::to_string(s + 1);
    }
    if (std::fabs(r.grad_norm - norm) > 1e-12 * norm || std::fabs(r.clip_coef - coef) > 1e-12 * coef) {
      out.norms_ok = false;
      if (out.first_problem.empty())
        out.first_problem = "norm " + std::to_string(r.grad_norm) + " vs " + std::to_string(norm);
    }

    const std::vector<float> p = to_host(master);
    std::vector<double> m, v;
    const auto& st = opt.state(g);
    if (opts.moment_dtype == kshard::DType::f32) {
      for (float x : to_host(st.exp_avg)) m.push_back(x);
      for (float x : to_host(st.exp_avg_sq)) v.push_back(x);
    } else {
      m = decode_all(st.exp_avg_bf16);
      v = decode_all(st.exp_avg_sq_bf16);
    }
    for (std::size_t i = 0; i < n; ++i) {
      const double ep = std::fabs(p[i] - ref.p[i]) / (2 * ref.tol_p[i] + 1e-30);
      const double em = std::fabs(m[i] - ref.m[i]) / (2 * ref.tol_m(i) + 1e-30);
      const double ev = std::fabs(v[i] - ref.v[i]) / (2 * ref.tol_v(i) + 1e-30);
      if (ep > out.worst_p) out.worst_p = ep;
      if (em > out.worst_m) out.worst_m = em;
      if (ev > out.worst_v) out.worst_v = ev;
      if ((ep > 1 || em > 1 || ev > 1) && out.first_problem.empty()) {
        std::ostringstream s2;
        s2 << "step " << s + 1 << " element " << i << ": p " << p[i] << " vs " << ref.p[i]
           << " (bound " << 2 * ref.tol_p[i] << "), m " << m[i] << " vs " << ref.m[i] << ", v "
           << v[i] << " vs " << ref.v[i];
        out.first_problem = s2.str();
      }
    }
    if (model != 0) {
      const std::vector<double> mv = model == 1 ? decode_all(model_bf16) : decode_all(model_f16);
      for (std::size_t i = 0; i < n; ++i) {
        const double want = model == 1 ? round_bf16(p[i]) : round_f16(p[i]);
        if (mv[i] != want) {
          if (out.model_exact && out.first_problem.empty()) {
            std::ostringstream s2;
            s2 << "model copy element " << i << " = " << mv[i] << ", RNE of master " << p[i]
               << " is " << want;
            out.first_problem = s2.str();
          }
          out.model_exact = false;
        }
      }
    }
  }
  return out;
}

kshard::AdamOptions options_for(const Case& c) {
  kshard::AdamOptions o;
  o.decoupled = c.decoupled;
  o.bias_correction = c.bias_correction;
  o.weight_decay = c.weight_decay;
  o.moment_dtype = c.moments;
  return o;
}

#define CHECK_OUTCOME(out, what)                                                           \
  do {                                                                                     \
    KSHARD_CHECK_ALL_MSG(out.steps_ok && out.norms_ok, what << ": " << out.first_problem); \
    KSHARD_CHECK_ALL_MSG(out.worst_p <= 1 && out.worst_m <= 1 && out.worst_v <= 1,         \
                         what << ": error/bound p " << out.worst_p << " m " << out.worst_m \
                              << " v " << out.worst_v << "; " << out.first_problem);       \
    KSHARD_CHECK_ALL_MSG(out.model_exact, what << ": " << out.first_problem);              \
  } while (0)

}  // namespace

// The references are unsharded: one rank (the sharded suite covers more).
KSHARD_SUITE_WORLD_SIZES(1);

KSHARD_TEST_SUITE(optim_reference)

// 1237 elements: more than two of the host kernels' 512-element blocks, with
// a ragged tail, and not a multiple of the SIMD width.
BOOST_DATA_TEST_CASE(matches_double_reference, bdata::xrange(kCases), k) {
  const Case c = make_case(int(k));
  const Outcome out = run_case(options_for(c), c.model, c.loss_scale, c.clip, 1237, 6,
                               1000 + std::uint64_t(k));
  CHECK_OUTCOME(out, c.describe());
}

// The tolerance is not loose: the fp32-moment error stays far below the
// bf16-moment bound, and the bf16 error uses a good part of its own bound
// (if both were tiny, the bf16 bound would not be testing anything).
BOOST_AUTO_TEST_CASE(bounds_are_meaningful) {
  Case c = make_case(0);
  c.decoupled = true;
  c.bias_correction = true;
  c.moments = kshard::DType::bf16;
  const Outcome bf = run_case(options_for(c), 0, 1.f, false, 4096, 6, 7);
  c.moments = kshard::DType::f32;
  const Outcome f32 = run_case(options_for(c), 0, 1.f, false, 4096, 6, 7);
  BOOST_TEST_MESSAGE("worst error/bound: bf16 moments p " << bf.worst_p << " m " << bf.worst_m
                     << " v " << bf.worst_v << "; f32 moments p " << f32.worst_p << " m "
                     << f32.worst_m << " v " << f32.worst_v);
  KSHARD_CHECK_ALL(bf.worst_p <= 1 && f32.worst_p <= 1);
  KSHARD_CHECK_ALL_MSG(bf.worst_m > 0.05, "bf16 m error/bound " << bf.worst_m);
  KSHARD_CHECK_ALL_MSG(bf.worst_p > 1e-3, "bf16 p error/bound " << bf.worst_p);
}

BOOST_AUTO_TEST_CASE(maximize_flips_the_gradient) {
  for (bool decoupled : {true, false}) {
    kshard::AdamOptions o;
    o.maximize = true;
    o.decoupled = decoupled;
    o.weight_decay = 0.1f;
    const Outcome out = run_case(o, 1, 1024.f, true, 700, 4, 42);
    CHECK_OUTCOME(out, "maximize, decoupled=" << decoupled);
  }
}

// Shards that do not start on a 16-byte boundary (a View into the middle of
// a buffer) take the one-element-per-index path of the device kernel; sizes
// 1..7 exercise the tails of the wide path.
BOOST_AUTO_TEST_CASE(misaligned_and_tiny_shards) {
  kshard::AdamOptions o;
  o.weight_decay = 0.1f;
  for (int model : {0, 1, 2})
    for (std::size_t offset : {std::size_t(1), std::size_t(3)}) {
      const Outcome out = run_case(o, model, 1.f, true, 1001, 3, 50 + offset, {}, offset);
      CHECK_OUTCOME(out, "offset " << offset << " model " << model);
    }
  o.moment_dtype = kshard::DType::bf16;
  for (std::size_t n = 1; n <= 7; ++n) {
    const Outcome out = run_case(o, 1, 1024.f, false, n, 3, 60 + n);
    CHECK_OUTCOME(out, "n = " << n);
  }
}

BOOST_AUTO_TEST_CASE(set_lr_takes_effect_next_step) {
  kshard::AdamOptions o;
  o.weight_decay = 0.1f;
  const Outcome out = run_case(o, 0, 1.f, false, 600, 4, 43, {1e-3f, 5e-4f, 0.f, 2e-3f});
  CHECK_OUTCOME(out, "lr schedule");
}

// Nothing lives in the optimizer beyond what state() shows and the step
// counter: restoring them into a fresh optimizer continues identically.
BOOST_AUTO_TEST_CASE(state_round_trip_continues_bitwise) {
  const auto& world = kt::world();
  kshard::AdamOptions o;
  o.moment_dtype = kshard::DType::bf16;
  o.weight_decay = 0.05f;
  Data data(5);
  const std::size_t n = 999;
  const std::vector<float> p0 = data.params(n);
  const std::vector<double> scale = data.scales(n);
  std::vector<std::vector<float>> gs;
  for (int s = 0; s < 4; ++s) {
    std::vector<float> g;
    for (double x : data.grads(scale)) g.push_back(float(x));
    gs.push_back(g);
  }
  Vec ma = to_view(p0, "test.ma"), ga("test.ga", n);
  kshard::FusedAdam a(o, world, world);
  a.add_group(ma, ga);
  for (int s = 0; s < 2; ++s) {
    from_host(ga, gs[std::size_t(s)]);
    a.step();
  }
  // Restore into b: master, m, v, step.
  Vec mb("test.mb", n), gb("test.gb", n);
  Kokkos::deep_copy(mb, ma);
  kshard::FusedAdam b(o, world, world);
  b.add_group(mb, gb);
  Kokkos::deep_copy(b.state(0).exp_avg_bf16, a.state(0).exp_avg_bf16);
  Kokkos::deep_copy(b.state(0).exp_avg_sq_bf16, a.state(0).exp_avg_sq_bf16);
  b.set_step_count(a.step_count());
  for (int s = 2; s < 4; ++s) {
    from_host(ga, gs[std::size_t(s)]);
    from_host(gb, gs[std::size_t(s)]);
    a.step();
    b.step();
  }
  KSHARD_CHECK_ALL(b.step_count() == 4 && a.step_count() == 4);
  KSHARD_CHECK_ALL(same_bits(to_host(ma), to_host(mb)));
}

// The split API (grad_stats + apply) is the same step.
BOOST_AUTO_TEST_CASE(grad_stats_then_apply_equals_step) {
  const auto& world = kt::world();
  kshard::AdamOptions o;
  Data data(9);
  const std::size_t n = 777;
  const std::vector<float> p0 = data.params(n);
  std::vector<float> g;
  for (double x : data.grads(data.scales(n))) g.push_back(float(x * 256));
  Vec m1 = to_view(p0, "test.m1"), g1 = to_view(g, "test.g1");
  Vec m2 = to_view(p0, "test.m2"), g2 = to_view(g, "test.g2");
  kshard::FusedAdam a(o, world, world), b(o, world, world);
  a.add_group(m1, g1);
  b.add_group(m2, g2);
  const auto ra = a.step(256.f, 0.3);
  const kshard::GradStats st = b.grad_stats(256.f);
  const auto rb = b.apply(st, 256.f, 0.3);
  KSHARD_CHECK_ALL(ra.grad_norm == rb.grad_norm && ra.clip_coef == rb.clip_coef);
  KSHARD_CHECK_ALL(ra.clip_coef < 1.0);
  KSHARD_CHECK_ALL(same_bits(to_host(m1), to_host(m2)));
}

KSHARD_TEST_SUITE_END()
