#include "agree.hpp"

#include <mpi.h>

#include <climits>
#include <exception>
#include <string>
#include <vector>

namespace kshard::ckpt {
namespace {

void bcast_string(std::string& s, int root, MPI_Comm comm) {
  long long n = static_cast<long long>(s.size());
  MPI_Bcast(&n, 1, MPI_LONG_LONG, root, comm);
  s.resize(static_cast<std::size_t>(n));
  if (n > 0) MPI_Bcast(s.data(), int(n), MPI_CHAR, root, comm);
}

}  // namespace

void agree(const Communicator& comm, const std::optional<Error>& local) {
  // MPI on the communicator's control comm: it works for every backend (the
  // NCCL one keeps an MPI communicator over the same ranks) and on host data.
  MPI_Comm c = comm.mpi_comm();
  int rank = 0;
  MPI_Comm_rank(c, &rank);
  int first = local ? rank : INT_MAX;
  MPI_Allreduce(MPI_IN_PLACE, &first, 1, MPI_INT, MPI_MIN, c);
  if (first == INT_MAX) return;
  std::string problem = local && rank == first ? local->problem() : std::string();
  std::string expected = local && rank == first ? local->expected() : std::string();
  int error_rank = local && rank == first ? local->rank() : 0;
  bcast_string(problem, first, c);
  bcast_string(expected, first, c);
  MPI_Bcast(&error_rank, 1, MPI_INT, first, c);
  if (local) throw *local;
  throw Error(problem, expected, error_rank);
}

std::optional<Error> run_local(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e;
  } catch (const std::exception& e) {
    return Error(e.what(), "no error");
  }
  return std::nullopt;
}

void run_agreed(const Communicator& comm, const std::function<void()>& f) {
  agree(comm, run_local(f));
}

}  // namespace kshard::ckpt
