#pragma once
// Private: the backend interface behind kshard::Communicator. Backends (mpi/,
// nccl/) implement it on raw buffers; Communicator's templates check Views and
// forward here. Kept out of the public headers so that they need no <mpi.h>.
#include <mpi.h>

#include <cstddef>
#include <memory>
#include <string>

#include "kshard/dtype.hpp"
#include "kshard/mesh/backend.hpp"
#include "kshard/mesh/detail/coll_args.hpp"
#include "kshard/mesh/reduce_op.hpp"
#include "kshard/mesh/request.hpp"
#include "kshard/mesh/trace.hpp"

namespace kshard {

namespace detail {

class CommImpl {
 public:
  CommImpl(MPI_Comm control, std::string name);
  virtual ~CommImpl();
  CommImpl(const CommImpl&) = delete;
  CommImpl& operator=(const CommImpl&) = delete;

  int rank() const noexcept { return rank_; }
  int size() const noexcept { return size_; }
  const std::string& name() const noexcept { return trace_->name(); }
  /// MPI communicator over the same ranks (NCCL comms keep one for control).
  MPI_Comm control() const noexcept { return control_; }
  CollectiveTrace& trace() noexcept { return *trace_; }
  const std::shared_ptr<CollectiveTrace>& trace_handle() const noexcept { return trace_; }
  bool validate() const noexcept { return validate_; }
  void set_validate(bool on) noexcept { validate_ = on; }

  virtual Backend backend() const noexcept = 0;
  /// Runs one collective on checked, agreed arguments. Returns nullptr when
  /// the operation is already complete (always so when args.blocking is set).
  virtual std::unique_ptr<PendingOp> collective(CollKind kind, const CollArgs& a) = 0;
  virtual void barrier();
  /// Same ranks grouping as MPI_Comm_split; collective over this communicator.
  virtual std::shared_ptr<CommImpl> split(int color, int key, const std::string& name) = 0;

 protected:
  MPI_Comm control_;  // owned: freed in the destructor

 private:
  int rank_ = 0;
  int size_ = 1;
  bool validate_ = true;
  std::shared_ptr<CollectiveTrace> trace_;
};

std::shared_ptr<CommImpl> make_mpi_comm(MPI_Comm comm_to_dup, const std::string& name);
/// NCCL communicator over the ranks of `comm` (unique id broadcast over MPI).
/// Throws kshard::Error when kshard was built without NCCL.
std::shared_ptr<CommImpl> make_nccl_comm(MPI_Comm comm, const std::string& name);
bool nccl_available() noexcept;

}  // namespace detail
}  // namespace kshard
