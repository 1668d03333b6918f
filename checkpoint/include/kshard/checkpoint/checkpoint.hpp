#pragma once
// Sharded checkpoints of an FsdpModel and its FusedAdam (docs/CHECKPOINTS.md).
//
//   kshard::SaveOptions so;
//   so.keep_last = 3;                                   // prune older ones
//   kshard::save_checkpoint("run/ckpt", step, model, adam, trainer_state, so);
//   ...
//   // later, on any world size and mesh, with the same layers:
//   if (auto info = kshard::load_latest_checkpoint("run/ckpt", model, adam)) {
//     step = info->step;  trainer_state = info->user_state;
//     if (info->recipe_changed) ...                     // saved under another recipe
//   }
//
// What is saved: per parameter (name, global shape, dtype, element range
// [start, start + count)) the f32 master and Adam's two moments (f32 or bf16,
// as the optimizer keeps them), the optimizer's step count, the recipe, the
// mesh, and `user_state`, an opaque JSON object (the trainer's scalar state:
// loss scaler, LR-schedule position, data position, RNG state, ...) handed
// back by load. Padding of the flat FSDP buffers is not part of the format,
// so a checkpoint loads onto any world size and mesh: each rank reads only
// the ranges its new shard owns (rounded out to the checksum blocks).
//
// Layout on disk: <save_dir>/step-<10 digits>/{manifest.json, shard-<rank>.bin}.
// Each writing rank (under HSDP only replica 0's ranks) writes one data file;
// rank 0 writes manifest.json last, after every data file was fsynced, into a
// temporary directory that is then renamed into place: a directory named
// step-N exists only when complete. An interrupted save leaves at most a
// ".tmp-step-N" directory, which no lookup takes for a checkpoint and the next
// successful save removes.
//
// Asynchronous saves (async_save.hpp, kshard::AsyncSaver): the same files,
// written by a background thread from a host snapshot while training goes
// on, committed by a later collective call.
//
// All functions but latest_checkpoint/list_checkpoints are collective over the
// model's world: every rank calls them with the same arguments. A problem on
// any rank (unreadable directory, missing or truncated file, checksum
// mismatch, manifest of another model, unknown format version, disk full) is
// a kshard::Error on EVERY rank naming the file and what is wrong, never a
// hang; a failed load leaves the model and optimizer unchanged.
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kshard/engine/fsdp/fsdp_model.hpp"
#include "kshard/optim/fused_adam.hpp"

namespace kshard {

struct SaveOptions {
  /// Keep only the newest `keep_last` complete checkpoints of the save
  /// directory after this one is committed (0: keep all).
  int keep_last = 0;
  /// Bytes per crc32 block (the granularity of verification, and of the
  /// extra bytes a resharded load reads at the edges of its ranges).
  std::int64_t crc_block_bytes = 1 << 20;
  /// fsync data files, manifest and directories (off only for benchmarks of
  /// the page cache).
  bool fsync = true;
};

struct SaveInfo {
  std::filesystem::path path;     ///< <save_dir>/step-<N>
  std::int64_t step = 0;
  std::uint64_t bytes_written = 0;  ///< by this rank (its data file)
  std::uint64_t total_bytes = 0;    ///< all data files together
  double seconds = 0;               ///< wall time of the whole save on this rank
  /// Of `seconds`, the time the caller was blocked in save calls: all of it
  /// for save_checkpoint; for an AsyncSaver the snapshot, the checks of
  /// poll() and wait(), and the commit.
  double blocked_seconds = 0;
  /// Writing and fsyncing this rank's data file (0: not a writer); on the
  /// background thread of an AsyncSaver, in the caller's time otherwise.
  double write_seconds = 0;
};

struct LoadInfo {
  std::filesystem::path path;
  std::int64_t step = 0;
  /// The object passed to save_checkpoint.
  nlohmann::json user_state;
  /// Recipe::describe() of the saving model, and whether it differs from the
  /// loading model's (the master is f32 either way, so it loads; the
  /// low-precision copies are re-derived from it).
  std::string saved_recipe;
  bool recipe_changed = false;
  std::vector<int> saved_mesh;
  int saved_world_size = 0;
  /// World size or mesh differ from the saving run's.
  bool resharded = false;
  /// Whether optimizer state was loaded (a FusedAdam was passed), and the
  /// moment dtype it was saved in ("f32"/"bf16"; converted when the
  /// optimizer keeps the other one: moments_converted).
  bool optimizer_loaded = false;
  std::string saved_moment_dtype;
  bool moments_converted = false;
  std::uint64_t bytes_read = 0;  ///< by this rank
  double seconds = 0;
};

/// Saves model (+ optimizer) state as <save_dir>/step-<step>. FusedAdam's
/// group g must be model unit g's shard (as kshard-train registers them).
/// A checkpoint of the same step already there is replaced. Collective.
SaveInfo save_checkpoint(const std::filesystem::path& save_dir, std::int64_t step,
                         FsdpModel& model, const FusedAdam& optimizer,
                         const nlohmann::json& user_state = nlohmann::json::object(),
                         const SaveOptions& options = {});
/// Model only (no optimizer state).
SaveInfo save_checkpoint(const std::filesystem::path& save_dir, std::int64_t step,
                         FsdpModel& model,
                         const nlohmann::json& user_state = nlohmann::json::object(),
                         const SaveOptions& options = {});

/// Loads the checkpoint directory `path` (a step-N directory) into model
/// and optimizer (moments and step count). Collective.
LoadInfo load_checkpoint(const std::filesystem::path& path, FsdpModel& model,
                         FusedAdam& optimizer);
/// Model only: the optimizer state in the checkpoint, if any, is ignored.
LoadInfo load_checkpoint(const std::filesystem::path& path, FsdpModel& model);

/// The newest complete checkpoint of save_dir (nullopt: none), as
/// latest_checkpoint() finds it on every rank (ranks that see different ones
/// are an error), loaded as load_checkpoint does. Collective.
std::optional<LoadInfo> load_latest_checkpoint(const std::filesystem::path& save_dir,
                                               FsdpModel& model, FusedAdam& optimizer);

/// Complete checkpoints of save_dir (step-N directories whose manifest.json
/// parses and says complete), oldest first. Local: no communication.
std::vector<std::filesystem::path> list_checkpoints(const std::filesystem::path& save_dir);
/// The last of list_checkpoints(save_dir), or nullopt. Local.
std::optional<std::filesystem::path> latest_checkpoint(const std::filesystem::path& save_dir);
/// "<save_dir>/step-0000000042".
std::filesystem::path checkpoint_path(const std::filesystem::path& save_dir, std::int64_t step);

}  // namespace kshard
