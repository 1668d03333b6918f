#pragma once
// How a model's tensors are laid out in an exported safetensors file: the
// one writer behind export_safetensors (kshard's names, as the layers declare
// them) and export_hf (Hugging Face's names, fused tensors split, GPT-2's
// Conv1D weights transposed), and the pieces both importers share.
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "kshard/dtype.hpp"
#include "kshard/engine/fsdp/fsdp_model.hpp"

namespace kshard::detail {

/// One tensor of the file: rows [row_begin, row_end) of a model tensor seen
/// as [rows = shape[0], cols = numel / rows], written as they are, or
/// transposed ([cols, rows]: a Linear's [out, in] as a Conv1D's [in, out]).
struct ExportPiece {
  std::string name;
  std::vector<std::int64_t> shape;  ///< as written
  std::int64_t row_begin = 0, row_end = 0;
  bool transpose = false;
};

/// The pieces model tensor (unit, entry) is written as (none: left out).
/// Called with the same arguments on every rank; may throw kshard::Error
/// (before any collective, so on every rank).
using ExportLayout = std::function<std::vector<ExportPiece>(std::size_t unit, const ParamEntry&)>;

/// Collective: every unit with a piece in the file is all-gathered once (one
/// at a time), rank 0 writes "<file>.partial", fsyncs it and renames it into
/// place.
void write_safetensors(FsdpModel& model, const std::filesystem::path& file, DType dtype,
                       const std::map<std::string, std::string>& metadata,
                       const ExportLayout& layout);

/// Bytes of a file dtype (F32, F64, BF16 or F16) -> f32.
void decode_to_f32(const char* src, DType dtype, std::int64_t n, float* dst);
/// safetensors' name of a dtype ("F32", "BF16", ...).
const char* safetensors_dtype_name(DType dtype);
/// Reads every unit's shard of this rank: fill(unit, entry, piece, dst) for
/// each piece of parameter `entry` that the shard holds, dst pointing where
/// the piece's first element goes; padding stays zero. Local.
using ShardFill = std::function<void(std::size_t unit, std::size_t entry, const ParamIndex::Piece& piece,
                                     float* dst)>;
std::vector<std::vector<float>> read_shards(const FsdpModel& model, const ShardFill& fill);

/// Sets each unit's f32 master shard to staging[unit] (the shard's elements)
/// and re-derives the low-precision copies. Local (no communication).
void set_master_shards(FsdpModel& model, const std::vector<std::vector<float>>& staging);

}  // namespace kshard::detail
