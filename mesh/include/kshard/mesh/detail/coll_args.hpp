#pragma once
// A collective's arguments as Communicator's templates hand them to the
// backend interface (CommImpl, private to the mesh library). Not part of the
// user-facing API; free of any backend's headers.
#include <cstddef>

#include "kshard/dtype.hpp"
#include "kshard/mesh/reduce_op.hpp"

namespace kshard::detail {

class CommImpl;  // the backend interface: mesh/src/comm_impl.hpp

enum class MemKind { host, device };
enum class CollKind { all_gather, reduce_scatter, all_reduce, broadcast };

/// A collective's arguments on this rank, as the backends see them.
struct CollArgs {
  const void* send = nullptr;
  void* recv = nullptr;
  std::size_t send_count = 0;  // elements
  std::size_t recv_count = 0;  // elements
  DType dtype = DType::f32;
  MemKind mem = MemKind::host;
  ReduceOp op = ReduceOp::sum;
  int root = 0;
  bool blocking = false;  // backends may use their faster blocking call
};

}  // namespace kshard::detail
