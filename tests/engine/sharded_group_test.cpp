// ShardedGroup: unshard is exactly the unsharded parameters (per recipe),
// reduce-scatter of gradients is exactly the average over the ranks (closed
// form), including uneven sizes where whole ranks own only padding, HSDP, and
// accumulation; and nothing stays allocated after reshard.
#include <kshard_test/gathers.hpp>
#include <kshard/testing/harness.hpp>

#include <boost/test/data/monomorphic.hpp>
#include <boost/test/data/test_case.hpp>

#include <cmath>
#include <limits>

#include <kshard/engine/nn/init.hpp>
#include <kshard/engine/fsdp/sharded_group.hpp>
#include <kshard/core/buffer_pool.hpp>
#include <kshard/core/memory_tracker.hpp>
#include <kshard/numeric/convert.hpp>

namespace kt = kshard::testing;
namespace bdata = boost::unit_test::data;
using kshard::DeviceMesh;
using kshard::ParamSpec;
using kshard::Recipe;
using kshard::ShardedGroup;

namespace {

// A unit with awkward sizes: a scalar, an odd vector and a matrix; at 4 ranks
// the flat buffer (512 elements) leaves ranks whose shard is all padding for
// the "tiny" unit.
std::vector<ParamSpec> specs(bool tiny) {
  if (tiny) return {ParamSpec{"w", {5}, kshard::Init::uniform(1.0)}};
  return {ParamSpec{"scale", {1}, kshard::Init::ones()},
          ParamSpec{"bias", {37}, kshard::Init::normal(0.5)},
          ParamSpec{"weight", {19, 23}, kshard::Init::uniform_fan_in(23)}};
}

// The unsharded reference: fill_init of each full parameter on its own.
std::vector<std::vector<float>> reference(const std::vector<ParamSpec>& sp, std::uint64_t seed,
                                          const std::string& unit) {
  std::vector<std::vector<float>> out;
  for (const auto& s : sp) {
    Kokkos::View<float*> v("ref", s.numel());
    kshard::fill_init<float>(v, s.init, seed, unit + "." + s.name, 0);
    auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), v);
    out.emplace_back(h.data(), h.data() + h.extent(0));
  }
  return out;
}

// Largest |got - want| / bound over the unit; bound per recipe: exact for f32,
// half an ulp of bf16/f16 (RNE), and for fp8 the block-scaled e4m3 rounding,
// at most 2^-4 relative to the block's power-of-two scale times 448.
double worst_error(ShardedGroup& g, const std::vector<std::vector<float>>& ref, const Recipe& r) {
  g.unshard();
  double worst = 0;
  // The compute buffer (f32, bf16 or f16 by recipe) as f32: exact.
  auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), kshard::test::flat_params_f32(g));
  for (std::size_t i = 0; i < ref.size(); ++i) {
    const std::int64_t off = g.index().entry(i).offset;
    for (std::size_t j = 0; j < ref[i].size(); ++j) {
      const double want = ref[i][j], got = h(off + std::int64_t(j));
      double want_q = want;
      double tol = 0;
      if (r.gather_dtype == kshard::DType::bf16)
        want_q = kshard::to_float(kshard::from_float<kshard::bfloat16_t>(float(want)));
      else if (r.gather_dtype == kshard::DType::f16)
        want_q = kshard::to_float(kshard::from_float<kshard::float16_t>(float(want)));
      else if (r.is_fp8())
        tol = std::fabs(want) * std::ldexp(1.0, -4) + 1e-30;  // relative half-ulp of e4m3 (3 bits)
      const double err = std::fabs(got - want_q);
      if (err > tol) worst = std::max(worst, tol > 0 ? err / tol : err + 1);
    }
  }
  g.reshard();
  return worst;
}

const char* kRecipes[] = {"fp32", "bf16", "fp16", "fp8"};

// dst += src (what a layer's accumulating backward does).
void add_into(Kokkos::View<float*> dst, Kokkos::View<const float*> src) {
  Kokkos::parallel_for("test.add", dst.extent(0), KOKKOS_LAMBDA(std::size_t k) { dst(k) += src(k); });
}

}  // namespace

KSHARD_TEST_SUITE(sharded_group)

BOOST_DATA_TEST_CASE(unshard_matches_unsharded_init,
                     bdata::xrange(4) * bdata::xrange(2) * bdata::xrange(2), recipe_i, tiny, hsdp) {
  const int P = kt::world_size();
  KSHARD_SKIP_IF(hsdp && P % 2 != 0, "HSDP needs an even world size");
  const Recipe recipe = Recipe::parse(kRecipes[recipe_i]);
  DeviceMesh mesh(kt::world(), hsdp ? std::vector<int>{2, P / 2} : std::vector<int>{P});
  const auto sp = specs(tiny);
  ShardedGroup g("unit", sp, mesh, recipe);
  g.init_parameters(7);
  const double worst = worst_error(g, reference(sp, 7, "unit"), recipe);
  KSHARD_CHECK_ALL_MSG(worst == 0, recipe.name << ": worst error " << worst);
}

BOOST_AUTO_TEST_CASE(padding_only_ranks_exist_at_four_ranks) {
  const int P = kt::world_size();
  DeviceMesh mesh(kt::world(), {P});
  ShardedGroup g("unit", specs(true), mesh, Recipe::parse("fp32"));
  const auto pieces = g.index().pieces_in_shard(0, mesh.shard_comm().rank());
  // 5 elements, 128-element shards: only rank 0 owns parameter elements.
  KSHARD_CHECK_ALL((mesh.shard_comm().rank() == 0) == !pieces.empty());
  KSHARD_CHECK_ALL(g.index().shard_numel() * P == g.index().flat_numel());
}

// Closed form: rank q adds (j % 11) + q to gradient element j of the flat
// buffer, as a layer's backward accumulates into the unsharded gradients; the
// average over P ranks is (j % 11) + (P - 1) / 2, exact in f32 and f16
// (halves of small integers) for the f32 / f16 reduce dtypes. At one rank
// with an f32 reduction the unsharded gradients are the shard itself, so the
// second pass adds to the first's result there; either way the shard holds
// pass x the average.
BOOST_DATA_TEST_CASE(reduce_scatter_averages_over_all_ranks,
                     bdata::xrange(4) * bdata::xrange(2) * bdata::xrange(2), recipe_i, tiny, hsdp) {
  const int P = kt::world_size();
  KSHARD_SKIP_IF(hsdp && P % 2 != 0, "HSDP needs an even world size");
  const Recipe recipe = Recipe::parse(kRecipes[recipe_i]);
  DeviceMesh mesh(kt::world(), hsdp ? std::vector<int>{2, P / 2} : std::vector<int>{P});
  ShardedGroup g("unit", specs(tiny), mesh, recipe);
  const auto& idx = g.index();
  std::int64_t bad = 0;
  for (int pass = 1; pass <= 2; ++pass) {  // the second pass accumulates
    const auto& grads = g.unsharded_grads();
    for (std::size_t i = 0; i < grads.size(); ++i) {
      auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), grads[i]);
      for (std::int64_t j = 0; j < std::int64_t(h.extent(0)); ++j)
        h(j) += float((idx.entry(i).offset + j) % 11 + kt::world_rank());
      Kokkos::deep_copy(grads[i], h);
    }
    g.reduce_grads();
    KSHARD_CHECK_ALL(g.grad_state() == kshard::GradState::none);
    auto hg = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), g.grad());
    const auto [b, e] = idx.shard_range(g.shard_rank());
    for (std::int64_t k = b; k < e; ++k) {
      bool in_param = false;
      for (const auto& en : idx.entries()) in_param |= k >= en.offset && k < en.offset + en.numel;
      const double want = in_param ? pass * ((k % 11) + (P - 1) / 2.0) : 0.0;
      bad += hg(k - b) != want;
    }
  }
  KSHARD_CHECK_ALL_MSG(bad == 0, recipe.name << ": " << bad << " wrong gradient elements");
  g.zero_grad();
  KSHARD_CHECK_ALL(g.shard_grad() == kshard::ShardGrad::zero_pending);
  g.settle_grad();  // the lazy zero written
  KSHARD_CHECK_ALL(g.shard_grad() == kshard::ShardGrad::current);
  auto hz = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), g.grad());
  double s = 0;
  for (std::size_t k = 0; k < hz.extent(0); ++k) s += std::fabs(hz(k));
  KSHARD_CHECK_ALL(s == 0);
}

// memory::peak_breakdown() (what KSHARD_MEMORY_REPORT prints): the live
// bytes at the last peak by label, digits folded, largest first, summing to
// peak_bytes; checked against the sizes allocated here.
BOOST_AUTO_TEST_CASE(peak_breakdown_names_what_made_the_peak) {
  namespace mem = kshard::memory;
  constexpr std::int64_t MiB = 1 << 20;
  mem::reset_peak();
  {
    Kokkos::View<char*> a("peaktest.0.buf", 3 * MiB), b("peaktest.1.buf", MiB);
    Kokkos::View<char*> c("peaktest_other", 2 * MiB);
  }
  Kokkos::View<char*> later("peaktest.2.buf", 1024);  // after the peak: not part of it
  const auto v = mem::peak_breakdown();
  std::int64_t buf = -1, other = -1, sum = 0;
  std::size_t ibuf = v.size(), iother = v.size();
  for (std::size_t i = 0; i < v.size(); ++i) {
    sum += v[i].second;
    if (v[i].first == "peaktest.*.buf") buf = v[i].second, ibuf = i;
    if (v[i].first == "peaktest_other") other = v[i].second, iother = i;
    if (i > 0) KSHARD_CHECK_ALL(v[i - 1].second >= v[i].second);
  }
  KSHARD_CHECK_ALL_MSG(buf == 4 * MiB && other == 2 * MiB,
                       "peaktest.*.buf " << buf << " B, peaktest_other " << other << " B");
  KSHARD_CHECK_ALL(ibuf < iother);
  KSHARD_CHECK_ALL_MSG(sum == mem::stats().peak_bytes,
                       "breakdown sums to " << sum << ", peak_bytes " << mem::stats().peak_bytes);
  KSHARD_CHECK_ALL(mem::peak_report().find("peaktest.*.buf") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(reshard_frees_the_unsharded_buffers) {
  DeviceMesh mesh(kt::world(), {kt::world_size()});
  for (const char* r : kRecipes) {
    ShardedGroup g("unit", specs(false), mesh, Recipe::parse(r));
    g.init_parameters(1);
    const auto before = kshard::memory::stats().live_bytes;
    g.start_unshard();
    g.finish_unshard();
    const auto during = kshard::memory::stats().live_bytes;
    g.reshard();
    const auto after = kshard::memory::stats().live_bytes;
    // One rank per shard, fp32: the master is the compute buffer (nothing taken).
    const bool in_place = std::string(r) == "fp32" && mesh.shard_size() == 1;
    KSHARD_CHECK_ALL_MSG((during > before) == !in_place && after == before,
                         r << ": live bytes " << before << " -> " << during << " -> " << after);
  }
}

// A shard dimension of 1 (one rank, or a mesh that only replicates): the f32
// master and a kept 16-bit shard already are the full parameters, and an
// unshard hands them out as they are: no pool block, no copy, no cast.
BOOST_AUTO_TEST_CASE(one_rank_per_shard_unshards_in_place) {
  const int P = kt::world_size();
  DeviceMesh mesh(kt::world(), {P, 1});
  const auto in_use = [] { return kshard::memory::pool_stats().in_use_bytes; };

  ShardedGroup f("unit", specs(false), mesh, Recipe::parse("fp32"));
  f.init_parameters(2);
  const auto before = in_use();
  f.unshard();
  KSHARD_CHECK_ALL(f.flat_params<float>().data() == f.master().data());
  KSHARD_CHECK_ALL(in_use() == before && f.unsharded_bytes() == 0);
  f.reshard();

  ShardedGroup kept("unit", specs(false), mesh, Recipe::parse("bf16"), true);
  ShardedGroup cast("unit", specs(false), mesh, Recipe::parse("bf16"));
  kept.init_parameters(2);
  cast.init_parameters(2);
  kept.unshard();
  KSHARD_CHECK_ALL(kept.flat_params<kshard::bfloat16_t>().data() ==
                   kept.low_precision_shard().bf16().data());
  KSHARD_CHECK_ALL(in_use() == before && kept.unsharded_bytes() == 0);
  cast.unshard();  // the master cast into a pool block
  KSHARD_CHECK_ALL(in_use() > before && cast.unsharded_bytes() > 0);
  // Both are the RNE of the same master: the same bits.
  auto hk = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), kshard::test::flat_params_f32(kept));
  auto hc = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), kshard::test::flat_params_f32(cast));
  std::int64_t diff = 0;
  for (std::size_t k = 0; k < hk.extent(0); ++k) diff += hk(k) != hc(k);
  KSHARD_CHECK_ALL(diff == 0);
  kept.reshard();
  cast.reshard();
  KSHARD_CHECK_ALL(in_use() == before);
}

// The group's two states move only along their documented transitions; a
// call out of order is a kshard::Error naming the state (on every rank: all
// ranks make the same calls), and the group stays usable.
BOOST_AUTO_TEST_CASE(states_move_along_checked_transitions) {
  DeviceMesh mesh(kt::world(), {kt::world_size()});
  ShardedGroup g("unit", specs(false), mesh, Recipe::parse("fp32"));
  g.init_parameters(2);
  using kshard::GradState;
  using kshard::ParamState;
  KSHARD_CHECK_ALL(g.param_state() == ParamState::sharded);
  KSHARD_CHECK_THROWS_ALL(g.params<float>(), kshard::Error);
  g.start_unshard();
  KSHARD_CHECK_ALL(g.param_state() == ParamState::gathering);
  KSHARD_CHECK_THROWS_ALL(g.params<float>(), kshard::Error);
  g.start_unshard();  // a no-op while gathering
  g.finish_unshard();
  KSHARD_CHECK_ALL(g.param_state() == ParamState::unsharded);
  KSHARD_CHECK_ALL(g.params<float>().size() == g.index().size());
  g.reshard();
  KSHARD_CHECK_ALL(g.param_state() == ParamState::sharded);
  g.start_unshard();
  g.reshard();  // completes the gather in flight first
  KSHARD_CHECK_ALL(g.param_state() == ParamState::sharded);

  KSHARD_CHECK_ALL(g.grad_state() == GradState::none);
  (void)g.unsharded_grads();
  KSHARD_CHECK_ALL(g.grad_state() == GradState::accumulating);
  g.start_reduce_grads();
  KSHARD_CHECK_ALL(g.grad_state() == GradState::reducing);
  KSHARD_CHECK_THROWS_ALL(g.unsharded_grads(), kshard::Error);
  KSHARD_CHECK_THROWS_ALL(g.zero_grad(), kshard::Error);
  g.finish_reduce_grads();
  KSHARD_CHECK_ALL(g.grad_state() == GradState::none);
  g.zero_grad();
  KSHARD_CHECK_ALL(g.shard_grad() == kshard::ShardGrad::zero_pending);
  // Gradients accumulating unsharded are dropped by zero_grad (FSDP2's).
  const auto& grads = g.unsharded_grads();
  kshard::fill<float>(grads[0], 1.0f);
  g.zero_grad();
  KSHARD_CHECK_ALL(g.grad_state() == GradState::none);
  g.reduce_grads();
  auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), g.grad());
  double s = 0;
  for (std::size_t k = 0; k < h.extent(0); ++k) s += std::fabs(h(k));
  KSHARD_CHECK_ALL_MSG(s == 0, "gradient after zero_grad of accumulated values: |g| = " << s);
  KSHARD_CHECK_ALL(std::string(kshard::state_name(ParamState::gathering)) == "gathering");
}

// GradWrite::assign (the first backward after zero_grad() writes the
// gradients, no zero fill): whatever the gradient memory held before (NaN in
// the shard from the last step, NaN in the pool block the unsharded gradient
// reuses) nothing of it reaches the reduced shard or its statistics; the
// result is bitwise that of zero fill + add. At one rank the shard is the
// gradient (its alignment gaps stay zero from allocation); at 2 and 4 ranks,
// and with a replica dimension, the unsharded buffer is a pool block whose
// gaps and padding the group zeroes. Assign over gradients that hold values
// is an error.
BOOST_DATA_TEST_CASE(assigned_gradients_keep_nothing_of_the_old_values,
                     bdata::xrange(2) * bdata::xrange(2), recipe_i, hsdp) {
  const int P = kt::world_size();
  KSHARD_SKIP_IF(hsdp && P % 2 != 0, "HSDP needs an even world size");
  const Recipe recipe = Recipe::parse(kRecipes[recipe_i]);  // fp32, bf16
  DeviceMesh mesh(kt::world(), hsdp ? std::vector<int>{2, P / 2} : std::vector<int>{P});
  const auto sp = specs(false);
  ShardedGroup added("unit", sp, mesh, recipe), assigned("unit", sp, mesh, recipe);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  // Each parameter's gradient contribution: deterministic, the same on every rank.
  const auto contribution = [&](std::size_t i) {
    Kokkos::View<float*> v("contribution", std::size_t(sp[i].numel()));
    kshard::fill_init<float>(v, kshard::Init::normal(1.0), 5, "grad." + sp[i].name, 0);
    return v;
  };
  // A step of NaN gradients in `assigned`: its shard holds NaN afterwards.
  for (const auto& v : assigned.unsharded_grads()) kshard::fill<float>(v, nan);
  assigned.reduce_grads();
  // A pool block of the unsharded gradient's size full of NaN, given back:
  // the next acquire of that size reuses it.
  {
    const std::size_t bytes = 4 * std::size_t(assigned.index().flat_numel());
    kshard::memory::Block b = kshard::memory::acquire(bytes, "test.poison");
    kshard::fill<float>(b.view<float>(bytes / 4), nan);
  }
  added.zero_grad();
  assigned.zero_grad();
  KSHARD_CHECK_ALL(assigned.grads_unwritten());
  {
    const auto& ga = added.unsharded_grads();
    for (std::size_t i = 0; i < ga.size(); ++i) {
      const Kokkos::View<float*> dst = ga[i];
      const Kokkos::View<const float*> src = contribution(i);
      add_into(dst, src);
    }
    const auto& gb = assigned.unsharded_grads(kshard::GradWrite::assign);
    for (std::size_t i = 0; i < gb.size(); ++i) Kokkos::deep_copy(gb[i], contribution(i));
  }
  KSHARD_CHECK_ALL(!assigned.grads_unwritten());
  KSHARD_CHECK_THROWS_ALL(assigned.unsharded_grads(kshard::GradWrite::assign), kshard::Error);
  added.reduce_grads();
  assigned.reduce_grads();
  const auto sa = added.grad_stats(), sb = assigned.grad_stats();
  KSHARD_CHECK_ALL_MSG(sb.nonfinite == 0 && sb.sum_squares == sa.sum_squares,
                       recipe.name << ": assigned stats " << sb.sum_squares << " (" << sb.nonfinite
                                   << " inf/NaN) vs added " << sa.sum_squares);
  auto ha = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), added.grad());
  auto hb = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), assigned.grad());
  std::int64_t diff = 0;
  for (std::size_t k = 0; k < ha.extent(0); ++k) diff += !(ha(k) == hb(k));
  KSHARD_CHECK_ALL_MSG(diff == 0, recipe.name << ": " << diff << " shard elements differ");
}

BOOST_AUTO_TEST_CASE(fp8_gather_moves_one_byte_per_parameter_plus_scales) {
  DeviceMesh mesh(kt::world(), {kt::world_size()});
  ShardedGroup g("unit", specs(false), mesh, Recipe::parse("fp8"));
  g.init_parameters(3);
  g.unshard();
  const auto t = kt::world().trace();  // the mesh's shard comm is a split of the world
  (void)t;
  const auto& sc = mesh.shard_comm();
  const auto last = sc.trace().back();
  const std::size_t shard = std::size_t(g.index().shard_numel());
  KSHARD_CHECK_ALL(std::string(last.op) == "all_gather" &&
                   last.bytes == shard + 4 * (shard / 128) && std::string(last.dtype) == "u8");
  g.reshard();
}

BOOST_AUTO_TEST_CASE(fp8_init_stores_the_shard_in_fp8) {
  DeviceMesh mesh(kt::world(), {kt::world_size()});
  ShardedGroup a("unit", specs(false), mesh, Recipe::parse("fp8"));
  ShardedGroup b("unit", specs(false), mesh, Recipe::parse("fp8", true));
  a.init_parameters(5);
  b.init_parameters(5);
  KSHARD_CHECK_ALL(b.persistent_bytes() > a.persistent_bytes());  // + fp8 shard and scales
  a.unshard();
  b.unshard();
  auto ha = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), kshard::test::flat_params_f32(a));
  auto hb = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), kshard::test::flat_params_f32(b));
  std::int64_t diff = 0;
  for (std::size_t k = 0; k < ha.extent(0); ++k) diff += ha(k) != hb(k);
  KSHARD_CHECK_ALL(diff == 0);  // same master values quantize to the same bytes
  a.reshard();
  b.reshard();
  KSHARD_CHECK_THROWS_ALL(Recipe::parse("bf16", true), kshard::Error);
  KSHARD_CHECK_THROWS_ALL(Recipe::parse("int4"), kshard::Error);
}

KSHARD_TEST_SUITE_END()
