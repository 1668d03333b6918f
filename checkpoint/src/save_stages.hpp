#pragma once
// The three stages of a save (writer.cpp), so that the synchronous save runs
// them in a row and the asynchronous one (async_save.cpp) runs the middle one
// on a background thread:
//
//  1. begin_save (collective, calling thread): arguments agreed, the
//     temporary directory created, this rank's plan of pieces and the
//     manifest less its files fixed from the model as it is now;
//  2. write_local_file (local, any thread): this rank's data file from host
//     copies of its shards, fsynced; no MPI and no Kokkos when the host
//     copies are a snapshot, so it may run while training goes on;
//  3. finish_save (collective, calling thread): every rank's outcome of 2
//     agreed, descriptions gathered, rank 0 writes manifest.json, renames
//     .tmp-step-N to step-N and prunes.
// A failure in 2 or 3 is an error on every rank, and rank 0 removes the
// temporary directory; a rank that dies leaves it behind, never a step-N.
#include <cstdint>
#include <filesystem>
#include <optional>
#include <vector>

#include <nlohmann/json.hpp>

#include "kshard/checkpoint/checkpoint.hpp"
#include "kshard/checkpoint/manifest.hpp"
#include "kshard/error.hpp"
#include "kshard/mesh/communicator.hpp"

namespace kshard::detail {

/// One piece this rank writes: elements [start, start + count) of parameter
/// `param` of `unit`, tensor `kind`, at `offset` of its file.
struct Planned {
  std::size_t unit = 0, param = 0;
  int kind = 0;
  std::int64_t start = 0, count = 0;
  std::int64_t shard_elem = 0;  // where the data starts in the rank's shard
  std::int64_t offset = 0, bytes = 0;
};

/// Test hook, read from KSHARD_CHECKPOINT_TEST_FAULT="<kind>:<world rank>:<step>"
/// in stage 1 (so the background thread never reads the environment): that
/// rank, saving that step, once half of its data file is written, _exits(3)
/// (exit), fails as if the disk were full (enospc) or pauses for a second
/// (slow). Used by tests/checkpoint and tests/train: an interrupted save never
/// yields a loadable directory, a failed background write is an error on
/// every rank, and training goes on while a slow write is pending.
enum class TestFault { none, exit, enospc, slow };

/// A save from stage 1 on: everything stages 2 and 3 need, independent of
/// the live model and optimizer (which an asynchronous save lets change).
struct SaveJob {
  std::filesystem::path save_dir, tmp, final_path;
  std::int64_t step = 0;
  SaveOptions options;
  Communicator world;
  int rank = 0;
  bool writer = false;       ///< writes a data file (under HSDP: replica 0 only)
  bool with_optimizer = false;
  TestFault fault = TestFault::none;  ///< this rank's, for this step
  std::vector<Planned> pieces;  ///< this rank's, in file order (writers only)
  /// Rank 0: the manifest as of stage 1 (optimizer step count, user state),
  /// without files and pieces.
  Manifest manifest;
};

/// Where stage 2 reads this rank's shard tensors from, unit by unit.
class HostShards {
 public:
  virtual ~HostShards() = default;
  /// Bytes of tensor `kind` (0 master, 1 exp_avg, 2 exp_avg_sq) of unit u,
  /// valid until the next call.
  virtual const char* tensor(std::size_t unit, int kind) = 0;
};

/// What stage 2 produced on this rank.
struct LocalWrite {
  nlohmann::json description;  ///< the data file's pieces (null: not a writer)
  std::uint64_t bytes = 0;
  double seconds = 0;
};

/// Whether this rank writes a data file: every rank of a 1-D mesh, under
/// HSDP only the ranks of replica 0 (the others hold the same shards).
bool writes_data(const DeviceMesh& mesh);

/// Stage 1. Collective; kshard::Error on every rank when any rank objects.
SaveJob begin_save(const std::filesystem::path& save_dir, std::int64_t step, FsdpModel& model,
                   const FusedAdam* optimizer, const nlohmann::json& user_state,
                   const SaveOptions& options);

/// Stage 2: this rank's data file (nothing on a non-writer). Local; throws
/// kshard::Error naming the file. Honours job.fault.
LocalWrite write_local_file(const SaveJob& job, HostShards& shards);

/// Stage 3, given this rank's outcome of stage 2 (an error or its write).
/// Collective; kshard::Error on every rank when any rank's stage 2 or the
/// commit failed (rank 0 then removes the temporary directory). Fills
/// bytes_written, total_bytes and write_seconds of the returned SaveInfo.
SaveInfo finish_save(const SaveJob& job, const std::optional<Error>& local_error,
                     const LocalWrite& local);

}  // namespace kshard::detail
