#pragma once
// The manifest of a sharded checkpoint (manifest.json): what was saved, where
// each byte range of each parameter lies, and its checksums. The format is
// described in docs/CHECKPOINTS.md; this is its in-memory form.
//
//   kshard::Manifest m = kshard::read_manifest(dir / "manifest.json");  // validated
//   for (const auto& u : m.units) ...
//
// Invariants read_manifest checks (else kshard::Error naming the file): the
// format name and version are known; every tensor's pieces are sorted,
// do not overlap and cover [0, numel) exactly; every piece lies in a listed
// file, inside its size, with one crc32 per block of crc_block_bytes.
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kshard/dtype.hpp"

namespace kshard {

/// One contiguous element range of one tensor in one data file.
struct SavedPiece {
  std::int64_t start = 0;   ///< first element (row-major index into the parameter)
  std::int64_t count = 0;   ///< elements
  int file = 0;             ///< index into Manifest::files
  std::int64_t offset = 0;  ///< byte offset in that file
  std::vector<std::uint32_t> crc32;  ///< one per crc block of the piece's bytes
};

/// One saved tensor of a parameter: "master" (f32), "exp_avg", "exp_avg_sq".
struct SavedTensor {
  std::string kind;
  DType dtype = DType::f32;
  std::vector<SavedPiece> pieces;
};

struct SavedParam {
  std::string name;  ///< local name in its unit ("attn.qkv.weight")
  std::vector<std::int64_t> shape;
  std::int64_t numel = 0;
  std::vector<SavedTensor> tensors;
  const SavedTensor* tensor(const std::string& kind) const;
};

struct SavedUnit {
  std::string name;  ///< "layers.3"
  std::string kind;  ///< "TransformerLayer"
  std::vector<SavedParam> params;
};

struct SavedFile {
  std::string name;  ///< relative to the checkpoint directory
  std::int64_t bytes = 0;
};

struct Manifest {
  static constexpr const char* format_name = "kshard-checkpoint";
  static constexpr int format_version = 1;

  std::int64_t step = 0;
  std::string recipe;   ///< Recipe::describe()
  std::vector<int> mesh;
  std::vector<std::string> mesh_dims;
  int world_size = 0;
  std::int64_t crc_block_bytes = 0;
  bool has_optimizer = false;
  std::int64_t optimizer_step = 0;
  DType moment_dtype = DType::f32;
  nlohmann::json user_state = nlohmann::json::object();
  /// FsdpModel::fp8_state() (delayed fp8 scaling; empty otherwise): small and
  /// the same on every rank, so it lives here rather than in the data files.
  std::vector<float> fp8_state;
  std::vector<SavedFile> files;
  std::vector<SavedUnit> units;

  nlohmann::json to_json() const;
  /// Parses and validates; `source` names the file in errors.
  static Manifest from_json(const nlohmann::json& j, const std::string& source);
};

/// Reads and validates a manifest file (kshard::Error naming it otherwise).
Manifest read_manifest(const std::filesystem::path& file);

}  // namespace kshard
