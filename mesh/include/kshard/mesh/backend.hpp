#pragma once
// Backend: which library moves a communicator's data (see communicator.hpp).
namespace kshard {

enum class Backend { mpi, nccl };

/// "mpi" or "nccl".
const char* backend_name(Backend b) noexcept;

}  // namespace kshard
