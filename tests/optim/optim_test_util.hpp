#pragma once
// Helpers for the optim tests: host <-> View copies, seeded data, an
// independent double-precision Adam/AdamW and independent round-to-nearest-
// even models of bf16/fp16 (none of them uses kshard's own code).
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <Kokkos_Core.hpp>

#include <kshard/numeric/types.hpp>

namespace optim_test {

using Vec = Kokkos::View<float*>;

inline Vec to_view(const std::vector<float>& h, const std::string& label) {
  Vec v(label, h.size());
  auto m = Kokkos::create_mirror_view(v);
  for (std::size_t i = 0; i < h.size(); ++i) m(i) = h[i];
  Kokkos::deep_copy(v, m);
  return v;
}

template <class T>
std::vector<T> to_host(const Kokkos::View<T*>& v) {
  auto m = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), v);
  std::vector<T> h(v.size());
  for (std::size_t i = 0; i < h.size(); ++i) h[i] = m(i);
  return h;
}

inline void from_host(const Vec& v, const std::vector<float>& h) {
  auto m = Kokkos::create_mirror_view(v);
  for (std::size_t i = 0; i < h.size(); ++i) m(i) = h[i];
  Kokkos::deep_copy(v, m);
}

inline std::uint32_t bits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

/// Bitwise equality of two float vectors (NaN-safe).
inline bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (bits(a[i]) != bits(b[i])) return false;
  return true;
}

/// Values with magnitudes over several decades, deterministic per seed.
struct Data {
  std::mt19937_64 rng;
  explicit Data(std::uint64_t seed) : rng(seed) {}
  double uniform(double lo, double hi) { return std::uniform_real_distribution<double>(lo, hi)(rng); }
  double normal() { return std::normal_distribution<double>(0.0, 1.0)(rng); }
  std::vector<float> params(std::size_t n) {
    std::vector<float> p(n);
    for (auto& x : p) x = float(uniform(-1.0, 1.0));
    return p;
  }
  /// Per-element scales 10^U(-3, 0): gradients of very different sizes.
  std::vector<double> scales(std::size_t n) {
    std::vector<double> s(n);
    for (auto& x : s) x = std::pow(10.0, uniform(-3.0, 0.0));
    return s;
  }
  std::vector<double> grads(const std::vector<double>& scale) {
    std::vector<double> g(scale.size());
    for (std::size_t i = 0; i < g.size(); ++i) g[i] = normal() * scale[i];
    return g;
  }
};

// ------------------------------------------------ independent rounding models

/// x rounded to a binary format with `sig` significand bits (implicit bit
/// included), smallest normal exponent emin, ties to even; overflow to inf
/// when the rounded magnitude reaches 2^(emax+1). Exact in double for floats.
inline double round_format(double x, int sig, int emin, int emax) {
  if (std::isnan(x)) return x;
  if (x == 0 || std::isinf(x)) return x;
  int e;
  std::frexp(std::fabs(x), &e);  // |x| in [2^(e-1), 2^e)
  int exp = e - 1;
  if (exp < emin) exp = emin;  // subnormal: fixed quantum
  const double quantum = std::ldexp(1.0, exp - (sig - 1));
  const double q = std::nearbyint(x / quantum);  // default rounding mode: ties to even
  const double r = q * quantum;
  if (std::fabs(r) >= std::ldexp(1.0, emax + 1)) return std::copysign(INFINITY, x);
  return r;
}
inline double round_bf16(double x) { return round_format(x, 8, -126, 127); }
inline double round_f16(double x) { return round_format(x, 11, -14, 15); }

inline double decode(kshard::bfloat16_t b) {
  const std::uint32_t u = std::uint32_t(b.bits) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
inline double decode(kshard::float16_t h) {
  const int sign = h.bits >> 15, ex = (h.bits >> 10) & 31, man = h.bits & 1023;
  double mag;
  if (ex == 31) mag = man ? NAN : INFINITY;
  else if (ex == 0) mag = std::ldexp(double(man), -24);
  else mag = std::ldexp(double(1024 + man), ex - 25);
  return sign ? -mag : mag;
}

// ------------------------------------------------ reference Adam in double

struct RefOptions {
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0;
  bool decoupled = true, bias_correction = true, maximize = false;
};

/// Adam / AdamW as written in the papers (and PyTorch's documentation), in
/// double, plus a running a-priori bound on how far an fp32 implementation
/// storing its moments with unit roundoff `u_store` may drift from it (see
/// step()).
struct RefAdam {
  RefOptions o;
  double u_store;  // unit roundoff of moment storage: 2^-24 fp32, 2^-8 bf16 (RNE)
  std::vector<double> p, m, v;
  std::vector<double> m_abs;         // the m recurrence on |g|: bounds |m| and its rounding errors
  std::vector<double> v_abs;         // the v recurrence on |g|^2 (L2: |g| + wd |p|, no cancellation)
  std::vector<double> tol_p;         // accumulated bound on |p_fp32 - p|
  std::int64_t t = 0;

  RefAdam(RefOptions opts, const std::vector<float>& p0, double u_store_)
      : o(opts), u_store(u_store_), p(p0.begin(), p0.end()), m(p0.size(), 0.0),
        v(p0.size(), 0.0), m_abs(p0.size(), 0.0), v_abs(p0.size(), 0.0), tol_p(p0.size(), 0.0) {}

  static double norm(const std::vector<double>& g) {
    double s = 0;
    for (double x : g) s += x * x;
    return std::sqrt(s);
  }
  static double clip_coef(double norm, double max_norm) {
    if (max_norm <= 0) return 1.0;
    return std::min(1.0, max_norm / (norm + 1e-6));
  }

  /// One step on the true (unscaled) gradient g times `clip`.
  ///
  /// Error bound (u = 2^-24, fp32 arithmetic; u_s = u_store). g itself
  /// carries ~3 roundings (the fp32 scale, its product, the L2 term) relative
  /// to g_abs = |g| (+ wd |p| with L2, where g may cancel). Each step computes
  /// m with one more rounding relative to m_abs (the m recurrence on g_abs)
  /// and stores it with u_s; errors of earlier steps decay by beta1 while
  /// m_abs_t >= beta1^(t-k) m_abs_k, so after t steps
  /// |dm| <= t (4u + u_s) m_abs. Likewise |dv| <= t (5u + u_s) v_abs, v_abs
  /// the v recurrence on g_abs^2 (two more roundings for g^2). The update
  /// lr * m^/(sqrt(v^)+eps) then errs by at most
  /// lr * (dm^ + |m^| dsqrt / den + 6u m_abs^) / den, den = sqrt(v^)+eps,
  /// dsqrt = min(dv^ / (2 sqrt(v^)), sqrt(dv^)); p's own multiply/subtract
  /// add 2u|p|. Errors in p carry over unchanged (or shrink by 1 - lr*wd);
  /// the L2 term feeds them back through g only at order wd*(1-beta1) << 1,
  /// covered by the factor 2 the callers apply.
  void step(const std::vector<double>& g_true, double clip) {
    const double u = std::ldexp(1.0, -24);
    ++t;
    const double bc1 = o.bias_correction ? 1 - std::pow(o.beta1, double(t)) : 1;
    const double bc2 = o.bias_correction ? 1 - std::pow(o.beta2, double(t)) : 1;
    for (std::size_t i = 0; i < p.size(); ++i) {
      double g = g_true[i] * clip;
      if (o.maximize) g = -g;
      double g_abs = std::fabs(g);
      if (o.decoupled) {
        p[i] *= 1 - o.lr * o.weight_decay;
      } else {
        g += o.weight_decay * p[i];
        g_abs += o.weight_decay * std::fabs(p[i]);
      }
      m[i] = o.beta1 * m[i] + (1 - o.beta1) * g;
      v[i] = o.beta2 * v[i] + (1 - o.beta2) * g * g;
      m_abs[i] = o.beta1 * m_abs[i] + (1 - o.beta1) * g_abs;
      v_abs[i] = o.beta2 * v_abs[i] + (1 - o.beta2) * g_abs * g_abs;
      const double sv = std::sqrt(v[i] / bc2);
      const double den = sv + o.eps;
      p[i] -= o.lr * (m[i] / bc1) / den;
      const double dm = tol_m(i) / bc1;
      const double dv = tol_v(i) / bc2;
      const double dsqrt = sv > 0 ? std::min(dv / (2 * sv), std::sqrt(dv)) : std::sqrt(dv);
      tol_p[i] += 2 * u * std::fabs(p[i]) +
                  o.lr * (dm + std::fabs(m[i] / bc1) * dsqrt / den + 6 * u * m_abs[i] / bc1) / den;
    }
  }
  double tol_m(std::size_t i) const { return double(t) * (4 * std::ldexp(1.0, -24) + u_store) * m_abs[i]; }
  double tol_v(std::size_t i) const { return double(t) * (5 * std::ldexp(1.0, -24) + u_store) * v_abs[i]; }
};

}  // namespace optim_test
