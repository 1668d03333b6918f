#include "kshard/mesh/agree.hpp"

#include <mpi.h>

#include <algorithm>
#include <climits>
#include <cstddef>

#include "comm_impl.hpp"
#include "value_ranges.hpp"

namespace kshard {
namespace detail {

std::vector<ValueRange> value_ranges(MPI_Comm comm, const std::vector<std::int64_t>& mine) {
  const std::size_t n = mine.size();
  std::vector<std::int64_t> v(2 * n);
  for (std::size_t i = 0; i < n; ++i) {
    v[i] = mine[i];
    v[n + i] = -mine[i];  // max of -x is -(min of x)
  }
  MPI_Allreduce(MPI_IN_PLACE, v.data(), int(2 * n), MPI_INT64_T, MPI_MAX, comm);
  std::vector<ValueRange> r(n);
  for (std::size_t i = 0; i < n; ++i) r[i] = {-v[n + i], v[i]};
  return r;
}

}  // namespace detail

namespace {

MPI_Comm control(const Communicator& comm) { return comm.impl().control(); }

void bcast_string(std::string& s, int root, MPI_Comm c) {
  long long n = static_cast<long long>(s.size());
  MPI_Bcast(&n, 1, MPI_LONG_LONG, root, c);
  s.resize(static_cast<std::size_t>(n));
  if (n > 0) MPI_Bcast(s.data(), int(n), MPI_CHAR, root, c);
}

Error as_error(const std::exception_ptr& p) {
  try {
    std::rethrow_exception(p);
  } catch (const Error& e) {
    return e;
  } catch (const std::exception& e) {
    return Error(e.what(), "no error");
  } catch (...) {
    return Error("an exception that is not a std::exception", "no error");
  }
}

/// The one agreement: a max over (size - rank of a failing rank, values...)
/// names the lowest failing rank, whose error is then broadcast. Returns only
/// when no rank failed; a failing rank throws via `rethrow_own`.
void agree_core(const Communicator& comm, const std::optional<Error>& local,
                const std::function<void()>& rethrow_own, std::vector<double>* along,
                const std::string& context = {}) {
  const MPI_Comm c = control(comm);
  const int rank = comm.rank(), size = comm.size();
  std::vector<double> buf(1 + (along ? along->size() : 0));
  buf[0] = local ? double(size - rank) : 0.0;
  if (along)
    for (std::size_t i = 0; i < along->size(); ++i) buf[1 + i] = (*along)[i];
  MPI_Allreduce(MPI_IN_PLACE, buf.data(), int(buf.size()), MPI_DOUBLE, MPI_MAX, c);
  if (buf[0] == 0.0) {
    if (along)
      for (std::size_t i = 0; i < along->size(); ++i) (*along)[i] = buf[1 + i];
    return;
  }
  const int first = size - int(buf[0]);
  const bool mine = rank == first;
  std::string problem = mine ? local->problem() : std::string();
  std::string expected = mine ? local->expected() : std::string();
  int error_rank = mine ? local->rank() : 0;
  bcast_string(problem, first, c);
  bcast_string(expected, first, c);
  MPI_Bcast(&error_rank, 1, MPI_INT, first, c);
  if (local) rethrow_own();
  throw Error(context.empty() ? problem : context + ": " + problem, expected, error_rank);
}

}  // namespace

void agree_ok(const Communicator& comm, const std::optional<Error>& local) {
  agree_core(comm, local, [&] { throw *local; }, nullptr);
}

void agree_ok(const Communicator& comm, const std::exception_ptr& local,
              const std::string& context) {
  std::optional<Error> err;
  if (local) err = as_error(local);
  agree_core(comm, err, [&] { std::rethrow_exception(local); }, nullptr, context);
}

void agree_ok(const Communicator& comm, const std::optional<Error>& local,
              std::vector<double>& max_along) {
  agree_core(comm, local, [&] { throw *local; }, &max_along);
}

std::optional<Error> run_local(const std::function<void()>& fn) {
  try {
    fn();
  } catch (...) {
    return as_error(std::current_exception());
  }
  return std::nullopt;
}

void run_agreed(const Communicator& comm, const std::function<void()>& fn) {
  agree_ok(comm, run_local(fn));
}

std::string disagreement(const Communicator& comm, const std::vector<AgreeField>& fields) {
  std::vector<std::int64_t> mine;
  mine.reserve(fields.size());
  for (const AgreeField& f : fields) mine.push_back(f.value);
  const auto r = detail::value_ranges(control(comm), mine);
  std::string out;
  for (std::size_t i = 0; i < fields.size(); ++i) {
    if (r[i].lo == r[i].hi) continue;
    if (!out.empty()) out += "; ";
    out += fields[i].name + " from " + std::to_string(r[i].lo) + " to " + std::to_string(r[i].hi) +
           " (this rank: " + std::to_string(fields[i].value) + ")";
  }
  return out;
}

void agree_same(const Communicator& comm, const std::string& what,
                const std::vector<AgreeField>& fields, const std::string& expected) {
  const std::string d = disagreement(comm, fields);
  if (!d.empty()) throw Error(what + ": ranks disagree on " + d, expected);
}

namespace {
MPI_Op mpi_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum:
    case ReduceOp::avg: return MPI_SUM;
    case ReduceOp::max: return MPI_MAX;
    case ReduceOp::min: return MPI_MIN;
  }
  return MPI_SUM;
}
}  // namespace

void host_all_reduce(const Communicator& comm, std::vector<double>& values, ReduceOp op) {
  if (values.empty()) return;
  MPI_Allreduce(MPI_IN_PLACE, values.data(), int(values.size()), MPI_DOUBLE, mpi_op(op),
                control(comm));
  if (op == ReduceOp::avg)
    for (double& v : values) v /= comm.size();
}

void host_all_reduce(const Communicator& comm, std::vector<std::int64_t>& values, ReduceOp op) {
  // Checked before any message: the same call on every rank fails alike.
  if (op == ReduceOp::avg)
    throw Error("host_all_reduce of integers with avg (a mean is not an integer)",
                "sum, max or min for integers; doubles for a mean");
  if (values.empty()) return;
  MPI_Allreduce(MPI_IN_PLACE, values.data(), int(values.size()), MPI_INT64_T, mpi_op(op),
                control(comm));
}

std::vector<std::string> host_gather(const Communicator& comm, const std::string& mine,
                                     int root) {
  const MPI_Comm c = control(comm);
  const int rank = comm.rank(), size = comm.size();
  if (root < 0 || root >= size)
    throw Error("host_gather to root " + std::to_string(root) + " on " + comm.name(),
                "0 <= root < " + std::to_string(size));
  // Every rank learns every length (an all-gather, not a gather), so a
  // string or a total too large for MPI's int counts fails on every rank alike
  // (-1: this rank's string is too large).
  const int len = mine.size() > std::size_t(INT_MAX) ? -1 : int(mine.size());
  std::vector<int> lens(std::size_t(size), 0), displs(std::size_t(size), 0);
  MPI_Allgather(&len, 1, MPI_INT, lens.data(), 1, MPI_INT, c);
  long long total = 0;
  for (int r = 0; r < size; ++r) {
    if (lens[std::size_t(r)] < 0)
      throw Error("host_gather on " + comm.name() + ": rank " + std::to_string(r) +
                      "'s string is over " + std::to_string(INT_MAX) + " bytes",
                  "at most " + std::to_string(INT_MAX) + " bytes per rank");
    displs[std::size_t(r)] = int(std::min<long long>(total, INT_MAX));
    total += lens[std::size_t(r)];
  }
  if (total > INT_MAX)
    throw Error("host_gather of " + std::to_string(total) + " bytes in all on " + comm.name(),
                "at most " + std::to_string(INT_MAX) + " bytes in all");
  std::string all(rank == root ? std::size_t(total) : 0, '\0');
  MPI_Gatherv(mine.data(), len, MPI_CHAR, all.data(), lens.data(), displs.data(), MPI_CHAR, root,
              c);
  std::vector<std::string> out;
  if (rank != root) return out;
  out.reserve(std::size_t(size));
  for (int r = 0; r < size; ++r)
    out.push_back(all.substr(std::size_t(displs[std::size_t(r)]), std::size_t(lens[std::size_t(r)])));
  return out;
}

}  // namespace kshard
