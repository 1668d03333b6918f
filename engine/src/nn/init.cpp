#include "kshard/engine/nn/init.hpp"
#include "kshard/compat/kokkos.hpp"

#include <cmath>
#include <sstream>

#include "kshard/error.hpp"

namespace kshard {

Init Init::uniform_fan_in(std::int64_t fan_in) {
  if (fan_in <= 0)
    throw Error("Init::uniform_fan_in(" + std::to_string(fan_in) + ")", "fan_in > 0");
  return uniform(1.0 / std::sqrt(static_cast<double>(fan_in)));
}

std::string Init::describe() const {
  std::ostringstream s;
  switch (kind) {
    case Kind::zeros: s << "zeros"; break;
    case Kind::ones: s << "ones"; break;
    case Kind::normal: s << "normal(" << mean << ", " << scale << ")"; break;
    case Kind::uniform: s << "uniform(" << -scale << ", " << scale << ")"; break;
  }
  return s.str();
}

std::uint64_t init_key(std::string_view name) noexcept {
  std::uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char ch : name) {
    h ^= ch;
    h *= 0x100000001b3ull;
  }
  return h;
}

namespace detail {
// Kernels live in free functions in a named namespace (nvcc's extended-lambda rules).
template <class T>
void fill_init_kernel(Kokkos::View<T*> out, Init::Kind kind, double mean, double scale,
                      std::uint64_t stream, std::int64_t first) {
  const std::int64_t n = static_cast<std::int64_t>(out.extent(0));
  switch (kind) {
    case Init::Kind::zeros: Kokkos::deep_copy(out, T(0)); return;
    case Init::Kind::ones: Kokkos::deep_copy(out, T(1)); return;
    case Init::Kind::uniform:
      Kokkos::parallel_for(
          "kshard::fill_init_uniform", Kokkos::RangePolicy<>(0, n), KOKKOS_LAMBDA(std::int64_t j) {
            const double u = uniform01(stream, static_cast<std::uint64_t>(first + j));
            // 2u - 1 is exact for a 53-bit u, so the only rounding is the multiply.
            out(j) = static_cast<T>((2.0 * u - 1.0) * scale);
          });
      return;
    case Init::Kind::normal:
      Kokkos::parallel_for(
          "kshard::fill_init_normal", Kokkos::RangePolicy<>(0, n), KOKKOS_LAMBDA(std::int64_t j) {
            const std::uint64_t i = static_cast<std::uint64_t>(first + j);
            // Two draws per element (counters 2i, 2i+1): Box-Muller, cosine branch.
            const double u1 = 1.0 - uniform01(stream, 2 * i);  // (0, 1]: log is finite
            const double u2 = uniform01(stream, 2 * i + 1);
            const double r = compat::sqrt(-2.0 * compat::log(u1));
            const double z = r * compat::cos(6.283185307179586 * u2);
            out(j) = static_cast<T>(mean + scale * z);
          });
      return;
  }
}
}  // namespace detail

template <class T>
void fill_init(Kokkos::View<T*> out, const Init& init, std::uint64_t seed, std::string_view key,
               std::int64_t first_index) {
  if (first_index < 0)
    throw Error("fill_init: first_index=" + std::to_string(first_index), "first_index >= 0");
  if ((init.kind == Init::Kind::normal || init.kind == Init::Kind::uniform) &&
      !(init.scale >= 0.0 && std::isfinite(init.scale)))
    throw Error("fill_init: " + init.describe(), "a finite, non-negative scale");
  detail::fill_init_kernel<T>(out, init.kind, init.mean, init.scale,
                              detail::init_stream(seed, init_key(key)), first_index);
}

template void fill_init<float>(Kokkos::View<float*>, const Init&, std::uint64_t,
                               std::string_view, std::int64_t);
template void fill_init<double>(Kokkos::View<double*>, const Init&, std::uint64_t,
                                std::string_view, std::int64_t);

}  // namespace kshard
