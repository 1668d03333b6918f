#include "comm_impl.hpp"

#include "trace_registry.hpp"

namespace kshard {

const char* reduce_op_name(ReduceOp op) noexcept {
  switch (op) {
    case ReduceOp::sum: return "sum";
    case ReduceOp::avg: return "avg";
    case ReduceOp::max: return "max";
    case ReduceOp::min: return "min";
  }
  return "?";
}

const char* backend_name(Backend b) noexcept { return b == Backend::mpi ? "mpi" : "nccl"; }

namespace detail {

CommImpl::CommImpl(MPI_Comm control, std::string name)
    : control_(control), trace_(std::make_shared<CollectiveTrace>(std::move(name))) {
  MPI_Comm_rank(control_, &rank_);
  MPI_Comm_size(control_, &size_);
  auto& reg = trace_registry();
  std::lock_guard<std::mutex> lock(reg.mu);
  reg.traces.push_back(trace_);
}

CommImpl::~CommImpl() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized && control_ != MPI_COMM_NULL && control_ != MPI_COMM_WORLD) MPI_Comm_free(&control_);
}

void CommImpl::barrier() {
  const auto seq = trace_->begin("barrier", 0, "-");
  MPI_Barrier(control_);
  trace_->finish(seq);
}

}  // namespace detail
}  // namespace kshard
