#pragma once
// Session: the one owner, per process, of MPI, Kokkos and the world
// communicators. Construct it first thing in main (or in a test suite's
// global fixture) and let it go out of scope last.
//
//   int main(int argc, char** argv) {
//     kshard::Session session(argc, argv);
//     const kshard::Communicator& world = session.world();   // default backend
//     ...
//   }
//
// The GPU is chosen by node-local rank modulo the node's GPU count, so several
// ranks may share one GPU. world() is NCCL when kshard was built with NCCL and
// every rank of a node has a GPU of its own, MPI otherwise; KSHARD_BACKEND=mpi
// or =nccl overrides (nccl with shared GPUs is an error: NCCL needs one GPU per
// rank). The NCCL communicator is created on first use. A constructor that
// throws (e.g. an unknown backend) has undone what it set up, MPI included.
#include <memory>
#include <string>

#include "kshard/mesh/communicator.hpp"

namespace kshard {

struct SessionOptions {
  /// "auto" (default, or KSHARD_BACKEND), "mpi" or "nccl".
  std::string backend = "";
  /// Initialise MPI with MPI_THREAD_MULTIPLE (else MPI_THREAD_FUNNELED).
  bool thread_multiple = false;
  /// Make stderr line-buffered (and std::cerr flushed only by its writer:
  /// std::endl, flush) before MPI and Kokkos start, so each line leaves the
  /// process in one piece. The launcher merges every rank's stderr as it
  /// reads it; a line written piecewise (`std::cerr << a << b` writes twice,
  /// Kokkos' start-up warnings are written so) can otherwise be completed by
  /// another rank's line, and that rank's message no longer starts a line.
  bool line_buffered_stderr = true;
};

class Session {
 public:
  Session(int& argc, char**& argv, SessionOptions options = {});
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  /// The live session; throws kshard::Error when there is none.
  static Session& current();
  static bool active() noexcept;

  int rank() const noexcept { return rank_; }
  int size() const noexcept { return size_; }
  int local_rank() const noexcept { return local_rank_; }
  int local_size() const noexcept { return local_size_; }
  /// GPU used by this rank, -1 on host-only builds.
  int device_id() const noexcept { return device_id_; }
  /// Number of ranks on this node that share this rank's GPU (1 = own GPU).
  int device_sharers() const noexcept { return device_sharers_; }

  /// World communicator of the default backend (see above).
  const Communicator& world();
  /// World communicator of a given backend (NCCL: created on first call).
  const Communicator& world(Backend backend);
  Backend default_backend() const noexcept { return default_backend_; }
  /// Seconds MPI_Init, Kokkos initialisation and NCCL set-up took on this rank.
  double init_seconds() const noexcept { return init_s_; }

  /// The job's exit code, the same on every rank: call it at the end of main
  /// on every rank with this rank's code (0: success). Returns the largest
  /// code over the ranks once all have called it. A rank that failed alone
  /// may leave the others waiting in a collective that never completes; a
  /// failing rank (code != 0) therefore waits at most `timeout_s` for the
  /// others and then aborts the whole job with its code instead of hanging.
  /// Ranks that succeeded wait without a limit (a slow peer is not a stuck one).
  int agreed_exit_code(int code, double timeout_s = 10.0);

 private:
  int rank_ = 0, size_ = 1, local_rank_ = 0, local_size_ = 1, device_id_ = -1,
      device_sharers_ = 1;
  bool owns_mpi_ = false;
  bool owns_kokkos_ = false;
  double init_s_ = 0;
  Backend default_backend_ = Backend::mpi;
  Communicator mpi_world_;
  Communicator nccl_world_;
  // A private duplicate of the world for agreed_exit_code(): its barrier
  // cannot match a collective that some rank is stuck in.
  Communicator exit_comm_;

  void choose_backend(const SessionOptions& options, int ndev);
  void tear_down() noexcept;
};

}  // namespace kshard
