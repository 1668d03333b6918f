#pragma once
// Every rank gets the same verdict. Checkpoint I/O fails locally (one rank's
// file is truncated, one rank's disk is full), but a rank that goes on into
// the next collective while another throws would hang the job. So each phase
// runs locally, then the ranks agree: if any rank failed, every rank throws,
// the failing rank its own error and the others the lowest failing rank's
// message (broadcast), so every rank's error names the file and the problem.
#include <functional>
#include <optional>

#include "kshard/error.hpp"
#include "kshard/mesh/communicator.hpp"

namespace kshard::ckpt {

/// Throws on every rank of comm if `local` holds an error on any rank.
void agree(const Communicator& comm, const std::optional<Error>& local);

/// Runs f, turning any exception into a kshard::Error (std::filesystem,
/// nlohmann::json and allocation failures included), then agree().
void run_agreed(const Communicator& comm, const std::function<void()>& f);

/// The same, returning the error instead of agreeing (for phases that must
/// still take part in collectives after a local failure).
std::optional<Error> run_local(const std::function<void()>& f);

}  // namespace kshard::ckpt
