#pragma once
// Deterministic parameter initialisation, identical on every backend and for
// every sharding.
//
// Element i of a parameter gets a value that depends only on (seed, key, i),
// where key names the parameter (use its fully qualified name, e.g.
// "layers.3.attn.qkv.weight", so that equal local names in different layers
// differ). The generator is counter-based (a splitmix64 finaliser applied to
// a Weyl sequence position), so a rank can fill just its shard, starting at
// the shard's first global element index, and get exactly the slice that an
// unsharded fill would produce.
//
//   kshard::Init w = kshard::Init::uniform_fan_in(in);
//   kshard::fill_init<float>(shard_view, w, /*seed=*/42, "layers.0.weight",
//                            /*first_index=*/rank * shard_numel);
//
// zeros/ones/uniform are bit-identical on host and CUDA (the uniform draw is
// one exactly rounded multiply of an exactly representable number). normal
// uses Box-Muller (log, sqrt, cos), whose libm results may differ in the last
// double ulp between host and device; after rounding to float that almost
// never shows.
#include <cstdint>
#include <string>
#include <string_view>

#include <Kokkos_Core.hpp>

namespace kshard {

struct Init {
  enum class Kind { zeros, ones, normal, uniform };
  Kind kind = Kind::zeros;
  double mean = 0.0;   ///< normal: mean
  double scale = 0.0;  ///< normal: standard deviation; uniform: half-width b of U(-b, b)

  static Init zeros() { return {Kind::zeros, 0.0, 0.0}; }
  static Init ones() { return {Kind::ones, 0.0, 0.0}; }
  static Init normal(double std, double mean = 0.0) { return {Kind::normal, mean, std}; }
  static Init uniform(double bound) { return {Kind::uniform, 0.0, bound}; }
  /// U(-1/sqrt(fan_in), 1/sqrt(fan_in)): PyTorch's nn.Linear default for weight and bias.
  static Init uniform_fan_in(std::int64_t fan_in);

  std::string describe() const;  ///< e.g. "normal(0, 0.02)", for logs and manifests
};

/// 64-bit key of a parameter name (FNV-1a), mixed into the generator's stream.
std::uint64_t init_key(std::string_view name) noexcept;

/// out[j] = value of global element (first_index + j) of the parameter `key`.
template <class T>
void fill_init(Kokkos::View<T*> out, const Init& init, std::uint64_t seed, std::string_view key,
               std::int64_t first_index = 0);

namespace detail {
// The generator itself, usable in kernels: a 53-bit uniform in [0, 1) for
// counter `i` of stream `stream`.
KOKKOS_INLINE_FUNCTION std::uint64_t splitmix64(std::uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
KOKKOS_INLINE_FUNCTION double uniform01(std::uint64_t stream, std::uint64_t i) {
  // Weyl step of splitmix64 at position i of the stream, then its finaliser.
  const std::uint64_t bits = splitmix64(stream + i * 0x9e3779b97f4a7c15ull);
  return static_cast<double>(bits >> 11) * (1.0 / 9007199254740992.0);  // 2^-53
}
/// Stream of (seed, key): both pass through the finaliser so nearby seeds decorrelate.
KOKKOS_INLINE_FUNCTION std::uint64_t init_stream(std::uint64_t seed, std::uint64_t key) {
  return splitmix64(splitmix64(seed) ^ key);
}
}  // namespace detail

}  // namespace kshard
