#pragma once
// ParamIndex: where each parameter of an FSDP unit lives in the unit's flat
// buffer, and which slice of that buffer each rank owns.
//
//   kshard::ParamIndex idx(layer.param_specs(), /*shard_size=*/4);
//   idx.entry(0).offset;      // element offset of the first parameter
//   idx.shard_numel();        // elements per rank (padded flat / 4)
//   idx.shard_range(r);       // [begin, end) of the flat buffer on rank r
//
// Parameters are laid out in spec order, each starting at a multiple of
// `align` elements (so every full parameter View is aligned for vector loads
// and cuBLAS); the flat buffer is padded to a multiple of shard_size *
// `block` elements, so every shard is the same size and a whole number of
// fp8 scaling blocks. Padding elements are zero and get zero gradients.
// Ranks at the end may own only padding, or part of a parameter.
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "kshard/engine/nn/layer.hpp"

namespace kshard {

struct ParamEntry {
  std::string name;
  std::vector<std::int64_t> shape;
  Init init;
  std::int64_t offset = 0;  // in the flat buffer
  std::int64_t numel = 0;
};

class ParamIndex {
 public:
  static constexpr std::int64_t default_align = 32;
  static constexpr std::int64_t default_block = 128;

  ParamIndex() = default;
  ParamIndex(const std::vector<ParamSpec>& specs, int shard_size,
             std::int64_t align = default_align, std::int64_t block = default_block);

  const std::vector<ParamEntry>& entries() const noexcept { return entries_; }
  const ParamEntry& entry(std::size_t i) const { return entries_.at(i); }
  std::size_t size() const noexcept { return entries_.size(); }
  /// Sum of numel, without alignment gaps or padding.
  std::int64_t param_numel() const noexcept { return param_numel_; }
  /// Flat buffer elements, padded.
  std::int64_t flat_numel() const noexcept { return flat_numel_; }
  std::int64_t shard_numel() const noexcept { return flat_numel_ / shard_size_; }
  int shard_size() const noexcept { return shard_size_; }
  std::pair<std::int64_t, std::int64_t> shard_range(int shard_rank) const;
  /// Parts of parameter i inside shard `shard_rank`: {param offset, flat offset, count}.
  struct Piece {
    std::int64_t param_begin, flat_begin, count;
  };
  std::vector<Piece> pieces_in_shard(std::size_t i, int shard_rank) const;

 private:
  std::vector<ParamEntry> entries_;
  std::int64_t param_numel_ = 0;
  std::int64_t flat_numel_ = 0;
  int shard_size_ = 1;
};

}  // namespace kshard
