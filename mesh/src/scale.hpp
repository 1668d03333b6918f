#pragma once
// Private: in-place element-wise division, the second half of an "avg"
// reduction on backends without a native average (MPI).
#include <cstddef>

#include "kshard/dtype.hpp"
#include "comm_impl.hpp"

namespace kshard::detail {
void divide_in_place(void* data, std::size_t count, DType dtype, int divisor, MemKind mem);
}
