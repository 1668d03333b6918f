// The sharded optimizer equals the unsharded one. Each rank holds its slice
// of one global parameter vector per group, in the two layouts FSDP uses:
// "padded" (the flat buffer is padded to chunk x ranks, so the last ranks may
// own only padding zeros) and "uneven" (torch.chunk: the last ranks may own
// nothing, a shard of size 0). Every rank also runs the unsharded optimizer
// on the whole vectors with a communicator of its own, as the reference.
//
// Exactness: the update is elementwise, so without clipping the sharded
// result is bitwise the reference's. With clipping the global sum of squares
// is added in another order (per rank, then across ranks), which can move the
// fp32 gradient scale by an ulp: 1e-6 relative then (a few ulps of fp32).
// Norms: 1e-12 relative to the exact double norm of the global gradient.
#include <kshard/testing/harness.hpp>

#include <boost/test/data/monomorphic.hpp>
#include <boost/test/data/test_case.hpp>

#include <algorithm>
#include <sstream>

#include <kshard/mesh/device_mesh.hpp>
#include <kshard/optim/fused_adam.hpp>
#include <kshard/optim/grad_clip.hpp>

#include "optim_test_util.hpp"

namespace kt = kshard::testing;
namespace bdata = boost::unit_test::data;
using namespace optim_test;

namespace {

struct GroupSpec {
  std::size_t n;  // global elements
  bool padded;    // padded flat buffer, else uneven (torch.chunk)
};

/// This rank's part of a group: real elements [begin, begin + real), then
/// `length - real` padding zeros.
struct Slice {
  std::size_t begin = 0, real = 0, length = 0;
};

Slice slice_of(const GroupSpec& g, int rank, int size) {
  const std::size_t chunk = (g.n + std::size_t(size) - 1) / std::size_t(size);
  Slice s;
  s.begin = std::min(g.n, chunk * std::size_t(rank));
  s.real = std::min(g.n, s.begin + chunk) - s.begin;
  s.length = g.padded ? chunk : s.real;
  return s;
}

struct Config {
  kshard::DType moments;
  int model;  // 0 none, 1 bf16, 2 f16
  bool decoupled;
  float weight_decay;
  float loss_scale;
  bool clip;
  std::string describe() const {
    std::ostringstream s;
    s << "moments=" << kshard::dtype_name(moments)
      << " model=" << (model == 0 ? "none" : model == 1 ? "bf16" : "f16")
      << (decoupled ? " AdamW" : " Adam+L2") << " wd=" << weight_decay
      << " loss_scale=" << loss_scale << (clip ? " clipped" : "");
    return s.str();
  }
};

const std::vector<Config> kConfigs = {
    {kshard::DType::f32, 0, true, 0.01f, 1.f, false},
    {kshard::DType::f32, 0, true, 0.01f, 1.f, true},
    {kshard::DType::bf16, 1, true, 0.1f, 1024.f, true},
    {kshard::DType::f32, 2, false, 0.1f, 1024.f, false},
    {kshard::DType::bf16, 0, false, 0.f, 1.f, true},
};

// Large group in both layouts, then groups that leave the last ranks with
// padding only (padded, n=1), nothing (uneven, n=1), a group empty everywhere,
// and a small uneven one.
const std::vector<GroupSpec> kGroups = {
    {1237, true}, {1, true}, {1, false}, {0, true}, {5, false}, {2001, false}};
// Only tiny groups: with 4 ranks, ranks 2 and 3 own no real element at all
// (padding only, or nothing); in kEmptyGroups all ranks but 0 own nothing.
const std::vector<GroupSpec> kTinyGroups = {{1, true}, {1, false}, {2, true}, {2, false}};
const std::vector<GroupSpec> kEmptyGroups = {{1, false}, {0, true}, {1, false}};

/// Global data of one problem, identical on every rank (same seed).
struct Problem {
  std::vector<GroupSpec> groups;
  std::vector<std::vector<float>> p0;                 // per group
  std::vector<std::vector<std::vector<float>>> grad;  // per step, per group (scaled)
  Problem(const std::vector<GroupSpec>& gs, int steps, float loss_scale, std::uint64_t seed)
      : groups(gs) {
    Data d(seed);
    std::vector<std::vector<double>> scale;
    for (const auto& g : gs) {
      p0.push_back(d.params(g.n));
      scale.push_back(d.scales(g.n));
    }
    for (int s = 0; s < steps; ++s) {
      grad.emplace_back();
      for (std::size_t k = 0; k < gs.size(); ++k) {
        std::vector<float> g;
        for (double x : d.grads(scale[k])) g.push_back(float(x * loss_scale));
        grad.back().push_back(g);
      }
    }
  }
  /// Exact norm of the unscaled global gradient of step s, in double.
  double norm(int s, float loss_scale) const {
    double sum = 0;
    for (const auto& g : grad[std::size_t(s)])
      for (float x : g) {
        const double u = double(x) / loss_scale;
        sum += u * u;
      }
    return std::sqrt(sum);
  }
};

/// One optimizer over its groups' Views (a shard of the problem, or all of it).
struct Side {
  std::vector<Slice> slices;
  std::vector<Vec> master, grad;
  std::vector<Kokkos::View<kshard::bfloat16_t*>> mb;
  std::vector<Kokkos::View<kshard::float16_t*>> mf;
  kshard::FusedAdam opt;

  Side(const Problem& pb, const Config& c, int rank, int size, const kshard::Communicator& shard,
       const kshard::Communicator& world)
      : opt(options(c), shard, world) {
    for (std::size_t k = 0; k < pb.groups.size(); ++k) {
      const Slice s = slice_of(pb.groups[k], rank, size);
      slices.push_back(s);
      std::vector<float> p(s.length, 0.f);
      std::copy_n(pb.p0[k].begin() + std::ptrdiff_t(s.begin), s.real, p.begin());
      master.push_back(to_view(p, "test.master"));
      grad.push_back(Vec("test.grad", s.length));
      mb.emplace_back("test.model_bf16", c.model == 1 ? s.length : 0);
      mf.emplace_back("test.model_f16", c.model == 2 ? s.length : 0);
      kshard::LowPrecisionShard mp;
      if (c.model == 1) mp = mb.back();
      if (c.model == 2) mp = mf.back();
      opt.add_group(master.back(), grad.back(), mp);
    }
  }
  static kshard::AdamOptions options(const Config& c) {
    kshard::AdamOptions o;
    o.moment_dtype = c.moments;
    o.decoupled = c.decoupled;
    o.weight_decay = c.weight_decay;
    return o;
  }
  void load_grads(const Problem& pb, int step) {
    for (std::size_t k = 0; k < slices.size(); ++k) {
      std::vector<float> g(slices[k].length, 0.f);
      std::copy_n(pb.grad[std::size_t(step)][k].begin() + std::ptrdiff_t(slices[k].begin),
                  slices[k].real, g.begin());
      from_host(grad[k], g);
    }
  }
  std::vector<float> moment(std::size_t k, bool second) const {
    const auto& st = opt.state(int(k));
    if (st.moment_dtype == kshard::DType::f32) return to_host(second ? st.exp_avg_sq : st.exp_avg);
    std::vector<float> out;
    for (auto b : to_host(second ? st.exp_avg_sq_bf16 : st.exp_avg_bf16))
      out.push_back(float(decode(b)));
    return out;
  }
  std::vector<std::uint16_t> model_bits(std::size_t k) const {
    std::vector<std::uint16_t> out;
    for (auto b : to_host(mb[k])) out.push_back(b.bits);
    for (auto h : to_host(mf[k])) out.push_back(h.bits);
    return out;
  }
};

bool close(const std::vector<float>& a, const std::vector<float>& b, double rel, std::string& why) {
  if (a.size() != b.size()) {
    why = "sizes " + std::to_string(a.size()) + " vs " + std::to_string(b.size());
    return false;
  }
  for (std::size_t i = 0; i < a.size(); ++i) {
    const bool ok = rel == 0 ? bits(a[i]) == bits(b[i])
                             : std::fabs(double(a[i]) - b[i]) <= rel * std::fabs(double(b[i])) + 1e-30;
    if (!ok) {
      std::ostringstream s;
      s << "element " << i << ": " << a[i] << " vs reference " << b[i];
      why = s.str();
      return false;
    }
  }
  return true;
}

template <class T>
std::vector<T> head(const std::vector<T>& v, std::size_t n) {
  return std::vector<T>(v.begin(), v.begin() + std::ptrdiff_t(std::min(n, v.size())));
}

template <class T>
std::vector<T> part(const std::vector<T>& full, const Slice& s) {
  return std::vector<T>(full.begin() + std::ptrdiff_t(s.begin),
                        full.begin() + std::ptrdiff_t(s.begin + s.real));
}

struct Verdict {
  bool ok = true;
  std::string why;
  void fail(const std::string& w) {
    if (ok) why = w;
    ok = false;
  }
};

/// Compares every group of `sh` (this rank's shards) with the reference `ref`
/// (whole vectors). Padded groups are all-gathered over `shard` first, as FSDP
/// would before the forward; padding must stay exactly zero.
void compare(const Side& sh, const Side& ref, const Problem& pb, const kshard::Communicator& shard,
             double rel, Verdict& v) {
  for (std::size_t k = 0; k < pb.groups.size(); ++k) {
    const Slice& s = sh.slices[k];
    const std::string g = "group " + std::to_string(k) + ": ";
    std::string why;
    const std::vector<float> ref_p = to_host(ref.master[k]);
    if (pb.groups[k].padded) {
      Vec full("test.gathered", s.length * std::size_t(shard.size()));
      shard.all_gather(sh.master[k], full);
      std::vector<float> f = to_host(full);
      const std::vector<float> pad(f.begin() + std::ptrdiff_t(pb.groups[k].n), f.end());
      f.resize(pb.groups[k].n);
      if (!close(f, ref_p, rel, why)) v.fail(g + "gathered master " + why);
      for (float x : pad)
        if (bits(x) != 0) v.fail(g + "padding changed to " + std::to_string(x));
    } else if (!close(head(to_host(sh.master[k]), s.real), part(ref_p, s), rel, why)) {
      v.fail(g + "master " + why);
    }
    // m, v: the real part of the shard against the reference's slice.
    for (bool second : {false, true}) {
      const std::vector<float> a = sh.moment(k, second), b = ref.moment(k, second);
      if (!close(head(a, s.real), part(b, s), rel, why)) v.fail(g + (second ? "v " : "m ") + why);
      for (std::size_t i = s.real; i < a.size(); ++i)
        if (bits(a[i]) != 0) v.fail(g + "moment of padding is nonzero");
    }
    // Model copy: RNE of the master, so equal wherever the masters are equal.
    if (rel == 0) {
      const auto a = sh.model_bits(k), b = ref.model_bits(k);
      if (!a.empty() && head(a, s.real) != part(b, s)) v.fail(g + "model copy differs");
    }
  }
}

/// Runs `steps` sharded steps over `shard` next to the reference and checks
/// results, norms and step counters after every step.
Verdict sharded_matches_reference(const Config& c, const std::vector<GroupSpec>& groups,
                                  const kshard::Communicator& shard, int steps,
                                  std::uint64_t seed) {
  const auto& world = kt::world();
  const kshard::Communicator self = world.split(world.rank(), 0, "self");
  const Problem pb(groups, steps, c.loss_scale, seed);
  Side sh(pb, c, shard.rank(), shard.size(), shard, world);
  Side ref(pb, c, 0, 1, self, self);
  Verdict v;
  for (int s = 0; s < steps; ++s) {
    sh.load_grads(pb, s);
    ref.load_grads(pb, s);
    const double exact = pb.norm(s, c.loss_scale);
    const double max_norm = c.clip ? 0.5 * exact : 0.0;
    const kshard::StepResult a = sh.opt.step(c.loss_scale, max_norm);
    const kshard::StepResult b = ref.opt.step(c.loss_scale, max_norm);
    const std::string at = "step " + std::to_string(s + 1) + ": ";
    if (a.skipped || a.found_nonfinite || a.step != s + 1 || sh.opt.step_count() != s + 1)
      v.fail(at + "sharded step bookkeeping");
    if (std::fabs(a.grad_norm - exact) > 1e-12 * exact)
      v.fail(at + "sharded norm " + std::to_string(a.grad_norm) + " vs exact " + std::to_string(exact));
    if (std::fabs(b.grad_norm - exact) > 1e-12 * exact) v.fail(at + "reference norm");
    if (std::fabs(a.clip_coef - b.clip_coef) > 1e-12) v.fail(at + "clip coefficients differ");
    if (c.clip && !(a.clip_coef < 0.51 && a.clip_coef > 0.49)) v.fail(at + "did not clip");
    compare(sh, ref, pb, shard, c.clip ? 1e-6 : 0.0, v);
  }
  return v;
}

}  // namespace

KSHARD_TEST_SUITE(optim_sharded)

BOOST_DATA_TEST_CASE(fsdp_equals_unsharded, bdata::xrange(kConfigs.size()), i) {
  const Config& c = kConfigs[i];
  const Verdict v = sharded_matches_reference(c, kGroups, kt::world(), 4, 100 + i);
  KSHARD_CHECK_ALL_MSG(v.ok, c.describe() << ": " << v.why);
}

// TransformerEngine #3207: ranks whose shards are empty or padding-only
// silently skipped the update. Here they must still take every step (same
// counter, same collectives, no hang) and the ranks with data must match.
BOOST_DATA_TEST_CASE(ranks_without_real_elements_still_step, bdata::xrange(kConfigs.size()), i) {
  const Config& c = kConfigs[i];
  const Verdict v = sharded_matches_reference(c, kTinyGroups, kt::world(), 3, 200 + i);
  KSHARD_CHECK_ALL_MSG(v.ok, c.describe() << ": " << v.why);
  const Verdict e = sharded_matches_reference(c, kEmptyGroups, kt::world(), 3, 250 + i);
  KSHARD_CHECK_ALL_MSG(e.ok, c.describe() << ", empty shards: " << e.why);
}

BOOST_DATA_TEST_CASE(hsdp_norm_is_not_double_counted, bdata::xrange(kConfigs.size()), i) {
  const auto& world = kt::world();
  KSHARD_SKIP_IF(world.size() % 2 != 0, "HSDP needs an even world, have " << world.size());
  const kshard::DeviceMesh mesh(world, {2, world.size() / 2});
  const Config& c = kConfigs[i];
  // Replicas get the same data (same seed), shards split over the shard dim.
  const Verdict v = sharded_matches_reference(c, kGroups, mesh.shard_comm(), 3, 300 + i);
  KSHARD_CHECK_ALL_MSG(v.ok, c.describe() << " on mesh " << kshard::DeviceMesh::describe(mesh.shape())
                                          << ": " << v.why);
}

// The check above would catch double counting: reducing the same shards over
// the world instead gives sqrt(replicas) x the norm.
BOOST_AUTO_TEST_CASE(world_reduction_would_double_count) {
  const auto& world = kt::world();
  KSHARD_SKIP_IF(world.size() % 2 != 0, "HSDP needs an even world");
  const kshard::DeviceMesh mesh(world, {2, world.size() / 2});
  const Problem pb(kGroups, 1, 1.f, 7);
  std::vector<Vec> grads;
  for (std::size_t k = 0; k < kGroups.size(); ++k) {
    const Slice s = slice_of(kGroups[k], mesh.shard_comm().rank(), mesh.shard_comm().size());
    std::vector<float> g(s.length, 0.f);
    std::copy_n(pb.grad[0][k].begin() + std::ptrdiff_t(s.begin), s.real, g.begin());
    grads.push_back(to_view(g, "test.grad"));
  }
  const double exact = pb.norm(0, 1.f);
  const double over_shard = kshard::grad_norm(grads, mesh.shard_comm());
  const double over_world = kshard::grad_norm(grads, world);
  KSHARD_CHECK_ALL(std::fabs(over_shard - exact) <= 1e-12 * exact);
  KSHARD_CHECK_ALL(std::fabs(over_world - std::sqrt(2.0) * exact) <= 1e-12 * exact);
}

namespace {
/// Puts `bad` into one element of group 0 on world rank `bad_rank` at step 1
/// (of 0, 1, 2), over the given shard communicator; every rank must skip that
/// step with its state untouched, and the run must then continue exactly like
/// a reference that never saw the bad step.
Verdict nonfinite_skips_everywhere(const kshard::Communicator& shard, int bad_rank, float bad) {
  const auto& world = kt::world();
  const kshard::Communicator self = world.split(world.rank(), 0, "self");
  const Config c{kshard::DType::bf16, 1, true, 0.1f, 1024.f, false};
  const Problem pb(kGroups, 3, c.loss_scale, 77);
  Side sh(pb, c, shard.rank(), shard.size(), shard, world);
  Side ref(pb, c, 0, 1, self, self);
  Verdict v;
  // Step 1: good on both.
  sh.load_grads(pb, 0);
  ref.load_grads(pb, 0);
  sh.opt.step(c.loss_scale);
  ref.opt.step(c.loss_scale);
  // Step 2: poisoned on one rank only; the reference does not take it.
  std::vector<std::vector<float>> before_p, before_m, before_v;
  std::vector<std::vector<std::uint16_t>> before_model;
  for (std::size_t k = 0; k < kGroups.size(); ++k) {
    before_p.push_back(to_host(sh.master[k]));
    before_m.push_back(sh.moment(k, false));
    before_v.push_back(sh.moment(k, true));
    before_model.push_back(sh.model_bits(k));
  }
  sh.load_grads(pb, 1);
  if (world.rank() == bad_rank) {
    std::vector<float> g = to_host(sh.grad[0]);
    g[g.size() / 2] = bad;
    from_host(sh.grad[0], g);
  }
  const kshard::StepResult r = sh.opt.step(c.loss_scale, 1.0);
  if (!r.skipped || !r.found_nonfinite) v.fail("step with a bad gradient was not skipped");
  if (r.step != 1 || sh.opt.step_count() != 1) v.fail("step counter moved on a skipped step");
  for (std::size_t k = 0; k < kGroups.size(); ++k) {
    if (!same_bits(to_host(sh.master[k]), before_p[k])) v.fail("master changed on a skipped step");
    if (!same_bits(sh.moment(k, false), before_m[k]) || !same_bits(sh.moment(k, true), before_v[k]))
      v.fail("moments changed on a skipped step");
    if (sh.model_bits(k) != before_model[k]) v.fail("model copy changed on a skipped step");
  }
  // Step 3 on both: the skipped step left no trace.
  sh.load_grads(pb, 2);
  ref.load_grads(pb, 2);
  const kshard::StepResult a = sh.opt.step(c.loss_scale);
  ref.opt.step(c.loss_scale);
  if (a.skipped || a.step != 2) v.fail("step after the skipped one");
  compare(sh, ref, pb, shard, 0.0, v);
  return v;
}
}  // namespace

BOOST_AUTO_TEST_CASE(nonfinite_on_one_rank_skips_every_rank) {
  const auto& world = kt::world();
  for (float bad : {INFINITY, -INFINITY, NAN})
    for (int r = 0; r < world.size(); ++r) {
      const Verdict v = nonfinite_skips_everywhere(world, r, bad);
      KSHARD_CHECK_ALL_MSG(v.ok, bad << " on rank " << r << ": " << v.why);
    }
}

// In HSDP only the world can agree on the flag: a bad value in one replica
// (the replicas' shards differ only then) still stops every replica.
BOOST_AUTO_TEST_CASE(nonfinite_in_one_replica_skips_every_replica) {
  const auto& world = kt::world();
  KSHARD_SKIP_IF(world.size() % 2 != 0, "HSDP needs an even world");
  const kshard::DeviceMesh mesh(world, {2, world.size() / 2});
  for (int r = 0; r < world.size(); ++r) {
    const Verdict v = nonfinite_skips_everywhere(mesh.shard_comm(), r, NAN);
    KSHARD_CHECK_ALL_MSG(v.ok, "NaN on world rank " << r << ": " << v.why);
  }
}

BOOST_AUTO_TEST_CASE(clip_grad_norm_uses_the_exact_global_norm) {
  const auto& world = kt::world();
  for (int dims : {1, 2}) {
    if (dims == 2 && world.size() % 2 != 0) continue;
    const kshard::DeviceMesh mesh(world, dims == 1 ? std::vector<int>{world.size()}
                                                   : std::vector<int>{2, world.size() / 2});
    const auto& shard = mesh.shard_comm();
    const Problem pb(kGroups, 1, 1.f, 11);
    std::vector<Vec> grads;
    std::vector<std::vector<float>> orig;
    for (std::size_t k = 0; k < kGroups.size(); ++k) {
      const Slice s = slice_of(kGroups[k], shard.rank(), shard.size());
      std::vector<float> g(s.length, 0.f);
      std::copy_n(pb.grad[0][k].begin() + std::ptrdiff_t(s.begin), s.real, g.begin());
      orig.push_back(g);
      grads.push_back(to_view(g, "test.grad"));
    }
    const double exact = pb.norm(0, 1.f);
    KSHARD_CHECK_ALL(std::fabs(kshard::grad_norm(grads, shard) - exact) <= 1e-12 * exact);
    // max_norm above the norm: nothing changes.
    const double n1 = kshard::clip_grad_norm(grads, 2 * exact, shard);
    KSHARD_CHECK_ALL(std::fabs(n1 - exact) <= 1e-12 * exact);
    bool same = true;
    for (std::size_t k = 0; k < grads.size(); ++k) same = same && same_bits(to_host(grads[k]), orig[k]);
    KSHARD_CHECK_ALL_MSG(same, "gradients changed although the norm was below max_norm");
    // max_norm below: every element scaled by the one fp32 coefficient.
    const double n2 = kshard::clip_grad_norm(grads, 0.25 * exact, shard);
    KSHARD_CHECK_ALL(std::fabs(n2 - exact) <= 1e-12 * exact);
    const float coef = float(0.25 * exact / (exact + 1e-6));
    bool scaled = true;
    for (std::size_t k = 0; k < grads.size(); ++k) {
      const auto now = to_host(grads[k]);
      for (std::size_t i = 0; i < now.size(); ++i) scaled = scaled && bits(now[i]) == bits(orig[k][i] * coef);
    }
    KSHARD_CHECK_ALL_MSG(scaled, "dims " << dims << ": gradients not scaled by max_norm/(norm+1e-6)");
    const double n3 = kshard::grad_norm(grads, shard);
    KSHARD_CHECK_ALL(std::fabs(n3 - 0.25 * exact) <= 1e-6 * exact);
  }
}

BOOST_AUTO_TEST_CASE(clip_grad_norm_with_nonfinite) {
  const auto& world = kt::world();
  std::vector<float> g = {1.f, 2.f, 3.f};
  if (world.rank() == world.size() - 1) g[1] = NAN;
  std::vector<Vec> grads = {to_view(g, "test.grad"), Vec("test.empty", 0)};
  const double n = kshard::clip_grad_norm(grads, 1.0, world);
  KSHARD_CHECK_ALL(std::isnan(n));
  KSHARD_CHECK_ALL(same_bits(to_host(grads[0]), g));  // left untouched
  KSHARD_CHECK_THROWS_ALL(kshard::clip_grad_norm(grads, 1.0, world, true), kshard::Error);
  KSHARD_CHECK_ALL(kshard::clip_coefficient(INFINITY, 1.0) == 1.0);
  KSHARD_CHECK_ALL(kshard::clip_coefficient(4.0, 0.0) == 1.0);
  KSHARD_CHECK_ALL(kshard::clip_coefficient(4.0, 1.0) == 1.0 / (4.0 + 1e-6));
}

KSHARD_TEST_SUITE_END()
