// Standalone GPU check + timing of the f32 attention kernels (see run.sh; not part of the build).
#include <cuda_runtime.h>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>
#include <algorithm>
#include "kshard/engine/kernels/flash_attention.hpp"
namespace kshard::detail {
bool flash_f32_serves(const FlashArgs<float>& a);
void flash_f32_forward(const FlashArgs<float>& a, cudaStream_t stream);
void flash_f32_backward(const FlashArgs<float>& a, cudaStream_t stream);
}
using namespace kshard::detail;
#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("CUDA %s at %d\n", cudaGetErrorString(e), __LINE__); exit(1);} } while (0)
struct Bufs { float *qkv, *ctx, *dctx, *lse, *delta, *dqkv; };
Bufs alloc(int B, int T, int H, int hd, std::vector<float>& qkv, std::vector<float>& dctx) {
  Bufs b; int d = H * hd; size_t n = size_t(B) * T;
  CK(cudaMalloc(&b.qkv, n * 3 * d * 4)); CK(cudaMalloc(&b.ctx, n * d * 4)); CK(cudaMalloc(&b.dctx, n * d * 4));
  CK(cudaMalloc(&b.lse, n * H * 4)); CK(cudaMalloc(&b.delta, n * H * 4)); CK(cudaMalloc(&b.dqkv, n * 3 * d * 4));
  CK(cudaMemcpy(b.qkv, qkv.data(), qkv.size() * 4, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(b.dctx, dctx.data(), dctx.size() * 4, cudaMemcpyHostToDevice));
  return b;
}
FlashArgs<float> args(const Bufs& b, int B, int T, int H, int hd, bool bwd) {
  FlashArgs<float> a; a.batch = B; a.seq = T; a.heads = H; a.d = H * hd; a.qkv = b.qkv;
  if (!bwd) { a.out = b.ctx; a.lse = b.lse; } else { a.ctx = b.ctx; a.dctx = b.dctx; a.lse_in = b.lse; a.delta = b.delta; a.out = b.dqkv; }
  return a;
}
void check(int B, int T, int H, int hd, double amp) {
  int d = H * hd; std::mt19937_64 rng(T * 7 + hd); std::uniform_real_distribution<double> u(-1, 1);
  std::vector<float> qkv(size_t(B) * T * 3 * d), dctx(size_t(B) * T * d);
  for (auto& x : qkv) x = float(amp * u(rng)); for (auto& x : dctx) x = float(u(rng));
  Bufs b = alloc(B, T, H, hd, qkv, dctx);
  flash_f32_forward(args(b, B, T, H, hd, false), 0); flash_f32_backward(args(b, B, T, H, hd, true), 0);
  CK(cudaDeviceSynchronize());
  std::vector<float> ctx(size_t(B) * T * d), dq(qkv.size()), lse(size_t(B) * H * T);
  CK(cudaMemcpy(ctx.data(), b.ctx, ctx.size() * 4, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(dq.data(), b.dqkv, dq.size() * 4, cudaMemcpyDeviceToHost));
  // determinism: rerun backward, compare bits
  std::vector<float> dq2(qkv.size());
  flash_f32_backward(args(b, B, T, H, hd, true), 0); CK(cudaDeviceSynchronize());
  CK(cudaMemcpy(dq2.data(), b.dqkv, dq2.size() * 4, cudaMemcpyDeviceToHost));
  bool same = memcmp(dq.data(), dq2.data(), dq.size() * 4) == 0;
  // double reference
  double sc = 1 / std::sqrt(double(hd)); double ec = 0, mc = 0, eg[3] = {0, 0, 0}, mg[3] = {0, 0, 0};
  std::vector<double> ref(qkv.size(), 0.0);
  for (int bb = 0; bb < B; ++bb) for (int h = 0; h < H; ++h) {
    auto Q = [&](int i, int c) { return double(qkv[(size_t(bb) * T + i) * 3 * d + h * hd + c]); };
    auto K = [&](int i, int c) { return double(qkv[(size_t(bb) * T + i) * 3 * d + d + h * hd + c]); };
    auto V = [&](int i, int c) { return double(qkv[(size_t(bb) * T + i) * 3 * d + 2 * d + h * hd + c]); };
    auto dO = [&](int i, int c) { return double(dctx[(size_t(bb) * T + i) * d + h * hd + c]); };
    std::vector<double> P(size_t(T) * T, 0), dS(size_t(T) * T, 0);
    for (int i = 0; i < T; ++i) {
      double mx = -1e300; for (int j = 0; j <= i; ++j) { double s = 0; for (int c = 0; c < hd; ++c) s += Q(i, c) * K(j, c); P[size_t(i) * T + j] = s * sc; mx = std::max(mx, s * sc); }
      double sum = 0; for (int j = 0; j <= i; ++j) sum += std::exp(P[size_t(i) * T + j] - mx);
      for (int j = 0; j <= i; ++j) P[size_t(i) * T + j] = std::exp(P[size_t(i) * T + j] - mx) / sum;
      for (int c = 0; c < hd; ++c) { double o = 0; for (int j = 0; j <= i; ++j) o += P[size_t(i) * T + j] * V(j, c);
        ec = std::max(ec, std::abs(o - ctx[(size_t(bb) * T + i) * d + h * hd + c])); mc = std::max(mc, std::abs(o)); }
      double dot = 0; std::vector<double> dp(i + 1);
      for (int j = 0; j <= i; ++j) { double s = 0; for (int c = 0; c < hd; ++c) s += dO(i, c) * V(j, c); dp[j] = s; dot += P[size_t(i) * T + j] * s; }
      for (int j = 0; j <= i; ++j) dS[size_t(i) * T + j] = P[size_t(i) * T + j] * (dp[j] - dot);
    }
    for (int i = 0; i < T; ++i) for (int c = 0; c < hd; ++c) {
      double g[3] = {0, 0, 0};
      for (int j = 0; j < T; ++j) { g[0] += dS[size_t(i) * T + j] * K(j, c); g[1] += dS[size_t(j) * T + i] * Q(j, c); g[2] += P[size_t(j) * T + i] * dO(j, c); }
      g[0] *= sc; g[1] *= sc;
      for (int w = 0; w < 3; ++w) { float got = dq[(size_t(bb) * T + i) * 3 * d + w * d + h * hd + c]; eg[w] = std::max(eg[w], std::abs(g[w] - got)); mg[w] = std::max(mg[w], std::abs(g[w])); }
    }
  }
  auto r = [](double e, double m) { return e / std::max(m, 1e-2); };
  printf("check B%d T%d H%d hd%d: ctx %.2e dq %.2e dk %.2e dv %.2e deterministic %s\n", B, T, H, hd, r(ec, mc), r(eg[0], mg[0]), r(eg[1], mg[1]), r(eg[2], mg[2]), same ? "yes" : "NO");
}
void bench(int B, int T, int H, int hd) {
  int d = H * hd; std::vector<float> qkv(size_t(B) * T * 3 * d), dctx(size_t(B) * T * d);
  std::mt19937_64 rng(1); std::uniform_real_distribution<float> u(-1, 1);
  for (auto& x : qkv) x = u(rng); for (auto& x : dctx) x = u(rng);
  Bufs b = alloc(B, T, H, hd, qkv, dctx);
  cudaEvent_t e0, e1; cudaEventCreate(&e0); cudaEventCreate(&e1);
  auto fa = args(b, B, T, H, hd, false), ba = args(b, B, T, H, hd, true);
  for (int w = 0; w < 3; ++w) { flash_f32_forward(fa, 0); flash_f32_backward(ba, 0); }
  const int it = 20; float tf, tb;
  cudaEventRecord(e0); for (int i = 0; i < it; ++i) flash_f32_forward(fa, 0); cudaEventRecord(e1); CK(cudaEventSynchronize(e1)); cudaEventElapsedTime(&tf, e0, e1);
  cudaEventRecord(e0); for (int i = 0; i < it; ++i) flash_f32_backward(ba, 0); cudaEventRecord(e1); CK(cudaEventSynchronize(e1)); cudaEventElapsedTime(&tb, e0, e1);
  tf /= it; tb /= it;
  double half = 0.5 * double(T) * T * hd * 2 * B * H;  // one causal-half product, flops
  printf("bench B%d T%d H%d hd%d: fwd %.3f ms (%.1f TFLOP/s)  bwd %.3f ms (%.1f TFLOP/s)  fwd+bwd %.3f ms (%.1f TFLOP/s)\n", B, T, H, hd,
         tf, 2 * half / tf / 1e9, tb, 5 * half / tb / 1e9, tf + tb, 7 * half / (tf + tb) / 1e9);
}
int main() {
  check(1, 1, 1, 64, 1); check(2, 65, 2, 64, 1); check(1, 200, 3, 128, 3); check(2, 129, 2, 128, 1); check(1, 100, 1, 64, 3);
  bench(4, 1024, 16, 128); bench(8, 512, 16, 64); bench(4, 2048, 16, 128);
}
