#include "reshard.hpp"

#include <algorithm>

namespace kshard::detail {

std::vector<ReadOp> plan_reads(const std::vector<SavedPiece>& pieces, std::int64_t begin,
                               std::int64_t count, std::int64_t elem_size,
                               std::int64_t crc_block_bytes) {
  std::vector<ReadOp> ops;
  const std::int64_t end = begin + count;
  for (const SavedPiece& p : pieces) {
    const std::int64_t lo = std::max(begin, p.start), hi = std::min(end, p.start + p.count);
    if (lo >= hi) continue;
    // Byte range of the wanted elements inside the piece, widened to blocks.
    const std::int64_t want_lo = (lo - p.start) * elem_size, want_hi = (hi - p.start) * elem_size;
    const std::int64_t piece_bytes = p.count * elem_size;
    const std::int64_t b0 = want_lo / crc_block_bytes;
    const std::int64_t b1 = (want_hi + crc_block_bytes - 1) / crc_block_bytes;
    ReadOp op;
    op.piece = &p;
    op.file = p.file;
    op.file_offset = p.offset + b0 * crc_block_bytes;
    op.bytes = std::min(b1 * crc_block_bytes, piece_bytes) - b0 * crc_block_bytes;
    op.first_block = b0;
    op.skip_bytes = want_lo - b0 * crc_block_bytes;
    op.dst_begin = lo - begin;
    op.count = hi - lo;
    ops.push_back(op);
  }
  return ops;
}

}  // namespace kshard::detail
