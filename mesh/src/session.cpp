#include "kshard/mesh/session.hpp"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>
#include <thread>

#include "comm_impl.hpp"
#include "device.hpp"
#include "kshard/core/memory_tracker.hpp"
#include "mpi/mpi_types.hpp"

namespace kshard {
namespace {
Session* g_session = nullptr;

std::string requested_backend(const SessionOptions& o) {
  if (!o.backend.empty()) return o.backend;
  const char* env = std::getenv("KSHARD_BACKEND");
  return env && *env ? std::string(env) : std::string("auto");
}
}  // namespace

Session::Session(int& argc, char**& argv, SessionOptions options) {
  if (g_session)
    throw Error("a second kshard::Session was constructed", "one Session per process");
  const auto t0 = std::chrono::steady_clock::now();
  if (options.line_buffered_stderr) {
    std::setvbuf(stderr, nullptr, _IOLBF, BUFSIZ);
    std::cerr.unsetf(std::ios::unitbuf);
  }

  int inited = 0;
  MPI_Initialized(&inited);
  if (!inited) {
    int provided = 0;
    MPI_Init_thread(&argc, &argv,
                    options.thread_multiple ? MPI_THREAD_MULTIPLE : MPI_THREAD_FUNNELED, &provided);
    owns_mpi_ = true;
  }
  // Errors in MPI calls come back as codes we turn into kshard::Error where it
  // matters; the default handler would abort without saying which rank or why.
  MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
  MPI_Comm_size(MPI_COMM_WORLD, &size_);
  set_error_rank(rank_);

  MPI_Comm node;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node);
  MPI_Comm_rank(node, &local_rank_);
  MPI_Comm_size(node, &local_size_);
  MPI_Comm_free(&node);

  const int ndev = detail::device_count();
  if (ndev > 0) {
    device_id_ = local_rank_ % ndev;
    device_sharers_ = local_size_ / ndev + (device_id_ < local_size_ % ndev ? 1 : 0);
  }

  if (!Kokkos::is_initialized()) {
    compat::initialize_kokkos(argc, argv, device_id_);
    owns_kokkos_ = true;
  }
  memory::install();
  mpi_world_ = Communicator(detail::make_mpi_comm(MPI_COMM_WORLD, "world"));
  exit_comm_ = Communicator(detail::make_mpi_comm(MPI_COMM_WORLD, "world.exit"));
  try {
    choose_backend(options, ndev);
  } catch (...) {
    // The same on every rank (same inputs, agreed sharing): every rank
    // tears down alike and the caller may simply report and return.
    tear_down();
    throw;
  }
  g_session = this;
  init_s_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void Session::choose_backend(const SessionOptions& options, int ndev) {
  // The default backend must be the same on every rank.
  int max_sharers = device_sharers_;
  MPI_Allreduce(MPI_IN_PLACE, &max_sharers, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  const std::string want = requested_backend(options);
  const bool nccl_ok = detail::nccl_available() && ndev > 0 && max_sharers == 1;
  if (want == "auto") {
    default_backend_ = nccl_ok ? Backend::nccl : Backend::mpi;
  } else if (want == "mpi") {
    default_backend_ = Backend::mpi;
  } else if (want == "nccl") {
    if (!nccl_ok) {
      const std::string why =
          !detail::nccl_available() ? "kshard was built without NCCL"
          : ndev == 0              ? "no GPU is visible"
                                   : std::to_string(max_sharers) + " ranks share one GPU";
      throw Error("backend nccl requested but " + why,
                  "one GPU per rank and a build with NCCL (else KSHARD_BACKEND=mpi)");
    }
    default_backend_ = Backend::nccl;
  } else {
    throw Error("unknown backend '" + want + "' (KSHARD_BACKEND or SessionOptions::backend)",
                "auto, mpi or nccl");
  }
}

void Session::tear_down() noexcept {
  exit_comm_ = Communicator();
  nccl_world_ = Communicator();
  mpi_world_ = Communicator();
  detail::mpi_free_ops();
  if (owns_kokkos_) Kokkos::finalize();
  if (owns_mpi_) MPI_Finalize();
  owns_kokkos_ = owns_mpi_ = false;
}

int Session::agreed_exit_code(int code, double timeout_s) {
  const MPI_Comm c = exit_comm_.impl().control();
  MPI_Request req;
  MPI_Ibarrier(c, &req);
  const auto t0 = std::chrono::steady_clock::now();
  int done = 0;
  while (!done) {
    MPI_Test(&req, &done, MPI_STATUS_IGNORE);
    if (done) break;
    if (code != 0 &&
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() > timeout_s) {
      std::fprintf(stderr,
                   "[rank %d] kshard: not every rank ended within %.0f s of this rank's error; "
                   "aborting the job so that no rank hangs\n",
                   rank_, timeout_s);
      std::fflush(stderr);
      MPI_Abort(MPI_COMM_WORLD, code);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  int worst = code;
  MPI_Allreduce(MPI_IN_PLACE, &worst, 1, MPI_INT, MPI_MAX, c);
  return worst;
}

Session::~Session() {
  // A diagnostic like NCCL_DEBUG: what the last peak (since reset_peak) was made of.
  if (const char* rep = std::getenv("KSHARD_MEMORY_REPORT"); rep && *rep && *rep != '0') {
    const std::string text = "[rank " + std::to_string(rank_) + "] kshard memory at the last peak:\n" +
                             memory::peak_report();
    std::fprintf(stderr, "%s", text.c_str());
    std::fflush(stderr);
  }
  tear_down();
  g_session = nullptr;
}

Session& Session::current() {
  if (!g_session)
    throw Error("no kshard::Session is alive", "a kshard::Session constructed at the top of main");
  return *g_session;
}

bool Session::active() noexcept { return g_session != nullptr; }

const Communicator& Session::world() { return world(default_backend_); }

const Communicator& Session::world(Backend backend) {
  if (backend == Backend::mpi) return mpi_world_;
  if (!nccl_world_.valid()) {
    const auto t0 = std::chrono::steady_clock::now();
    nccl_world_ = Communicator(detail::make_nccl_comm(MPI_COMM_WORLD, "world.nccl"));
    init_s_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  return nccl_world_;
}

}  // namespace kshard
