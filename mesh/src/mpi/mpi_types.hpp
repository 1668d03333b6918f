#pragma once
// Private: MPI datatypes and reduction ops for kshard's dtypes. MPI knows no
// bf16/fp16, so they travel as 16-bit words and reduce through user ops that
// widen to float and round back to nearest-even.
#include <mpi.h>

#include "kshard/dtype.hpp"
#include "../comm_impl.hpp"

namespace kshard::detail {
MPI_Datatype mpi_datatype(DType t);
/// The MPI op that computes `op` (avg: the sum; the caller divides).
MPI_Op mpi_op(ReduceOp op, DType t);
/// Frees the user ops; called by Session before MPI_Finalize.
void mpi_free_ops();
}  // namespace kshard::detail
