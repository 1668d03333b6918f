// kshard-bench-fp8-linear: where the time of an fp8 Linear goes, beside the
// bf16 Linear it replaces, at a model's four Linear shapes (qkv, proj, fc1 with
// GELU, fc2), on the default execution space.
//
//   kshard-bench-fp8-linear [--width D] [--rows R] [--reps N] [--warmup W]
//
// Default: the large model of docs/BENCHMARKS.md (d 2048, rows 4096 = B4 x
// T1024); --width 4096 is xl. Per shape, medians of N repetitions (fenced):
//   bf16 / fp8-current / fp8-delayed / fp8-block: Linear forward + backward (the
//     layer as a model runs it; delayed after one history update, so calibrated);
//   the pieces of the fp8 path: amax of x, cast of x, cast of W, cast of dy
//     (row-major + transposed; "blk dy": fp8-block's 1x128 cast of dy, both
//     copies), the fp8 forward GEMM and the bf16 one;
//   copy: a device copy of x's bytes (the bandwidth anchor for the casts,
//     which move 3 bytes per element (4 for dy) against the copy's 4);
//   queued: fp8-delayed forward + backward N times with no fence between,
//     per repetition: where it is well below the fenced figure the host's
//     launches, not the device, set the fenced time.
// On the GPU build (H200): build/cuda/bench/fp8/kshard-bench-fp8-linear.
// On the host: small sizes only (--width 256 --rows 256 --reps 2).
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <Kokkos_Core.hpp>
#include <Kokkos_Random.hpp>

#include <kshard/kernels/fp8_blockwise.hpp>
#include <kshard/kernels/fp8_gemm.hpp>
#include <kshard/kernels/fp8_tensor.hpp>
#include <kshard/kernels/gemm.hpp>
#include <kshard/engine/nn/linear.hpp>
#include <kshard/mesh/session.hpp>

namespace {

using Clock = std::chrono::steady_clock;
using bf16 = kshard::bfloat16_t;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/// Median wall time of f in ms over reps runs (fenced), after warmup runs.
template <class F>
double time_ms(int warmup, int reps, F&& f) {
  for (int i = 0; i < warmup; ++i) f();
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    Kokkos::fence();
    const auto t0 = Clock::now();
    f();
    Kokkos::fence();
    t.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
  }
  return median(t);
}

Kokkos::View<bf16*> random_bf16(std::int64_t n, double scale, std::uint64_t seed) {
  Kokkos::View<float*> f("f", n);
  Kokkos::Random_XorShift64_Pool<> pool(seed);
  Kokkos::fill_random(f, pool, -scale, scale);
  Kokkos::View<bf16*> x("x", n);
  Kokkos::parallel_for(
      "round", Kokkos::RangePolicy<>(0, n),
      KOKKOS_LAMBDA(const std::int64_t i) { x(i) = kshard::from_accum<bf16>(f(i)); });
  return x;
}

struct Shape {
  const char* name;
  std::int64_t in, out;
  bool gelu;
};

struct LinearRun {
  kshard::Linear<bf16> layer;
  kshard::Layer<bf16>::ConstViews params;
  kshard::Layer<bf16>::GradViews grads;
  Kokkos::View<bf16*> y, pre, dx;
  kshard::ActShape shape;
  bool gelu;

  LinearRun(const Shape& s, std::int64_t rows, Kokkos::View<bf16*> w, Kokkos::View<bf16*> b)
      : layer(s.in, s.out, true), gelu(s.gelu) {
    params = {w, b};
    grads = {Kokkos::View<float*>("dw", s.out * s.in), Kokkos::View<float*>("db", s.out)};
    y = Kokkos::View<bf16*>("y", rows * s.out);
    pre = Kokkos::View<bf16*>("pre", gelu ? rows * s.out : 0);
    dx = Kokkos::View<bf16*>("dx", rows * s.in);
    shape = {1, rows, s.in};
  }
  void step(Kokkos::View<const bf16*> x, Kokkos::View<const bf16*> dy) {
    if (gelu)
      layer.forward_gelu(x, shape, params, pre, y);
    else
      layer.forward(x, shape, params, y);
    layer.backward(dy, params, grads, dx);
    layer.release();
  }
};

}  // namespace

int main(int argc, char** argv) {
  kshard::Session session(argc, argv);
  std::int64_t d = 2048, rows = 4096;
  int reps = 10, warmup = 3;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 >= argc) {
      std::fprintf(stderr, "usage: kshard-bench-fp8-linear [--width D] [--rows R] [--reps N] [--warmup W]\n");
      return 2;
    }
    const long long v = std::atoll(argv[++i]);
    if (a == "--width") d = v;
    else if (a == "--rows") rows = v;
    else if (a == "--reps") reps = int(v);
    else if (a == "--warmup") warmup = int(v);
    else {
      std::fprintf(stderr, "unknown option %s\n", a.c_str());
      return 2;
    }
  }
  std::string why;
  const bool fp8_ok = kshard::fp8_gemm_available(&why);
#if defined(KOKKOS_ENABLE_CUDA)
  const std::string backend = fp8_ok ? "cuBLASLt" : "unavailable: " + why;
#else
  const std::string backend = "host emulation";
#endif
  std::printf("fp8 GEMM: %s; width %lld, rows %lld, medians of %d\n", backend.c_str(),
              (long long)d, (long long)rows, reps);
  const Shape shapes[] = {{"qkv", d, 3 * d, false},
                          {"proj", d, d, false},
                          {"fc1+gelu", d, 4 * d, true},
                          {"fc2", 4 * d, d, false}};
  std::printf("%-9s %8s %8s %8s %8s %6s | %7s %7s %7s %7s %7s %7s | %7s %7s %7s | %7s\n",
              "shape", "bf16", "fp8-cur", "fp8-del", "fp8-blk", "del/bf", "amax x", "cast x",
              "cast W", "cast dy", "blk dy", "copy x", "gemm8", "gemm16", "8 vs16", "queued");
  double tot[4] = {0, 0, 0, 0};
  for (const Shape& s : shapes) {
    auto x = random_bf16(rows * s.in, 1.0, 1);
    auto dy = random_bf16(rows * s.out, 1e-3, 2);
    auto w = random_bf16(s.out * s.in, 0.02, 3);
    auto b = random_bf16(s.out, 0.02, 4);
    LinearRun plain(s, rows, w, b), cur(s, rows, w, b), del(s, rows, w, b), blk(s, rows, w, b);
    cur.layer.set_fp8_policy({kshard::Fp8Scaling::current});
    blk.layer.set_fp8_policy({kshard::Fp8Scaling::block});
    del.layer.set_fp8_policy({kshard::Fp8Scaling::delayed, 16, kshard::Fp8AmaxAlgo::max});
    std::vector<kshard::Fp8Scale*> scales;
    del.layer.fp8_scales(scales);
    kshard::Fp8AmaxHistory history(scales, 16, kshard::Fp8AmaxAlgo::max);
    del.step(x, dy);
    history.update();  // calibrated from here on

    const double t_bf16 = time_ms(warmup, reps, [&] { plain.step(x, dy); });
    const double t_cur = time_ms(warmup, reps, [&] { cur.step(x, dy); });
    const double t_del = time_ms(warmup, reps, [&] { del.step(x, dy); });
    const double t_blk = time_ms(warmup, reps, [&] { blk.step(x, dy); });
    const double t_queued = time_ms(1, 3, [&] {
                              for (int r = 0; r < reps; ++r) del.step(x, dy);
                            }) / reps;

    // The pieces, on their own buffers.
    kshard::Fp8Scale sx("x", kshard::Fp8Format::e4m3), sw("w", kshard::Fp8Format::e4m3),
        sdy("dy", kshard::Fp8Format::e5m2);
    Kokkos::View<kshard::float8_e4m3_t*> xq("xq", rows * s.in), wq("wq", s.out * s.in);
    Kokkos::View<kshard::float8_e5m2_t*> dyq("dyq", rows * s.out), dyqt("dyqt", rows * s.out);
    const double t_amax = time_ms(warmup, reps, [&] { kshard::fp8_amax(x, sx); });
    const double t_cx = time_ms(warmup, reps, [&] {
      kshard::fp8_cast(x, rows, s.in, sx, kshard::Fp8ScaleFrom::scale, xq, {});
    });
    kshard::fp8_amax(w, sw);
    const double t_cw = time_ms(warmup, reps, [&] {
      kshard::fp8_cast(w, s.out, s.in, sw, kshard::Fp8ScaleFrom::scale, wq, {});
    });
    kshard::fp8_amax(dy, sdy);
    const double t_cdy = time_ms(warmup, reps, [&] {
      kshard::fp8_cast(dy, rows, s.out, sdy, kshard::Fp8ScaleFrom::scale, dyq, dyqt);
    });
    double t_bdy = 0;
    if (kshard::fp8_blockwise_supported(rows, s.out)) {
      Kokkos::View<kshard::float8_e4m3_t*> bq("bq", rows * s.out), bqt("bqt", rows * s.out);
      Kokkos::View<float*> bs("bs", kshard::fp8_scales_1x128(rows, s.out));
      Kokkos::View<float*> bst("bst", kshard::fp8_scales_1x128(s.out, rows));
      t_bdy = time_ms(warmup, reps, [&] { kshard::fp8_cast_1x128(dy, rows, s.out, bq, bs, bqt, bst); });
    }
    Kokkos::View<bf16*> xc("xc", rows * s.in);
    const double t_copy = time_ms(warmup, reps, [&] { Kokkos::deep_copy(xc, x); });
    Kokkos::View<bf16*> y("y", rows * s.out);
    double t_g8 = 0;
    if (kshard::fp8_gemm_supported(rows, s.out, s.in)) {
      kshard::Fp8GemmOptions o;
      o.fast_accum = true;
      t_g8 = time_ms(warmup, reps, [&] {
        kshard::fp8_gemm_tn(rows, s.out, s.in, {xq.data(), kshard::Fp8Format::e4m3, sx.scale_inv()},
                            {wq.data(), kshard::Fp8Format::e4m3, sw.scale_inv()}, y.data(), o);
      });
    }
    const double t_g16 = time_ms(warmup, reps, [&] {
      kshard::gemm<bf16, bf16>(kshard::Trans::N, kshard::Trans::T, rows, s.out, s.in, 1.0f,
                               Kokkos::View<const bf16*>(x), Kokkos::View<const bf16*>(w), 0.0f, y);
    });
    tot[0] += t_bf16;
    tot[1] += t_cur;
    tot[2] += t_del;
    tot[3] += t_blk;
    std::printf("%-9s %8.3f %8.3f %8.3f %8.3f %6.2f | %7.3f %7.3f %7.3f %7.3f %7.3f %7.3f | %7.3f %7.3f "
                "%7.2f | %7.3f\n",
                s.name, t_bf16, t_cur, t_del, t_blk, t_bf16 / t_del, t_amax, t_cx, t_cw, t_cdy, t_bdy,
                t_copy, t_g8, t_g16, t_g8 > 0 ? t_g16 / t_g8 : 0.0, t_queued);
  }
  std::printf("%-9s %8.3f %8.3f %8.3f %8.3f %6.2f   (ms; del/bf: bf16 time / fp8-delayed time)\n",
              "all", tot[0], tot[1], tot[2], tot[3], tot[0] / tot[2]);
  std::printf("bytes: cast x moves 3 B per element of x, cast dy and blk dy 4 B per element of dy, "
              "copy x 4 B per element of x\n");
  return 0;
}
