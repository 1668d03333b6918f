#pragma once
// Host-side helpers for the layer tests. Everything here moves data with
// deep_copy only (no kernels), so it works unchanged on host and CUDA builds.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include <Kokkos_Core.hpp>

#include "kshard/engine/nn/layer.hpp"
#include "kshard/numeric/compute.hpp"

namespace kshard::test {

using HostVec = std::vector<double>;

/// A host double as T (any compute type: 16-bit ones round to nearest even),
/// and back.
template <class T>
T from_double(double v) {
  if constexpr (is_low_precision_v<T>)
    return from_float<T>(static_cast<float>(v));
  else
    return static_cast<T>(v);
}
template <class T>
double to_double(T v) {
  if constexpr (std::is_arithmetic_v<T>)
    return static_cast<double>(v);
  else
    return static_cast<double>(to_accum(v));
}
/// The values a View of T would hold (so a reference sees the same inputs).
template <class T>
HostVec rounded(HostVec v) {
  for (auto& x : v) x = to_double(from_double<T>(x));
  return v;
}

template <class T>
Kokkos::View<T*> to_device(const HostVec& v, const char* label = "test") {
  Kokkos::View<T*> d(std::string(label), v.size());
  auto h = Kokkos::create_mirror_view(d);
  for (std::size_t i = 0; i < v.size(); ++i) h(i) = from_double<T>(v[i]);
  Kokkos::deep_copy(d, h);
  return d;
}

template <class T>
void upload(const HostVec& v, const Kokkos::View<T*>& d) {
  auto h = Kokkos::create_mirror_view(d);
  for (std::size_t i = 0; i < v.size(); ++i) h(i) = from_double<T>(v[i]);
  Kokkos::deep_copy(d, h);
}

template <class V>
HostVec to_host(const V& d) {
  auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), d);
  HostVec v(d.extent(0));
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = to_double(h(i));
  return v;
}

inline HostVec random_vec(std::size_t n, std::mt19937_64& rng, double lo = -1.0, double hi = 1.0) {
  std::uniform_real_distribution<double> u(lo, hi);
  HostVec v(n);
  for (auto& x : v) x = u(rng);
  return v;
}

/// A random activation of shape s, uniform in [-1, 1) (seeded: the same input each run).
inline HostVec random_input(ActShape s, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  return random_vec(static_cast<std::size_t>(s.numel()), rng);
}

/// Central differences in double: the step and the relative tolerance the
/// analytic gradients are held to.
constexpr double kFdStep = 1e-6;
constexpr double kFdTol = 1e-6;

inline double max_abs(const HostVec& v) {
  double m = 0;
  for (double x : v) m = std::max(m, std::abs(x));
  return m;
}

/// max_i |a_i - b_i| / max(max_i |b_i|, floor): error relative to the scale of b.
inline double rel_err(const HostVec& a, const HostVec& b, double floor = 1e-2) {
  double m = 0;
  for (std::size_t i = 0; i < a.size(); ++i) m = std::max(m, std::abs(a[i] - b[i]));
  return m / std::max(max_abs(b), floor);
}

inline double dot(const HostVec& a, const HostVec& b) {
  double s = 0;
  for (std::size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

/// Initialised parameters (by spec) plus a random perturbation, so that
/// gamma != 1, beta != 0 and biases are generic in the checks.
template <class T>
std::vector<HostVec> random_params(const Layer<T>& layer, std::uint64_t seed) {
  auto p = allocate_parameters(layer);
  init_parameters(layer, p, seed);
  std::mt19937_64 rng(seed);
  std::vector<HostVec> h;
  for (auto& v : p) {
    HostVec x = to_host(v);
    for (auto& e : x) e += std::uniform_real_distribution<double>(-0.3, 0.3)(rng);
    h.push_back(std::move(x));
  }
  return h;
}

template <class T>
std::vector<Kokkos::View<T*>> params_to_device(const std::vector<HostVec>& hp) {
  std::vector<Kokkos::View<T*>> d;
  for (const auto& v : hp) d.push_back(to_device<T>(v, "param"));
  return d;
}

template <class T>
std::vector<Kokkos::View<T*>> zero_grads(const Layer<T>& layer) {
  return allocate_parameters(layer);
}

/// layer.forward on host input x; a layer that takes token ids gets x as
/// int32 ids (forward_tokens). Returns x on the device (for dx's size).
template <class T>
Kokkos::View<T*> forward_host_input(Layer<T>& layer, const HostVec& x, ActShape shape,
                                    const std::vector<Kokkos::View<T*>>& params,
                                    Kokkos::View<T*> y) {
  auto xd = to_device<T>(x, "x");
  if (layer.takes_token_ids()) {
    Kokkos::View<std::int32_t*> ids("ids", x.size());
    auto h = Kokkos::create_mirror_view(ids);
    for (std::size_t i = 0; i < x.size(); ++i) h(i) = static_cast<std::int32_t>(x[i]);
    Kokkos::deep_copy(ids, h);
    layer.forward_tokens(ids, shape, const_views(params), y);
  } else {
    layer.forward(xd, shape, const_views(params), y);
  }
  return xd;
}

/// y = layer(x) with host inputs and outputs.
template <class T>
HostVec run_forward(Layer<T>& layer, const HostVec& x, ActShape shape,
                    const std::vector<Kokkos::View<T*>>& params) {
  Kokkos::View<T*> y("y", static_cast<std::size_t>(shape.rows() * layer.out_features()));
  forward_host_input(layer, x, shape, params, y);
  return to_host(y);
}

struct Gradients {
  HostVec dx;
  std::vector<HostVec> params;
};

/// Analytic gradients of L = sum(y * r): forward(x) then backward(dy = r) into zeroed grads.
template <class T>
Gradients run_backward(Layer<T>& layer, const HostVec& x, ActShape shape,
                       const std::vector<Kokkos::View<T*>>& params, const HostVec& r) {
  Kokkos::View<T*> y("y", static_cast<std::size_t>(shape.rows() * layer.out_features()));
  auto xd = forward_host_input(layer, x, shape, params, y);
  auto grads = zero_grads(layer);
  Kokkos::View<T*> dx("dx", xd.extent(0));
  layer.backward(to_device<T>(r, "dy"), const_views(params), grads, dx);
  Gradients g;
  g.dx = to_host(dx);
  for (auto& v : grads) g.params.push_back(to_host(v));
  return g;
}

}  // namespace kshard::test
