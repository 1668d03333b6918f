// kshard-bench-attention: fused causal attention (flash_attention_forward /
// backward) against the unfused reference (detail::causal_attention_forward /
// backward: GEMMs + a [B, H, T, T] softmax) on the default execution space.
//
//   kshard-bench-attention [--sizes B,T,D,H[;B,T,D,H...]] [--types float,bf16,f16,double]
//                          [--reps R] [--warmup W] [--no-unfused]
//
// Default sizes are the train benchmark's attention shapes (batch, seq, d, heads):
// (32,128,256,4), (8,512,1024,16), (4,1024,2048,16); default types float and bf16.
// On the GPU build (H200):
//   cmake --build build/cuda --target kshard-bench-attention
//   build/cuda/bench/attention/kshard-bench-attention
// On the host the default sizes take minutes; pass small ones, e.g.
//   build/host/bench/attention/kshard-bench-attention --sizes '32,128,256,4;2,512,512,8' --reps 3
//
// Each figure is the median of R repetitions after W warm-ups, with
// Kokkos::fence() before and after each timed call; fused and unfused
// alternate so they see the same machine. FLOPs (causal, so half of the
// dense products): forward 2 * B*H*T^2*hd (QK^T and PV, 2 flops per
// multiply-add, halved), backward 2.5x that (five products: S, dP, dV, dK, dQ;
// the fused backward recomputes S and dP in its dQ pass, which is not
// counted). The unfused path exists in float and double only (the layers at
// this commit); a bf16/f16 row is compared with unfused float on the same
// (16-bit-rounded) inputs. "check" is the max |fused - unfused| / max |unfused|
// of ctx and of dqkv at that size. Where float runs on the exact-f32 CUDA
// kernel ("f32 kernel"), the portable Kokkos kernel is timed too ("portable
// float"), on the same inputs, so that the two compare directly:
//   kshard-bench-attention --types float --sizes '4,1024,2048,16;8,512,1024,16'
// (the train benchmark's hd 128 and hd 64 shapes).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include <Kokkos_Core.hpp>
#include <Kokkos_Random.hpp>

#include <kshard/engine/nn/attention.hpp>
#include <kshard/kernels/flash_attention.hpp>
#include <kshard/mesh/session.hpp>

namespace {

using Clock = std::chrono::steady_clock;
using Index = Kokkos::RangePolicy<Kokkos::IndexType<std::int64_t>>;

struct Size {
  std::int64_t batch, seq, d, heads;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

template <class F>
double time_once(F&& f) {
  Kokkos::fence();
  const auto t0 = Clock::now();
  f();
  Kokkos::fence();
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

/// f uniform in [-scale, scale], then x = f rounded to T and f = that rounded
/// value again, so the float reference sees exactly the fused run's inputs.
template <class T>
struct Round {
  Kokkos::View<T*> x;
  Kokkos::View<float*> f;
  KOKKOS_INLINE_FUNCTION void operator()(const std::int64_t i) const {
    x(i) = kshard::from_accum<T>(static_cast<kshard::accum_t<T>>(f(i)));
    f(i) = static_cast<float>(kshard::to_accum(x(i)));
  }
};

template <class T>
void fill(const Kokkos::View<T*>& x, const Kokkos::View<float*>& f, std::uint64_t seed,
          float scale) {
  Kokkos::Random_XorShift64_Pool<> pool(seed);
  Kokkos::fill_random(f, pool, -scale, scale);
  Kokkos::parallel_for("bench.round", Index(0, std::int64_t(x.extent(0))), Round<T>{x, f});
}

/// (max |a - b|, max |b|) over all elements.
template <class T>
struct Diff {
  Kokkos::View<T*> a;
  Kokkos::View<float*> b;
  KOKKOS_INLINE_FUNCTION void operator()(const std::int64_t i, float& diff, float& ref) const {
    const float x = static_cast<float>(kshard::to_accum(a(i))), y = b(i);
    const float e = x > y ? x - y : y - x, m = y > 0 ? y : -y;
    if (e > diff) diff = e;
    if (m > ref) ref = m;
  }
};

template <class T>
double rel_diff(const Kokkos::View<T*>& a, const Kokkos::View<float*>& b) {
  float diff = 0, ref = 0;
  Kokkos::parallel_reduce("bench.diff", Index(0, std::int64_t(b.extent(0))), Diff<T>{a, b},
                          Kokkos::Max<float>(diff), Kokkos::Max<float>(ref));
  return ref > 0 ? double(diff) / double(ref) : double(diff);
}

struct Timing {
  double fwd = 0, bwd = 0;
};

template <class T>
void run(const Size& s, const char* type, int reps, int warmup, bool unfused) {
  using A = kshard::accum_t<T>;
  const std::int64_t tokens = s.batch * s.seq, d = s.d, hd = d / s.heads;
  const std::int64_t rows = kshard::flash_attention_rows(s.batch, s.seq, s.heads);
  const auto nq = static_cast<std::size_t>(tokens * 3 * d), nc = static_cast<std::size_t>(tokens * d);
  auto alloc = [](const char* label) {
    return Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string(label));
  };
  Kokkos::View<T*> qkv(alloc("bench.qkv"), nq), ctx(alloc("bench.ctx"), nc);
  Kokkos::View<T*> dctx(alloc("bench.dctx"), nc), dqkv(alloc("bench.dqkv"), nq);
  Kokkos::View<A*> lse(alloc("bench.lse"), rows), delta(alloc("bench.delta"), rows);
  // Float copies of the inputs (the reference's inputs) and the unfused buffers.
  Kokkos::View<float*> qkv_f(alloc("bench.qkv_f"), nq), dctx_f(alloc("bench.dctx_f"), nc);
  Kokkos::View<float*> ctx_f, dqkv_f, prob_f, dprob_f;
  if (unfused) {
    const auto np = static_cast<std::size_t>(s.batch * s.heads * s.seq * s.seq);
    ctx_f = Kokkos::View<float*>(alloc("bench.ctx_f"), nc);
    dqkv_f = Kokkos::View<float*>(alloc("bench.dqkv_f"), nq);
    prob_f = Kokkos::View<float*>(alloc("bench.prob_f"), np);
    dprob_f = Kokkos::View<float*>(alloc("bench.dprob_f"), np);
  }
  fill<T>(qkv, qkv_f, 11, 1.0f);
  fill<T>(dctx, dctx_f, 12, 1.0f);

  auto fused_fwd = [&] {
    kshard::flash_attention_forward<T>(qkv, ctx, lse, s.batch, s.seq, d, s.heads);
  };
  auto fused_bwd = [&] {
    kshard::flash_attention_backward<T>(qkv, ctx, dctx, lse, dqkv, s.batch, s.seq, d, s.heads,
                                        delta);
  };
  auto ref_fwd = [&] {
    kshard::detail::causal_attention_forward<float>(qkv_f, prob_f, ctx_f, s.batch, s.seq, d,
                                                    s.heads);
  };
  auto ref_bwd = [&] {
    kshard::detail::causal_attention_backward<float>(qkv_f, prob_f, dctx_f, dprob_f, dqkv_f,
                                                     s.batch, s.seq, d, s.heads);
  };

  kshard::detail::FlashArgs<T> args;
  args.qkv = qkv.data();
  args.out = ctx.data();
  args.batch = s.batch;
  args.seq = s.seq;
  args.d = d;
  args.heads = s.heads;
  const std::string path = kshard::detail::flash_attention_path<T>(args);
  const bool portable = path == "f32 kernel";
  auto portable_fwd = [&] { kshard::detail::flash_attention_forward_portable<T>(args); };
  auto portable_bwd = [&] {
    kshard::detail::FlashArgs<T> b = args;
    b.ctx = ctx.data();
    b.dctx = dctx.data();
    b.lse_in = lse.data();
    b.delta = delta.data();
    b.out = dqkv.data();
    kshard::detail::flash_attention_backward_portable<T>(b);
  };
  args.lse = lse.data();

  std::vector<double> ff, fb, rf, rb, pf, pb;
  for (int r = 0; r < warmup + reps; ++r) {
    const double a = time_once(fused_fwd), b = time_once(fused_bwd);
    if (portable && r >= warmup) {
      pf.push_back(time_once(portable_fwd));
      pb.push_back(time_once(portable_bwd));
    }
    double c = 0, e = 0;
    if (unfused) {
      c = time_once(ref_fwd);
      e = time_once(ref_bwd);
    }
    if (r >= warmup) {
      ff.push_back(a);
      fb.push_back(b);
      rf.push_back(c);
      rb.push_back(e);
    }
  }
  const double fwd_flop = 2.0 * double(s.batch * s.heads) * double(s.seq) * double(s.seq) * double(hd);
  const double bwd_flop = 2.5 * fwd_flop;
  auto line = [&](const char* what, double tf, double tb) {
    std::printf("  %-22s fwd %9.3f ms %7.2f TFLOP/s | bwd %9.3f ms %7.2f TFLOP/s | "
                "fwd+bwd %9.3f ms %7.2f TFLOP/s\n",
                what, tf * 1e3, fwd_flop / tf * 1e-12, tb * 1e3, bwd_flop / tb * 1e-12,
                (tf + tb) * 1e3, (fwd_flop + bwd_flop) / (tf + tb) * 1e-12);
  };
  std::printf("(batch %lld, seq %lld, d %lld, heads %lld, hd %lld) %s (%s)\n", (long long)s.batch,
              (long long)s.seq, (long long)d, (long long)s.heads, (long long)hd, type,
              path.c_str());
  const double tf = median(ff), tb = median(fb);
  line((std::string("fused ") + type).c_str(), tf, tb);
  if (portable) {
    const double ptf = median(pf), ptb = median(pb);
    line((std::string("portable ") + type).c_str(), ptf, ptb);
    std::printf("  speedup %s/portable: fwd %.2fx bwd %.2fx fwd+bwd %.2fx\n", path.c_str(),
                ptf / tf, ptb / tb, (ptf + ptb) / (tf + tb));
  }
  if (unfused) {
    const double uf = median(rf), ub = median(rb);
    line("unfused float", uf, ub);
    // The comparison runs the fused and unfused pair once more on the same inputs.
    fused_fwd();
    fused_bwd();
    ref_fwd();
    ref_bwd();
    std::printf("  speedup fused/unfused: fwd %.2fx bwd %.2fx fwd+bwd %.2fx; check ctx %.2e dqkv %.2e\n",
                uf / tf, ub / tb, (uf + ub) / (tf + tb), rel_diff(ctx, ctx_f), rel_diff(dqkv, dqkv_f));
  }
  std::fflush(stdout);
}

std::vector<Size> parse_sizes(const std::string& spec) {
  std::vector<Size> out;
  std::stringstream all(spec);
  std::string one;
  while (std::getline(all, one, ';')) {
    Size s{};
    if (std::sscanf(one.c_str(), "%lld,%lld,%lld,%lld", reinterpret_cast<long long*>(&s.batch),
                    reinterpret_cast<long long*>(&s.seq), reinterpret_cast<long long*>(&s.d),
                    reinterpret_cast<long long*>(&s.heads)) != 4) {
      std::fprintf(stderr, "bad size '%s' (want B,T,D,H)\n", one.c_str());
      std::exit(2);
    }
    out.push_back(s);
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  kshard::Session session(argc, argv);
  std::string sizes = "32,128,256,4;8,512,1024,16;4,1024,2048,16", types = "float,bf16";
  int reps = 10, warmup = 2;
  bool unfused = true;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--sizes") sizes = next();
    else if (a == "--types") types = next();
    else if (a == "--reps") reps = std::stoi(next());
    else if (a == "--warmup") warmup = std::stoi(next());
    else if (a == "--no-unfused") unfused = false;
    else {
      std::fprintf(stderr,
                   "usage: %s [--sizes B,T,D,H[;...]] [--types float,bf16,f16,double] [--reps R] "
                   "[--warmup W] [--no-unfused]\n",
                   argv[0]);
      return 2;
    }
  }
  if (reps < 1 || warmup < 0) {
    std::fprintf(stderr, "need --reps >= 1, --warmup >= 0\n");
    return 2;
  }
  std::printf("kshard-bench-attention: %s, median of %d reps after %d warm-ups\n",
              Kokkos::DefaultExecutionSpace::name(), reps, warmup);
  for (const Size& s : parse_sizes(sizes)) {
    std::stringstream ts(types);
    std::string t;
    while (std::getline(ts, t, ',')) {
      if (t == "float") run<float>(s, "float", reps, warmup, unfused);
      else if (t == "double") run<double>(s, "double", reps, warmup, false);
      else if (t == "bf16") run<kshard::bfloat16_t>(s, "bf16", reps, warmup, unfused);
      else if (t == "f16") run<kshard::float16_t>(s, "f16", reps, warmup, unfused);
      else {
        std::fprintf(stderr, "unknown type '%s'\n", t.c_str());
        return 2;
      }
    }
  }
  return 0;
}
