#pragma once
// Opt-in MPI interop: the one public kshard header that includes <mpi.h>.
// The library's other headers are MPI-free, so a program that uses only
// kshard's API compiles without MPI's include path; one that also calls MPI
// itself includes this header and links MPI (MPI::MPI_CXX) itself.
#include <mpi.h>

#include "kshard/mesh/communicator.hpp"

namespace kshard {

/// The MPI communicator over the same ranks, in the same order: the MPI
/// backend's own, or the NCCL backend's control communicator. Owned by
/// `comm` (do not free it); it stays valid while `comm` (or a copy) lives.
/// Messages on it must not interleave with kshard's agreement calls from
/// another thread.
MPI_Comm mpi_comm(const Communicator& comm);

}  // namespace kshard
