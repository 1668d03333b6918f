#pragma once
// Private: the smallest and largest value of each field over a communicator's
// ranks, in one host reduction: MPI_Allreduce(MAX) over (x, -x). The one
// primitive behind every "do all ranks hold the same values" check
// (agree_same, the collectives' argument check, the mesh shape).
#include <mpi.h>

#include <cstdint>
#include <vector>

namespace kshard::detail {

struct ValueRange {
  std::int64_t lo, hi;
};

std::vector<ValueRange> value_ranges(MPI_Comm comm, const std::vector<std::int64_t>& mine);

}  // namespace kshard::detail
