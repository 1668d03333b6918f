#pragma once
// The save directory: step-numbered checkpoints, their temporary twins, and
// keeping the last K.
#include <cstdint>
#include <filesystem>
#include <optional>

namespace kshard::detail {

/// ".tmp-step-0000000042": where a save of that step is written before the rename.
std::filesystem::path temporary_path(const std::filesystem::path& save_dir, std::int64_t step);
/// The step of a "step-<digits>" directory name, or nullopt.
std::optional<std::int64_t> step_of(const std::filesystem::path& name);
/// Removes all but the newest `keep` complete checkpoints, and leftover
/// temporary directories of interrupted saves (rank 0, after a commit).
void prune(const std::filesystem::path& save_dir, int keep);

}  // namespace kshard::detail
