#pragma once
// Helpers of the train suites: a tiny language model, token files written
// by the test itself, sub-meshes of the first n ranks, host copies.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <unistd.h>
#include <vector>

#include <Kokkos_Core.hpp>

#include <kshard/engine/nn/embedding.hpp>
#include <kshard/engine/fsdp/fsdp_model.hpp>
#include <kshard/engine/nn/layer_norm.hpp>
#include <kshard/engine/nn/linear.hpp>
#include <kshard/engine/nn/transformer_layer.hpp>
#include <kshard/mesh/device_mesh.hpp>
#include <kshard/train/token_source.hpp>

namespace train_test {

constexpr std::int64_t kVocab = 40, kWidth = 16, kHeads = 2, kSeq = 8;

inline std::vector<kshard::LayerDef> tiny_lm() {
  return {kshard::layer<kshard::Embedding>(kVocab, kWidth, kSeq),
          kshard::layer<kshard::TransformerLayer>(kWidth, kHeads, 4 * kWidth),
          kshard::layer<kshard::LayerNorm>(kWidth),
          kshard::layer<kshard::Linear>(kWidth, kVocab)};
}

/// splitmix64, for test data independent of the library's own generator use.
inline std::uint64_t mix(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

/// A learnable token stream: mostly t -> (5 t + 3) mod vocab.
inline std::vector<std::uint32_t> make_tokens(std::int64_t n, std::uint64_t seed) {
  std::vector<std::uint32_t> t(static_cast<std::size_t>(n));
  std::uint32_t cur = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    const std::uint64_t r = mix(seed * 1000003ULL + std::uint64_t(i));
    cur = (r % 10 < 8) ? std::uint32_t((5 * cur + 3) % kVocab) : std::uint32_t((r >> 8) % kVocab);
    t[std::size_t(i)] = cur;
  }
  return t;
}

/// A file private to this rank (same content on every rank when the tokens
/// are), removed by the destructor. width 2 or 4 bytes, little-endian;
/// extra_bytes appends that many stray bytes.
class TempTokenFile {
 public:
  TempTokenFile(const std::string& tag, int rank, const std::vector<std::uint32_t>& tokens,
                int width = 2, int extra_bytes = 0) {
    path_ = "/tmp/kshard_train_test_" + std::to_string(::getpid()) + "_" + std::to_string(rank) +
            "_" + tag + ".bin";
    std::FILE* f = std::fopen(path_.c_str(), "wb");
    for (std::uint32_t v : tokens) {
      unsigned char b[4] = {static_cast<unsigned char>(v & 0xff),
                            static_cast<unsigned char>((v >> 8) & 0xff),
                            static_cast<unsigned char>((v >> 16) & 0xff),
                            static_cast<unsigned char>((v >> 24) & 0xff)};
      std::fwrite(b, 1, std::size_t(width), f);
    }
    for (int i = 0; i < extra_bytes; ++i) std::fputc(7, f);
    std::fclose(f);
  }
  ~TempTokenFile() { std::remove(path_.c_str()); }
  TempTokenFile(const TempTokenFile&) = delete;
  TempTokenFile& operator=(const TempTokenFile&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

/// Sequences of a token vector held in memory (no file): sequence g is the
/// window at (7 g) mod (n - seq). Deterministic, cheap, independent of TokenFile.
class VectorSource final : public kshard::TokenSource {
 public:
  explicit VectorSource(std::vector<std::uint32_t> t) : t_(std::move(t)) {}
  void fill(std::uint64_t, std::int64_t first, std::int64_t count, std::int64_t seq,
            std::int32_t* ids, std::int32_t* targets) const override {
    for (std::int64_t i = 0; i < count; ++i) {
      const std::int64_t o = ((first + i) * 7) % (std::int64_t(t_.size()) - seq);
      for (std::int64_t k = 0; k < seq; ++k) {
        ids[i * seq + k] = std::int32_t(t_[std::size_t(o + k)]);
        targets[i * seq + k] = std::int32_t(t_[std::size_t(o + k + 1)]);
      }
    }
  }
  std::string describe() const override { return "test vector"; }

 private:
  std::vector<std::uint32_t> t_;
};

/// The communicator of world ranks [0, n) (valid there; the others get the
/// rest of the world, which they do not use).
inline kshard::Communicator first_ranks(const kshard::Communicator& world, int n) {
  const bool in = world.rank() < n;
  return world.split(in ? 0 : 1, world.rank(), in ? "first" + std::to_string(n) : "rest");
}

template <class T>
std::vector<T> to_host(const Kokkos::View<T*>& v) {
  auto m = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), v);
  return std::vector<T>(m.data(), m.data() + m.size());
}

inline std::uint32_t bits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}
inline std::uint64_t bits(double d) {
  std::uint64_t u;
  std::memcpy(&u, &d, sizeof u);
  return u;
}

/// Bitwise equality of per-unit parameter lists (kshard::test::gather_master_parameters).
inline bool same_bits(const std::vector<std::vector<float>>& a,
                      const std::vector<std::vector<float>>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (a[i].size() != b[i].size()) return false;
    for (std::size_t k = 0; k < a[i].size(); ++k)
      if (bits(a[i][k]) != bits(b[i][k])) return false;
  }
  return true;
}

}  // namespace train_test
