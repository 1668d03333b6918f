#include "kshard/mesh/mpi_interop.hpp"

#include "comm_impl.hpp"

namespace kshard {

MPI_Comm mpi_comm(const Communicator& comm) { return comm.impl().control(); }

}  // namespace kshard
