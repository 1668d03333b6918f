#pragma once
// Resharding by range intersection: a rank's new shard owns elements
// [begin, begin + count) of a parameter (ParamIndex::pieces_in_shard); the
// checkpoint holds that parameter as pieces saved by the old ranks. The
// reads are the intersections, widened to whole crc blocks of each saved
// piece so that every byte read is verified. Pure: no I/O, no Kokkos.
#include <cstdint>
#include <vector>

#include "kshard/checkpoint/manifest.hpp"

namespace kshard::detail {

struct ReadOp {
  const SavedPiece* piece = nullptr;
  int file = 0;
  std::int64_t file_offset = 0;  ///< first byte to read (a crc block boundary of the piece)
  std::int64_t bytes = 0;        ///< bytes to read (whole blocks; the piece's last may be short)
  std::int64_t first_block = 0;  ///< index into piece->crc32 of the first block read
  std::int64_t skip_bytes = 0;   ///< wanted data starts this far into the read bytes
  std::int64_t dst_begin = 0;    ///< element offset of that data relative to `begin`
  std::int64_t count = 0;        ///< wanted elements
};

/// Reads covering [begin, begin + count) of a tensor saved as `pieces`
/// (sorted, covering the parameter: Manifest's invariant).
std::vector<ReadOp> plan_reads(const std::vector<SavedPiece>& pieces, std::int64_t begin,
                               std::int64_t count, std::int64_t elem_size,
                               std::int64_t crc_block_bytes);

}  // namespace kshard::detail
