// The MPI backend. Host memory goes to MPI directly; device memory is staged
// through pinned host buffers (this keeps the backend correct whether or not
// the MPI library is CUDA-aware). Blocking calls use MPI's blocking
// collectives, which are markedly faster than the non-blocking ones in Open
// MPI's libnbc for large messages.
#include <climits>
#include <cstring>
#include <string>
#include <vector>

#include <Kokkos_Core.hpp>

#include "../comm_impl.hpp"
#include "../scale.hpp"
#include "kshard/compat/kokkos.hpp"
#include "kshard/error.hpp"
#include "mpi_types.hpp"

namespace kshard::detail {
namespace {

using StageView = Kokkos::View<char*, compat::StagingSpace>;
template <class Space>
using Bytes = Kokkos::View<char*, Space, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
template <class Space>
using ConstBytes = Kokkos::View<const char*, Space, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;

void copy_to_host(void* host, const void* dev, std::size_t n) {
  if (n == 0) return;
  Kokkos::deep_copy(Bytes<compat::StagingSpace>(static_cast<char*>(host), n),
                    ConstBytes<compat::DeviceSpace>(static_cast<const char*>(dev), n));
}
void copy_to_device(void* dev, const void* host, std::size_t n) {
  if (n == 0) return;
  Kokkos::deep_copy(Bytes<compat::DeviceSpace>(static_cast<char*>(dev), n),
                    ConstBytes<compat::StagingSpace>(static_cast<const char*>(host), n));
}


// What remains to do once MPI has finished: copy staged results back, divide for avg.
struct Completion {
  CollArgs args;
  StageView recv_stage;   // empty: results are already in args.recv
  StageView send_stage;   // kept alive until MPI is done with it
  std::size_t recv_bytes = 0;
  int divisor = 1;

  void run() {
    if (recv_stage.data()) copy_to_device(args.recv, recv_stage.data(), recv_bytes);
    if (divisor != 1) divide_in_place(args.recv, args.recv_count, args.dtype, divisor, args.mem);
  }
};

class MpiOp final : public PendingOp {
 public:
  MpiOp(MPI_Request req, Completion c) : req_(req), c_(std::move(c)) {}
  void wait() override {
    MPI_Wait(&req_, MPI_STATUS_IGNORE);
    c_.run();
  }
  bool test() override {
    int flag = 0;
    MPI_Test(&req_, &flag, MPI_STATUS_IGNORE);
    return flag != 0;
  }

 private:
  MPI_Request req_;
  Completion c_;
};

class MpiComm final : public CommImpl {
 public:
  MpiComm(MPI_Comm owned, std::string name) : CommImpl(owned, std::move(name)) {}

  Backend backend() const noexcept override { return Backend::mpi; }
  std::shared_ptr<CommImpl> split(int color, int key, const std::string& name) override {
    MPI_Comm c;
    MPI_Comm_split(control_, color, key, &c);
    return std::make_shared<MpiComm>(c, name);
  }

 private:
  // Blocking calls reuse one staging pair per communicator. Non-blocking ones
  // take a buffer from a per-communicator list that no operation in flight
  // holds (an op keeps its View, so use_count() == 1 means free), or add one:
  // a training step's requests repeat, so after the first step nothing is
  // allocated. Both are labelled as caches for the harness' leak check.
  StageView staging(StageView& cache, std::size_t bytes, bool blocking, const char* /*label*/) {
    if (!blocking) {
      for (auto& v : async_stages_)
        if (v.use_count() == 1 && v.extent(0) >= bytes && v.extent(0) <= 2 * bytes + 4096)
          return v;
      async_stages_.emplace_back(Kokkos::view_alloc(Kokkos::WithoutInitializing,
                                                    std::string("kshard.cache:mpi_staging_async")),
                                 bytes);
      return async_stages_.back();
    }
    if (cache.extent(0) < bytes)
      cache = StageView(Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string("kshard.cache:mpi_staging")),
                        bytes);
    return cache;
  }

  std::unique_ptr<PendingOp> collective(CollKind kind, const CollArgs& a) override {
    // Collectives see all work launched before them on the default space.
    Kokkos::fence();
    if (a.send_count > std::size_t(INT_MAX) || a.recv_count > std::size_t(INT_MAX))
      throw Error("MPI collective of " + std::to_string(std::max(a.send_count, a.recv_count)) +
                      " elements",
                  "at most INT_MAX (2^31 - 1) elements per call on the MPI backend");
    const std::size_t es = dtype_size(a.dtype);
    const std::size_t sbytes = a.send_count * es, rbytes = a.recv_count * es;
    const MPI_Datatype dt = mpi_datatype(a.dtype);
    const int n_send = int(a.send_count), n_recv = int(a.recv_count);

    // In place: all_reduce/broadcast on one buffer, all_gather from its own block.
    const std::size_t own_offset = std::size_t(rank()) * sbytes;
    const bool in_place =
        kind == CollKind::broadcast ||
        (kind == CollKind::all_reduce && a.send == a.recv) ||
        (kind == CollKind::all_gather && a.send == static_cast<const char*>(a.recv) + own_offset);

    Completion c;
    c.args = a;
    c.recv_bytes = rbytes;
    if (a.op == ReduceOp::avg && (kind == CollKind::reduce_scatter || kind == CollKind::all_reduce))
      c.divisor = size();

    const void* s = a.send;
    void* r = a.recv;
    if (a.mem == MemKind::device) {
      c.recv_stage = staging(recv_cache_, rbytes, a.blocking, "kshard.mpi_staging");
      r = c.recv_stage.data();
      if (in_place) {
        if (kind == CollKind::all_gather)
          copy_to_host(static_cast<char*>(r) + own_offset, a.send, sbytes);
        else
          copy_to_host(r, a.recv, rbytes);
      } else {
        c.send_stage = staging(send_cache_, sbytes, a.blocking, "kshard.mpi_staging");
        copy_to_host(c.send_stage.data(), a.send, sbytes);
        s = c.send_stage.data();
      }
    }
    const void* sp = in_place ? MPI_IN_PLACE : s;
    if (rbytes == 0 && sbytes == 0) {
      // Zero-size collectives still synchronise the ranks, as MPI's do.
      MPI_Barrier(control_);
      return nullptr;
    }

    MPI_Request req = MPI_REQUEST_NULL;
    const MPI_Op op = mpi_op(a.op, a.dtype);
    switch (kind) {
      case CollKind::all_gather:
        if (a.blocking)
          MPI_Allgather(sp, n_send, dt, r, n_send, dt, control_);
        else
          MPI_Iallgather(sp, n_send, dt, r, n_send, dt, control_, &req);
        break;
      case CollKind::reduce_scatter:
        if (a.blocking)
          MPI_Reduce_scatter_block(s, r, n_recv, dt, op, control_);
        else
          MPI_Ireduce_scatter_block(s, r, n_recv, dt, op, control_, &req);
        break;
      case CollKind::all_reduce:
        if (a.blocking)
          MPI_Allreduce(sp, r, n_recv, dt, op, control_);
        else
          MPI_Iallreduce(sp, r, n_recv, dt, op, control_, &req);
        break;
      case CollKind::broadcast:
        if (a.blocking)
          MPI_Bcast(r, n_recv, dt, a.root, control_);
        else
          MPI_Ibcast(r, n_recv, dt, a.root, control_, &req);
        break;
    }
    if (a.blocking) {
      c.run();
      return nullptr;
    }
    return std::make_unique<MpiOp>(req, std::move(c));
  }

  StageView send_cache_, recv_cache_;
  std::vector<StageView> async_stages_;
};

}  // namespace

std::shared_ptr<CommImpl> make_mpi_comm(MPI_Comm comm_to_dup, const std::string& name) {
  MPI_Comm c;
  MPI_Comm_dup(comm_to_dup, &c);
  return std::make_shared<MpiComm>(c, name);
}

}  // namespace kshard::detail
