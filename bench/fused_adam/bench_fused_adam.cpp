// kshard-bench-fused-adam: is FusedAdam memory-bound?
//
//   kshard-bench-fused-adam [--params N|2^K] [--reps R] [--warmup W] [--moments f32|bf16]
//                           [--offset K]
//
// In one run, on the default execution space, interleaving the two so that
// they see the same machine: (1) Kokkos::deep_copy of a buffer of 14 B/param
// (read + write = 28 B/param, the traffic of one Adam step with fp32 state);
// (2) FusedAdam::step() with fp32 master, grad and moments on a single group
// of N params, no model copy. Adam bytes are counted as 28 B/param: master,
// grad, m, v read; master, m, v written. step() also runs the gradient
// statistics pass (one more read of grad: 4 B/param) and two tiny
// all_reduces; the update kernel alone (apply()) and the statistics pass
// alone are timed too, so the figures can be read either way.
// --offset K starts master and grad K floats into their allocations (K not a
// multiple of 4: unaligned, so the device kernel cannot use 16-byte loads).
// Each figure is the median of R timed repetitions after W warm-ups, with a
// fence before and after each one. Run it as a single process (no mpiexec).
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <Kokkos_Core.hpp>

#include <kshard/mesh/session.hpp>
#include <kshard/optim/fused_adam.hpp>

namespace {

using Clock = std::chrono::steady_clock;

std::int64_t parse_count(const std::string& s) {
  const auto caret = s.find('^');
  if (caret != std::string::npos)
    return std::int64_t(1) << std::stoi(s.substr(caret + 1));  // "2^26"
  return std::stoll(s);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/// Deterministic pseudo-random fill in [-scale, scale] (no host round trip).
struct Fill {
  Kokkos::View<float*> x;
  std::uint32_t seed;
  float scale;
  KOKKOS_INLINE_FUNCTION void operator()(const std::int64_t i) const {
    std::uint32_t h = std::uint32_t(i) * 2654435761u ^ seed;
    h ^= h >> 16;
    h *= 2246822519u;
    h ^= h >> 13;
    x(i) = scale * (float(h >> 8) * (2.0f / 16777216.0f) - 1.0f);
  }
};

void fill(const Kokkos::View<float*>& x, std::uint32_t seed, float scale) {
  Kokkos::parallel_for("bench.fill",
                       Kokkos::RangePolicy<Kokkos::IndexType<std::int64_t>>(0, std::int64_t(x.size())),
                       Fill{x, seed, scale});
}

template <class F>
double time_once(F&& f) {
  Kokkos::fence();
  const auto t0 = Clock::now();
  f();
  Kokkos::fence();
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  kshard::Session session(argc, argv);
#if defined(KOKKOS_ENABLE_CUDA)
  std::int64_t n = std::int64_t(1) << 28;
#else
  std::int64_t n = std::int64_t(1) << 26;
#endif
  int reps = 10, warmup = 2;
  std::int64_t offset = 0;
  std::string moments = "f32";
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--params") n = parse_count(next());
    else if (a == "--reps") reps = std::stoi(next());
    else if (a == "--warmup") warmup = std::stoi(next());
    else if (a == "--moments") moments = next();
    else if (a == "--offset") offset = std::stoll(next());
    else {
      std::fprintf(stderr,
                   "usage: %s [--params N|2^K] [--reps R] [--warmup W] [--moments f32|bf16] "
                   "[--offset K]\n",
                   argv[0]);
      return 2;
    }
  }
  if (n < 2 || reps < 1 || warmup < 0 || offset < 0) {
    std::fprintf(stderr, "need --params >= 2, --reps >= 1, --warmup >= 0, --offset >= 0\n");
    return 2;
  }
  const kshard::Communicator& world = session.world();
  const double adam_bytes = 28.0 * double(n);
  const std::int64_t copy_floats = n / 2 * 7;  // 14 B/param: read + write = 28 B/param
  const double copy_bytes = 2.0 * 4.0 * double(copy_floats);

  {
    Kokkos::View<float*> src(Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string("bench.src")), copy_floats);
    Kokkos::View<float*> dst(Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string("bench.dst")), copy_floats);
    Kokkos::View<float*> master_mem(Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string("bench.master")), n + offset);
    Kokkos::View<float*> grad_mem(Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string("bench.grad")), n + offset);
    Kokkos::View<float*> master(master_mem.data() + offset, n), grad(grad_mem.data() + offset, n);
    fill(src, 1, 1.0f);
    fill(dst, 2, 1.0f);
    fill(master, 3, 1.0f);
    fill(grad, 4, 1e-2f);

    kshard::AdamOptions o;
    o.weight_decay = 0.01f;
    o.moment_dtype = kshard::parse_dtype(moments);
    kshard::FusedAdam opt(o, world, world);
    opt.add_group(master, grad);

    std::vector<double> t_copy, t_step, t_stats, t_apply, t_fused;
    kshard::GradStats stats;
    for (int r = 0; r < warmup + reps; ++r) {
      const double tc = time_once([&] { Kokkos::deep_copy(dst, src); });
      const double ts = time_once([&] { opt.step(); });
      const double tg = time_once([&] { stats = opt.grad_stats(); });
      const double ta = time_once([&] { opt.apply(stats); });
      // The training path: statistics already computed by the kernel that
      // accumulated the reduce-scattered gradient (ShardedGroup), so the step
      // is the cross-rank agreement plus the update.
      const double tf = time_once(
          [&] { opt.apply(opt.combine_stats(stats.sum_squares, stats.found_nonfinite)); });
      if (r >= warmup) {
        t_fused.push_back(tf);
        t_copy.push_back(tc);
        t_step.push_back(ts);
        t_stats.push_back(tg);
        t_apply.push_back(ta);
      }
    }
    const double c = median(t_copy), s = median(t_step), g = median(t_stats), a = median(t_apply),
                 f = median(t_fused);
    const double gb = 1e9;
    const double copy_bw = copy_bytes / c / gb;
    std::printf("kshard-bench-fused-adam: %s, %lld params, moments %s, offset %lld, %d reps (median) "
                "after %d warm-ups\n",
                Kokkos::DefaultExecutionSpace::name(), (long long)n, moments.c_str(),
                (long long)offset, reps, warmup);
    std::printf("  %-34s %9.3f ms  %8.2f GB/s  (%.2f GB read+write)\n", "copy (deep_copy, 14 B/param)",
                c * 1e3, copy_bw, copy_bytes / gb);
    std::printf("  %-34s %9.3f ms  %8.2f GB/s  ratio %.3f  (%.2f GB at 28 B/param)\n",
                "FusedAdam::step()", s * 1e3, adam_bytes / s / gb, adam_bytes / s / gb / copy_bw,
                adam_bytes / gb);
    std::printf("  %-34s %9.3f ms  %8.2f GB/s  ratio %.3f  (actual traffic 32 B/param)\n",
                "  same, counted at 32 B/param", s * 1e3, 32.0 * double(n) / s / gb,
                32.0 * double(n) / s / gb / copy_bw);
    std::printf("  %-34s %9.3f ms  %8.2f GB/s  ratio %.3f\n", "  update kernel alone (apply)",
                a * 1e3, adam_bytes / a / gb, adam_bytes / a / gb / copy_bw);
    std::printf("  %-34s %9.3f ms  %8.2f GB/s  (4 B/param read)\n", "  grad statistics alone",
                g * 1e3, 4.0 * double(n) / g / gb);
    std::printf("  %-34s %9.3f ms  %8.2f GB/s  ratio %.3f  (statistics from the producer)\n",
                "combine_stats + apply (train path)", f * 1e3, adam_bytes / f / gb,
                adam_bytes / f / gb / copy_bw);
    std::printf("adam_over_copy %.3f\n", adam_bytes / s / gb / copy_bw);
    std::printf("train_path_over_copy %.3f\n", adam_bytes / f / gb / copy_bw);
  }
  return 0;
}
