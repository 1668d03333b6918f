// Built when kshard has no NCCL (host builds): asking for NCCL is a clear error.
#include "../comm_impl.hpp"
#include "kshard/error.hpp"

namespace kshard::detail {

bool nccl_available() noexcept { return false; }

std::shared_ptr<CommImpl> make_nccl_comm(MPI_Comm, const std::string& name) {
  throw Error("NCCL communicator '" + name + "' requested, but kshard was built without NCCL",
              "backend mpi here, or a build with the cuda preset (KSHARD_ENABLE_NCCL=ON)");
}

}  // namespace kshard::detail
