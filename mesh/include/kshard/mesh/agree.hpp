#pragma once
// Agreement among a communicator's ranks, on the host: did every rank
// succeed, does every rank hold the same values, and the small host
// reductions that decide either. Each function is collective over `comm`
// (every rank calls it, in the same order) and runs on the communicator's
// control channel (MPI for both backends): host values only, no stream, not
// ordered against the caller's kernels.
//
//   // A phase that may fail on some ranks only: every rank throws, or none.
//   kshard::run_agreed(comm, [&] { open_my_files(); });
//
//   // Values that must match everywhere (a step, a shape):
//   kshard::agree_same(comm, "saving a checkpoint", {{"the step", step}},
//                      "the same step on every rank");
//
// Why: a rank that fails alone and leaves would leave the others waiting in
// their next collective forever. Agreeing first turns one rank's error into
// the same error on every rank, and a mismatch into an error, not a hang.
#include <cstdint>
#include <exception>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "kshard/error.hpp"
#include "kshard/mesh/communicator.hpp"
#include "kshard/mesh/reduce_op.hpp"

namespace kshard {

/// Every rank passes its own outcome. No rank failed: returns on every rank.
/// Else every rank throws: a failing rank its own error, the others the error
/// of the lowest failing rank (its problem, expected and rank, so the message
/// names where it went wrong).
void agree_ok(const Communicator& comm, const std::optional<Error>& local);
/// As above, for any exception: a failing rank rethrows its own (its type
/// kept), the others the lowest failing rank's as a kshard::Error, its
/// problem prefixed by `context` (what this rank was doing: its own file name,
/// say, where each rank reads another) when that is given.
void agree_ok(const Communicator& comm, const std::exception_ptr& local,
              const std::string& context = {});
/// As above, with values every rank needs the maximum of riding in the same
/// message (a step that agrees anyway pays no second round trip): on return
/// `max_along` holds the element-wise maximum over the ranks.
void agree_ok(const Communicator& comm, const std::optional<Error>& local,
              std::vector<double>& max_along);

/// fn's outcome on this rank: nullopt, or what it threw as a kshard::Error.
std::optional<Error> run_local(const std::function<void()>& fn);
/// agree_ok(comm, run_local(fn)).
void run_agreed(const Communicator& comm, const std::function<void()>& fn);

/// One named value that every rank should hold alike.
struct AgreeField {
  std::string name;
  std::int64_t value;
};
/// Empty when every rank passed the same values; else, per differing field,
/// "<name> from <lo> to <hi> (this rank: <v>)", joined by "; ".
std::string disagreement(const Communicator& comm, const std::vector<AgreeField>& fields);
/// Throws Error("<what>: ranks disagree on " + disagreement(...), expected) on
/// every rank when the fields differ.
void agree_same(const Communicator& comm, const std::string& what,
                const std::vector<AgreeField>& fields, const std::string& expected);

/// In place: the element-wise reduction over the ranks (avg: the mean).
void host_all_reduce(const Communicator& comm, std::vector<double>& values, ReduceOp op);
void host_all_reduce(const Communicator& comm, std::vector<std::int64_t>& values, ReduceOp op);
/// Every rank's string, at `root`, in rank order; the other ranks get none.
std::vector<std::string> host_gather(const Communicator& comm, const std::string& mine,
                                     int root);

}  // namespace kshard
