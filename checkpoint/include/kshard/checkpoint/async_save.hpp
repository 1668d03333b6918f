#pragma once
// kshard::AsyncSaver: save_checkpoint without stopping training for the
// file writes (PyTorch DCP's async_save; docs/CHECKPOINTS.md, "Asynchronous
// saves").
//
//   kshard::AsyncSaver saver;
//   saver.start("run/ckpt", step, model, adam, trainer_state, so);  // snapshot, then write
//   while (training) {
//     if (auto done = saver.poll()) ...   // committed: done->path is a checkpoint now
//     train_step();                       // meanwhile a thread writes this rank's file
//   }
//   saver.wait();                         // commit (or the error) before leaving
//
// start() does, on the calling thread, what save_checkpoint does before its
// writes (arguments agreed, the temporary directory made), then copies this
// rank's shards (f32 master and Adam's moments) into host buffers kept
// across saves, and takes the optimizer's step count and user_state as they
// are. A background thread writes and fsyncs this rank's data file from
// those copies; the model and optimizer may change as soon as start()
// returns. The thread makes no MPI call: the collective rest (every rank's
// write agreed, rank 0's manifest.json, the rename of .tmp-step-N to step-N,
// keep_last pruning) runs in poll() or wait(), on the calling thread. The
// files are those save_checkpoint writes, byte for byte.
//
// poll(), wait(), start() and the destructor are the only places a pending
// save advances; poll() and wait() are collective over the model's world and
// every rank must call them at the same points (the Trainer polls at the
// start of each step). A failed write on any rank (disk full, unwritable
// directory) is a kshard::Error on every rank from the poll() or wait() that
// learns of it, naming the rank and the file; the temporary directory is
// removed and earlier checkpoints stay as they were. A rank that dies while
// writing leaves only .tmp-step-N.
#include <filesystem>
#include <memory>
#include <optional>

#include <nlohmann/json.hpp>

#include "kshard/checkpoint/checkpoint.hpp"

namespace kshard {

class AsyncSaver {
 public:
  AsyncSaver();
  /// Waits for a background write still running (no MPI call, no
  /// exception): a save not committed stays a .tmp-step-N directory, never a
  /// checkpoint. Call wait() first to commit it and to learn of a failure.
  ~AsyncSaver();
  AsyncSaver(const AsyncSaver&) = delete;
  AsyncSaver& operator=(const AsyncSaver&) = delete;

  /// Starts saving as save_checkpoint(save_dir, step, model, optimizer,
  /// user_state, options) would; a save still pending is finished first
  /// (wait()). Collective; returns once the snapshot is taken.
  void start(const std::filesystem::path& save_dir, std::int64_t step, FsdpModel& model,
             const FusedAdam& optimizer,
             const nlohmann::json& user_state = nlohmann::json::object(),
             const SaveOptions& options = {});
  /// Model only (no optimizer state).
  void start(const std::filesystem::path& save_dir, std::int64_t step, FsdpModel& model,
             const nlohmann::json& user_state = nlohmann::json::object(),
             const SaveOptions& options = {});

  /// Allocates the host snapshot that start() fills (pinned memory under
  /// CUDA, slow to allocate), so that no save pays for it. Optional; call
  /// before training, when the optimizer's state exists. Local: on ranks that
  /// do not write (HSDP replicas other than 0) it allocates nothing.
  void reserve(FsdpModel& model, const FusedAdam& optimizer);

  /// A save was started and is neither committed nor failed yet. Local; the
  /// same on every rank.
  bool pending() const noexcept;
  /// With a save pending (else nullopt, no communication): one small
  /// all-reduce of every rank's "written / failed / still writing". All
  /// written: commits and returns the SaveInfo. Any failed: waits for the
  /// other ranks' writes, removes the temporary directory and throws
  /// kshard::Error on every rank. Else nullopt. Collective.
  std::optional<SaveInfo> poll();
  /// Waits for every rank's write, then commits as poll() does (nullopt:
  /// nothing pending). Collective.
  std::optional<SaveInfo> wait();

 private:
  struct Impl;
  void begin(const std::filesystem::path& save_dir, std::int64_t step, FsdpModel& model,
             const FusedAdam* optimizer, const nlohmann::json& user_state,
             const SaveOptions& options);
  std::optional<SaveInfo> finish(double blocked_before);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kshard
