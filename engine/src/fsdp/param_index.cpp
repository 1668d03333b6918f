#include "kshard/engine/fsdp/param_index.hpp"

#include <algorithm>

#include "kshard/error.hpp"

namespace kshard {

ParamIndex::ParamIndex(const std::vector<ParamSpec>& specs, int shard_size, std::int64_t align,
                       std::int64_t block)
    : shard_size_(shard_size) {
  if (shard_size < 1)
    throw Error("ParamIndex with shard size " + std::to_string(shard_size), "shard size >= 1");
  if (align < 1 || block < 1)
    throw Error("ParamIndex alignment " + std::to_string(align) + " / block " + std::to_string(block),
                "positive alignment and block size");
  std::int64_t off = 0;
  for (const ParamSpec& s : specs) {
    const std::int64_t n = s.numel();
    if (n < 0) throw Error("parameter '" + s.name + "' has a negative size", "numel >= 0");
    off = (off + align - 1) / align * align;
    entries_.push_back(ParamEntry{s.name, s.shape, s.init, off, n});
    off += n;
    param_numel_ += n;
  }
  const std::int64_t unit = std::int64_t(shard_size) * block;
  flat_numel_ = std::max<std::int64_t>(unit, (off + unit - 1) / unit * unit);
}

std::pair<std::int64_t, std::int64_t> ParamIndex::shard_range(int r) const {
  if (r < 0 || r >= shard_size_)
    throw Error("shard rank " + std::to_string(r) + " out of range",
                "0 <= shard rank < " + std::to_string(shard_size_));
  return {r * shard_numel(), (r + 1) * shard_numel()};
}

std::vector<ParamIndex::Piece> ParamIndex::pieces_in_shard(std::size_t i, int r) const {
  const ParamEntry& e = entry(i);
  const auto [b, end] = shard_range(r);
  const std::int64_t lo = std::max(b, e.offset), hi = std::min(end, e.offset + e.numel);
  if (lo >= hi) return {};
  return {Piece{lo - e.offset, lo, hi - lo}};
}

}  // namespace kshard
