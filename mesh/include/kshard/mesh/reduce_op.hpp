#pragma once
// ReduceOp: how a reducing collective combines the ranks' values.
namespace kshard {

enum class ReduceOp { sum, avg, max, min };

/// "sum", "avg", "max" or "min".
const char* reduce_op_name(ReduceOp op) noexcept;

}  // namespace kshard
