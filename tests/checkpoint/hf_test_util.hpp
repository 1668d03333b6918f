#pragma once
// Shared by the Hugging Face export and import suites: an f32 model of an
// HfConfig's shape (kshard::hf_layers), token
// ids on the device, and the raw little-endian files the Python stages write.
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <memory>
#include <vector>

#include <Kokkos_Core.hpp>

#include <kshard/checkpoint/hf_config.hpp>
#include <kshard/checkpoint/hf_layers.hpp>
#include <kshard/engine/fsdp/fsdp_model.hpp>
#include <kshard/error.hpp>

namespace hf_test {

/// An f32 model of config's shape whose position table (gpt2) has
/// config.max_positions rows, initialised with `seed`.
inline std::unique_ptr<kshard::FsdpModel> build_model(const kshard::DeviceMesh& mesh,
                                                      const kshard::HfConfig& c, std::uint64_t seed = 7) {
  kshard::FsdpOptions o;
  o.tie_word_embeddings = c.tie_word_embeddings;
  auto m = std::make_unique<kshard::FsdpModel>(mesh, kshard::hf_layers(c), kshard::Recipe::parse("fp32"), o);
  m->init_parameters(seed);
  return m;
}

inline Kokkos::View<std::int32_t*> to_device(const std::vector<std::int32_t>& v) {
  Kokkos::View<std::int32_t*> d("ids", v.size());
  auto h = Kokkos::create_mirror_view(d);
  for (std::size_t i = 0; i < v.size(); ++i) h(i) = v[i];
  Kokkos::deep_copy(d, h);
  return d;
}

/// A file of raw little-endian T values.
template <class T>
std::vector<T> read_raw(const std::filesystem::path& file) {
  std::ifstream in(file, std::ios::binary | std::ios::ate);
  if (!in) throw kshard::Error("cannot read " + file.string(), "the Python stage's output");
  std::vector<T> v(std::size_t(in.tellg()) / sizeof(T));
  in.seekg(0);
  in.read(reinterpret_cast<char*>(v.data()), std::streamsize(v.size() * sizeof(T)));
  return v;
}

template <class T>
void write_raw(const std::filesystem::path& file, const T* data, std::size_t n) {
  std::ofstream(file, std::ios::binary).write(reinterpret_cast<const char*>(data), std::streamsize(n * sizeof(T)));
}

}  // namespace hf_test
