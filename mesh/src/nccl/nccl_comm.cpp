// The NCCL backend (CUDA builds with KSHARD_ENABLE_NCCL).
//
// Ordering: each communicator owns one CUDA stream (non-blocking, highest
// priority, so NCCL's kernels get SMs while compute kernels fill the GPU) and
// runs ALL its collectives there, in call order — NCCL requires one order per
// communicator, and one stream gives it. At each call the stream is made to
// wait for an event recorded on the Kokkos default execution space's stream,
// so the collective sees every kernel launched before it. Blocking calls then
// synchronise the communicator's stream. Non-blocking ones record a done event:
// Request::wait() synchronises it (host), Request::wait_on_device() makes the
// default stream wait for it (no host block), so compute launched after the
// call overlaps the collective. This is FSDP2's all-gather/reduce-scatter
// stream pattern with the streams owned by the communicators.
//
// Memory: NCCL moves device memory. Host-accessible Views (MemKind::host:
// HostSpace, CudaHostPinnedSpace, CudaUVMSpace) are staged through device
// buffers rather than rejected, so code that keeps small control data on the
// host (norms, counters, metadata) works on either backend; the MPI backend
// stages the other way round. Staging is for convenience, not speed.
//
// Set-up: the unique id travels over a duplicate of the MPI communicator,
// which stays as this communicator's control comm (barrier, agreement checks,
// split). split() uses ncclCommSplit so no new id exchange is needed.
#include <mpi.h>
#include <nccl.h>

#include <cuda_runtime_api.h>

#include <map>
#include <memory>
#include <tuple>
#include <type_traits>
#include <string>
#include <utility>

#include <Kokkos_Core.hpp>

#include "../comm_impl.hpp"
#include "kshard/error.hpp"

#if !defined(KOKKOS_ENABLE_CUDA)
#error "the NCCL backend needs Kokkos with the CUDA backend (KSHARD_ENABLE_NCCL implies a CUDA build)"
#endif

#if NCCL_VERSION_CODE < NCCL_VERSION(2, 10, 0)
#error "kshard's NCCL backend needs NCCL >= 2.10 (ncclAvg, ncclBfloat16)"
#endif

namespace kshard::detail {

bool nccl_available() noexcept { return true; }

namespace {

using DeviceBytes = Kokkos::View<char*, Kokkos::CudaSpace>;

std::string nccl_detail(ncclComm_t comm) {
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 13, 0)
  const char* last = ncclGetLastError(comm);
  if (last && *last) return std::string(" (") + last + ")";
#else
  (void)comm;
#endif
  return {};
}

void check_nccl(ncclResult_t r, const std::string& what, ncclComm_t comm = nullptr) {
  if (r == ncclSuccess) return;
  throw Error(what + " failed: " + ncclGetErrorString(r) + nccl_detail(comm),
              "ncclSuccess (NCCL_DEBUG=WARN prints NCCL's own reason)");
}

void check_cuda(cudaError_t e, const std::string& what) {
  if (e == cudaSuccess) return;
  (void)cudaGetLastError();  // clear a non-sticky error so later calls start clean
  throw Error(what + " failed: " + cudaGetErrorName(e) + ": " + cudaGetErrorString(e), "cudaSuccess");
}

void check_mpi(int rc, const std::string& what) {
  if (rc == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  throw Error(what + " failed: " + std::string(msg, std::size_t(len)), "MPI_SUCCESS");
}

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::f32: return ncclFloat32;
    case DType::f64: return ncclFloat64;
    case DType::i32: return ncclInt32;
    case DType::i64: return ncclInt64;
    case DType::u8: return ncclUint8;
    case DType::bf16: return ncclBfloat16;
    case DType::f16: return ncclFloat16;
    // fp8 only moves (communicator.cpp rejects reductions on it): bytes are
    // bytes, and ncclUint8 works with every NCCL, not only >= 2.24.
    case DType::e4m3:
    case DType::e5m2: return ncclUint8;
  }
  throw Error(std::string("dtype ") + dtype_name(t) + " on the NCCL backend",
              "f32, f64, i32, i64, u8, bf16, f16, e4m3 or e5m2");
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return ncclSum;
    case ReduceOp::avg: return ncclAvg;  // integers: sum, then truncating division
    case ReduceOp::max: return ncclMax;
    case ReduceOp::min: return ncclMin;
  }
  throw Error("unknown reduce op on the NCCL backend", "sum, avg, max or min");
}

static_assert(std::is_same<Kokkos::DefaultExecutionSpace, Kokkos::Cuda>::value,
              "the NCCL backend orders collectives on the default execution space's CUDA stream");
// Kokkos 3.4's default instance uses the legacy default stream (nullptr);
// asking keeps us right if Kokkos is initialised with a stream of its own.
cudaStream_t kokkos_stream() { return Kokkos::DefaultExecutionSpace().cuda_stream(); }


const char* nccl_call_name(CollKind k) {
  switch (k) {
    case CollKind::all_gather: return "ncclAllGather";
    case CollKind::reduce_scatter: return "ncclReduceScatter";
    case CollKind::all_reduce: return "ncclAllReduce";
    case CollKind::broadcast: return "ncclBroadcast";
  }
  return "nccl?";
}

// Host memory staged through the device: the buffers, and what to copy back
// once NCCL is done.
struct HostStage {
  DeviceBytes send;  // empty for broadcast (one buffer, in place)
  DeviceBytes recv;
  void* host_recv = nullptr;
  std::size_t recv_bytes = 0;

  void copy_back() {
    if (host_recv && recv_bytes)
      check_cuda(cudaMemcpy(host_recv, recv.data(), recv_bytes, cudaMemcpyDefault),
                 "cudaMemcpy of a staged NCCL result to host memory");
  }
};

class NcclOp final : public PendingOp {
 public:
  NcclOp(cudaEvent_t ev, HostStage stage) : ev_(ev), stage_(std::move(stage)) {}
  ~NcclOp() override {
    if (ev_) (void)cudaEventDestroy(ev_);
  }
  NcclOp(const NcclOp&) = delete;
  NcclOp& operator=(const NcclOp&) = delete;

  void wait() override {
    if (done_) return;
    check_cuda(cudaEventSynchronize(ev_), "cudaEventSynchronize after an NCCL collective");
    done_ = true;
    stage_.copy_back();
    stage_ = HostStage{};  // free the staging buffers now, not when the Request dies
  }
  void wait_on_device() override {
    if (done_) return;
    // A result staged for host memory needs the host copy: wait for it.
    if (stage_.host_recv) return wait();
    check_cuda(cudaStreamWaitEvent(kokkos_stream(), ev_, 0),
               "cudaStreamWaitEvent of the compute stream on an NCCL collective");
    done_ = true;
  }
  bool test() override {
    if (done_) return true;
    const cudaError_t e = cudaEventQuery(ev_);
    if (e == cudaErrorNotReady) return false;
    check_cuda(e, "cudaEventQuery after an NCCL collective");
    return true;  // Request::test() then calls wait(), which copies staged results back
  }

 private:
  cudaEvent_t ev_ = nullptr;
  HostStage stage_;
  bool done_ = false;
};

class NcclComm final : public CommImpl {
 public:
  // Takes ownership of both communicators.
  NcclComm(MPI_Comm control, ncclComm_t comm, std::string name, int device)
      : CommImpl(control, std::move(name)), comm_(comm), device_(device) {
    int n = 0, r = 0;
    check_nccl(ncclCommCount(comm_, &n), "ncclCommCount", comm_);
    check_nccl(ncclCommUserRank(comm_, &r), "ncclCommUserRank", comm_);
    if (n != size() || r != rank())
      throw Error("NCCL communicator '" + this->name() + "' has rank " + std::to_string(r) + " of " +
                      std::to_string(n) + " but its MPI control comm rank " + std::to_string(rank()) +
                      " of " + std::to_string(size()),
                  "the same rank order in NCCL and MPI (a kshard bug)");
  }

  ~NcclComm() override {
    // After MPI_Finalize the process is going down and peers may be gone;
    // tearing NCCL down then can block, so it is left to process exit.
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized && comm_) (void)ncclCommDestroy(comm_);
    if (!finalized) {
      if (ready_) (void)cudaEventDestroy(ready_);
      if (stream_) (void)cudaStreamDestroy(stream_);
    }
    // A communicator that outlives Kokkos::finalize must not free Kokkos
    // allocations (Kokkos aborts): leak the staging caches instead.
    if (!Kokkos::is_initialized()) {
      (void)new DeviceBytes(std::move(send_cache_));
      (void)new DeviceBytes(std::move(recv_cache_));
    }
  }

  Backend backend() const noexcept override { return Backend::nccl; }
  std::shared_ptr<CommImpl> split(int color, int key, const std::string& name) override {
    // ncclCommSplit costs about 0.5 s on the H200 (the 1-rank suites' cases
    // that split a "self" communicator took 0.5-1 s each), and programs split
    // the same way again and again (every test case, every DeviceMesh of one
    // shape). So a communicator keeps the children it made, keyed by (color,
    // key, name), and hands one out again when EVERY rank has its own child
    // cached: one small MPI_Allreduce on the control comm decides, so no rank
    // skips a split that another rank makes. A reused child is the same
    // communicator (trace, staging caches), as copies of a Communicator are.
    const SplitKey k{color, key, name};
    const auto it = children_.find(k);
    int hit = it != children_.end() ? 1 : 0, all_hit = 0;
    check_mpi(MPI_Allreduce(&hit, &all_hit, 1, MPI_INT, MPI_MIN, control_),
              "MPI_Allreduce of the split cache verdict of '" + this->name() + "'");
    if (all_hit) return it->second;
    auto child = split_uncached(color, key, name);
    children_[k] = child;
    return child;
  }

 private:
  using SplitKey = std::tuple<int, int, std::string>;
  std::map<SplitKey, std::shared_ptr<CommImpl>> children_;

  std::shared_ptr<CommImpl> split_uncached(int color, int key, const std::string& name) {
    // MPI_Comm_split semantics, but every rank must land in a group (a
    // Communicator is never null). A negative color (MPI_UNDEFINED included)
    // still takes part in both splits so the other ranks do not hang, and
    // throws afterwards.
    const bool member = color >= 0;
    MPI_Comm c = MPI_COMM_NULL;
    check_mpi(MPI_Comm_split(control_, member ? color : MPI_UNDEFINED, key, &c),
              "MPI_Comm_split of the control comm of '" + this->name() + "'");
    ncclComm_t nc = nullptr;
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 18, 0)
    const ncclResult_t r = ncclCommSplit(comm_, member ? color : NCCL_SPLIT_NOCOLOR, key, &nc, nullptr);
    if (r != ncclSuccess) {
      if (c != MPI_COMM_NULL) MPI_Comm_free(&c);
      check_nccl(r, "ncclCommSplit of '" + this->name() + "' into '" + name + "'", comm_);
    }
#endif
    if (!member) {
      if (nc) (void)ncclCommDestroy(nc);
      if (c != MPI_COMM_NULL) MPI_Comm_free(&c);
      throw Error("split of '" + this->name() + "' into '" + name + "' with color " +
                      std::to_string(color),
                  "a color >= 0 on every rank (every rank must be in some group)");
    }
#if NCCL_VERSION_CODE < NCCL_VERSION(2, 18, 0)
    nc = init_over(c, name, device_);  // no ncclCommSplit: a fresh id over the new group
#endif
    try {
      return std::make_shared<NcclComm>(c, nc, name, device_);
    } catch (...) {
      // NcclComm's base already owns c; only nc can leak here.
      (void)ncclCommDestroy(nc);
      throw;
    }
  }


 public:
  /// ncclCommInitRank over `control`'s ranks; collective over `control`.
  static ncclComm_t init_over(MPI_Comm control, const std::string& name, int device) {
    int rank = 0, size = 0;
    check_mpi(MPI_Comm_rank(control, &rank), "MPI_Comm_rank");
    check_mpi(MPI_Comm_size(control, &size), "MPI_Comm_size");

    // Rank 0 sends its status with the id, so a failing ncclGetUniqueId is an
    // error on every rank instead of a hang in MPI_Bcast.
    struct {
      int ok;
      ncclUniqueId id;
    } msg{};
    ncclResult_t id_rc = ncclSuccess;
    if (rank == 0) {
      id_rc = ncclGetUniqueId(&msg.id);
      msg.ok = id_rc == ncclSuccess ? 1 : 0;
    }
    check_mpi(MPI_Bcast(&msg, int(sizeof msg), MPI_BYTE, 0, control),
              "MPI_Bcast of the NCCL unique id for '" + name + "'");
    if (!msg.ok) {
      if (rank == 0) check_nccl(id_rc, "ncclGetUniqueId for '" + name + "'");
      throw Error("ncclGetUniqueId failed on rank 0 of '" + name + "'",
                  "a NCCL unique id from rank 0");
    }

    ncclComm_t comm = nullptr;
    const ncclResult_t rc = ncclCommInitRank(&comm, size, msg.id, rank);
    // Every rank learns whether all ranks got their communicator.
    int ok = rc == ncclSuccess ? 1 : 0, all_ok = 0;
    check_mpi(MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, control),
              "MPI_Allreduce after ncclCommInitRank");
    if (rc != ncclSuccess)
      check_nccl(rc, "ncclCommInitRank for '" + name + "' (" + std::to_string(size) +
                         " ranks, CUDA device " + std::to_string(device) + ")",
                 comm);
    if (!all_ok) {
      (void)ncclCommDestroy(comm);
      throw Error("ncclCommInitRank for '" + name + "' failed on another rank",
                  "a NCCL communicator on every rank (one GPU per rank)");
    }
    return comm;
  }

 private:
  // Blocking calls reuse one device staging pair; the label marks it as a
  // cache so the test harness' leak check does not count it.
  DeviceBytes staging(DeviceBytes& cache, std::size_t bytes, bool blocking) {
    if (!blocking)
      return DeviceBytes(Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string("kshard.nccl_staging")),
                         bytes);
    if (cache.extent(0) < bytes)
      cache = DeviceBytes(
          Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string("kshard.cache:nccl_staging")), bytes);
    return cache;
  }

  std::unique_ptr<PendingOp> collective(CollKind kind, const CollArgs& a) override {
    const std::size_t es = dtype_size(a.dtype);
    const std::size_t sbytes = a.send_count * es, rbytes = a.recv_count * es;
    // Zero elements: nothing to move, and a zero-size View's data() is null,
    // which NCCL's pointer checks (NCCL_CHECK_POINTERS) would reject. All
    // ranks agree on the counts, so all of them skip: nothing can hang.
    if (sbytes == 0 && rbytes == 0) return nullptr;

    const cudaStream_t stream = comm_stream();
    // The collective starts after everything queued on the compute stream.
    check_cuda(cudaEventRecord(ready_, kokkos_stream()), "cudaEventRecord before " + describe(kind, a));
    check_cuda(cudaStreamWaitEvent(stream, ready_, 0),
               "cudaStreamWaitEvent of the communicator's stream before " + describe(kind, a));
    const ncclDataType_t dt = nccl_type(a.dtype);
    const void* s = a.send;
    void* r = a.recv;
    HostStage stage;
    if (a.mem == MemKind::host) {
      // Separate device send and receive buffers make every in-place form
      // (send == recv, or send/recv at this rank's block of the other)
      // correct without special cases: the send data is copied out before
      // anything is written back.
      stage.recv = staging(recv_cache_, rbytes, a.blocking);
      stage.host_recv = a.recv;
      stage.recv_bytes = rbytes;
      r = stage.recv.data();
      if (kind == CollKind::broadcast) {
        s = r;
        if (rank() == a.root)
          check_cuda(cudaMemcpyAsync(r, a.recv, rbytes, cudaMemcpyDefault, stream),
                     "cudaMemcpyAsync staging a host buffer for " + describe(kind, a));
      } else {
        stage.send = staging(send_cache_, sbytes, a.blocking);
        check_cuda(cudaMemcpyAsync(stage.send.data(), a.send, sbytes, cudaMemcpyDefault, stream),
                   "cudaMemcpyAsync staging a host buffer for " + describe(kind, a));
        s = stage.send.data();
      }
    }

    ncclResult_t rc = ncclSuccess;
    switch (kind) {
      case CollKind::all_gather:
        rc = ncclAllGather(s, r, a.send_count, dt, comm_, stream);
        break;
      case CollKind::reduce_scatter:
        rc = ncclReduceScatter(s, r, a.recv_count, dt, nccl_op(a.op), comm_, stream);
        break;
      case CollKind::all_reduce:
        rc = ncclAllReduce(s, r, a.recv_count, dt, nccl_op(a.op), comm_, stream);
        break;
      case CollKind::broadcast:  // in place: Communicator passes one buffer
        rc = ncclBroadcast(r, r, a.recv_count, dt, a.root, comm_, stream);
        break;
    }
    if (rc != ncclSuccess) check_nccl(rc, describe(kind, a), comm_);

    if (a.blocking) {
      check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize after " + describe(kind, a));
      stage.copy_back();
      return nullptr;
    }
    cudaEvent_t ev = nullptr;
    check_cuda(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming), "cudaEventCreateWithFlags");
    const cudaError_t e = cudaEventRecord(ev, stream);
    if (e != cudaSuccess) {
      (void)cudaEventDestroy(ev);
      check_cuda(e, "cudaEventRecord after " + describe(kind, a));
    }
    return std::make_unique<NcclOp>(ev, std::move(stage));
  }

  /// The communicator's stream (and its reusable ready event), made at first use.
  cudaStream_t comm_stream() {
    if (stream_) return stream_;
    int least = 0, greatest = 0;
    check_cuda(cudaDeviceGetStreamPriorityRange(&least, &greatest),
               "cudaDeviceGetStreamPriorityRange");
    check_cuda(cudaStreamCreateWithPriority(&stream_, cudaStreamNonBlocking, greatest),
               "cudaStreamCreateWithPriority for communicator '" + name() + "'");
    check_cuda(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming),
               "cudaEventCreateWithFlags for communicator '" + name() + "'");
    return stream_;
  }

  std::string describe(CollKind kind, const CollArgs& a) const {
    return std::string(nccl_call_name(kind)) + " on '" + name() + "' (" + dtype_name(a.dtype) + ", " +
           std::to_string(kind == CollKind::reduce_scatter ? a.recv_count : a.send_count) +
           " elements per rank, CUDA device " + std::to_string(device_) + ")";
  }

  ncclComm_t comm_ = nullptr;
  int device_ = 0;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t ready_ = nullptr;  // re-recorded at each call (a wait binds the record it sees)
  DeviceBytes send_cache_, recv_cache_;
};

}  // namespace

std::shared_ptr<CommImpl> make_nccl_comm(MPI_Comm comm, const std::string& name) {
  if (!Kokkos::is_initialized())
    throw Error("NCCL communicator '" + name + "' created before Kokkos::initialize",
                "a live kshard::Session (it initialises Kokkos and selects the GPU first)");
  // Kokkos selected (cudaSetDevice) this rank's GPU when it initialised.
  int device = 0;
  check_cuda(cudaGetDevice(&device), "cudaGetDevice");

  MPI_Comm control = MPI_COMM_NULL;
  check_mpi(MPI_Comm_dup(comm, &control), "MPI_Comm_dup for NCCL communicator '" + name + "'");
  ncclComm_t nc = nullptr;
  try {
    nc = NcclComm::init_over(control, name, device);
  } catch (...) {
    MPI_Comm_free(&control);
    throw;
  }
  try {
    return std::make_shared<NcclComm>(control, nc, name, device);
  } catch (...) {
    (void)ncclCommDestroy(nc);
    throw;
  }
}

}  // namespace kshard::detail
