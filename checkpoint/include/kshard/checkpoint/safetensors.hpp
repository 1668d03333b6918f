#pragma once
// Consolidated safetensors export and import of an FsdpModel's parameters
// (the f32 master), one standard .safetensors file for the whole model.
//
//   kshard::export_safetensors(model, "model.safetensors");            // f32
//   kshard::export_safetensors(model, "model.bf16.safetensors", kshard::DType::bf16);
//   kshard::import_safetensors(other_model, "model.safetensors");      // any mesh
//
// Names: "<unit>.<param>", e.g. "layers.1.attn.qkv.weight"; shapes as the
// layers declare them (Linear weights [out, in], ...): docs/CHECKPOINTS.md
// lists them and how qkv is packed, so a Python user can load them into a
// model of their own (safetensors.numpy.load_file / safetensors.torch).
//
// Export: every rank takes part (one unit is all-gathered at a time, so no
// rank ever holds more than one unit unsharded); rank 0 writes the file to
// "<path>.partial", fsyncs it and renames it into place. Import: each rank
// reads only the element ranges its shard owns, converts F32/BF16/F16/F64 to
// the f32 master and re-derives the low-precision copies. Both collective;
// errors (a missing tensor, another shape, a truncated file, a bad header)
// are a kshard::Error on every rank naming the file.
#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "kshard/dtype.hpp"
#include "kshard/engine/fsdp/fsdp_model.hpp"

namespace kshard {

struct SafetensorsTensor {
  std::string name;
  DType dtype = DType::f32;
  std::vector<std::int64_t> shape;
  std::int64_t begin = 0, end = 0;  ///< data_offsets, relative to the data section
};

struct SafetensorsHeader {
  std::int64_t data_start = 0;  ///< 8 + header length
  std::int64_t file_bytes = 0;
  std::vector<SafetensorsTensor> tensors;  ///< in file order
  std::map<std::string, std::string> metadata;
  const SafetensorsTensor* find(const std::string& name) const;
};

/// Parses and validates a file's header (kshard::Error naming the file).
/// Local: no communication.
SafetensorsHeader read_safetensors_header(const std::filesystem::path& file);

/// dtype: DType::f32 or DType::bf16 (rounded to nearest even). Collective.
void export_safetensors(FsdpModel& model, const std::filesystem::path& file,
                        DType dtype = DType::f32,
                        const std::map<std::string, std::string>& metadata = {});
/// Sets every parameter of the model from the file. Collective.
void import_safetensors(FsdpModel& model, const std::filesystem::path& file);

}  // namespace kshard
