#pragma once
// What a test can reach: the suite's Session and communicators. They exist
// from the global fixture's set-up to its tear-down; world_rank()/world_size()
// work from main's MPI_Init on, so datasets (data::make_delayed) may use them.
#include <mpi.h>

#include "kshard/mesh/communicator.hpp"
#include "kshard/mesh/session.hpp"

namespace kshard::testing {

kshard::Session& session();
/// World communicator of the suite's default backend (KSHARD_BACKEND).
const kshard::Communicator& world();
int world_rank() noexcept;
int world_size() noexcept;
/// The harness' own MPI communicator (a dup of MPI_COMM_WORLD): collective
/// checks and per-test synchronisation never share tags with the code under test.
MPI_Comm harness_comm() noexcept;
/// Name of the running test case ("suite/case"), empty between tests.
std::string current_test();

}  // namespace kshard::testing
