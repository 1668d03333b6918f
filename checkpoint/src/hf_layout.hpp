#pragma once
// Where a kshard model's tensors go in Hugging Face's layout, shared by
// export_hf and import_hf: the unit kinds a config implies, and the pieces
// (names, rows, transposes) of each kshard parameter.
#include <cstddef>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kshard/checkpoint/hf_config.hpp"
#include "kshard/dtype.hpp"
#include "kshard/engine/fsdp/fsdp_model.hpp"
#include "safetensors_layout.hpp"

namespace kshard::detail {

/// config.json as export_hf writes it.
nlohmann::json hf_config_json(const HfConfig& config, DType dtype);

/// kshard::Error ("<who>: ...", local) unless the model is the shape the
/// config names, unit by unit, with the same tie_word_embeddings.
void check_hf_model(const FsdpModel& model, const HfConfig& config, const std::string& who);

/// Hugging Face's tensors of kshard tensor (unit, entry): kshard::Error when
/// the config has no place for it or another shape.
std::vector<ExportPiece> hf_pieces(const HfConfig& config, std::size_t unit, const ParamEntry& entry,
                                   const std::string& who);

}  // namespace kshard::detail
