#pragma once
// Host <-> device helpers of the fp8 cast tests (test_fp8_tensor.cpp,
// test_fp8_blockwise.cpp): bf16 test values, upload, download, hex floats.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include <Kokkos_Core.hpp>

#include "kshard/numeric/convert.hpp"

namespace kshard_test {

/// bf16 values of varied magnitude (2^-20 .. 2^20) with zeros and negatives.
inline std::vector<float> bf16_values(std::size_t n, std::uint32_t seed, int emin = -20, int emax = 20) {
  std::mt19937 rng(seed);
  std::vector<float> v(n);
  for (auto& x : v) {
    const std::uint32_t r = rng();
    float f = float(std::ldexp(double(r & 0xFFFF) / 65536.0 + 0.5, emin + int(rng() % (emax - emin + 1))));
    if ((r >> 16) % 13 == 0) f = 0.0f;
    if ((r >> 20) & 1) f = -f;
    x = kshard::to_float(kshard::from_float<kshard::bfloat16_t>(f));  // exactly representable
  }
  return v;
}

inline Kokkos::View<kshard::bfloat16_t*> upload(const std::vector<float>& h) {
  Kokkos::View<kshard::bfloat16_t*> d("x", h.size());
  auto m = Kokkos::create_mirror_view(d);
  for (std::size_t i = 0; i < h.size(); ++i) m(i) = kshard::from_float<kshard::bfloat16_t>(h[i]);
  Kokkos::deep_copy(d, m);
  return d;
}

template <class T>
std::vector<T> download(const Kokkos::View<T*>& d) {
  auto m = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), d);
  return std::vector<T>(m.data(), m.data() + m.extent(0));
}

inline std::string show(float v) {
  char b[64];
  std::snprintf(b, sizeof b, "%a", double(v));
  return b;
}

}  // namespace kshard_test
