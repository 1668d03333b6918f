#pragma once
// Communicator: a process group and its collectives on contiguous Kokkos Views.
//
//   kshard::Communicator comm = session.world();
//   Kokkos::View<float*> shard("shard", n), full("full", n * comm.size());
//   comm.all_gather(shard, full);                       // blocking
//   auto req = comm.reduce_scatter_async(full, shard, kshard::ReduceOp::avg);
//   ...                                                  // overlap work
//   req.wait();
//
// Same API for the MPI backend (host memory; device memory staged through
// pinned host mirrors) and the NCCL backend (device memory). Local size/type
// errors are
// rejected at compile time or before anything moves; with validation on (the
// default) all ranks also agree on op, dtype and counts before the data moves,
// so a mismatch is a kshard::Error on every rank instead of a hang or garbage.
//
// Ordering against the caller's kernels (all on the default execution space):
//  - Every collective starts after the kernels launched before the call (the
//    send buffer may be produced by one without a fence).
//  - Blocking calls return with the result complete (host and device).
//  - Non-blocking calls (NCCL) run on a stream owned by the communicator, made
//    to wait for the default execution space's stream by a CUDA event at the
//    call, so they overlap the kernels launched after the call. The
//    communicator's own collectives run in call order. Request::wait_on_device()
//    makes the default execution space wait for the result (an event again)
//    without blocking the host; Request::wait() blocks the host.
//  - MPI: non-blocking calls progress on the host; both waits block the host.
//  - Buffers: a buffer the collective reads or writes must stay allocated and
//    untouched by later kernels until the request is completed (either wait);
//    memory given back after that may be reused by any kernel or collective
//    launched later (see kshard/core/buffer_pool.hpp).
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include <Kokkos_Core.hpp>

#include "kshard/compat/kokkos.hpp"
#include "kshard/dtype.hpp"
#include "kshard/error.hpp"
#include "kshard/mesh/backend.hpp"
#include "kshard/mesh/detail/coll_args.hpp"
#include "kshard/mesh/reduce_op.hpp"
#include "kshard/mesh/request.hpp"
#include "kshard/mesh/trace.hpp"

namespace kshard {

namespace detail {
Request run_collective(CommImpl& impl, CollKind kind, const CollArgs& args);
[[noreturn]] void throw_size_error(const CommImpl& impl, const char* op, std::size_t got,
                                   std::size_t expected, const char* what);
[[noreturn]] void throw_layout_error(const CommImpl& impl, const char* op, const char* which);

template <class View>
constexpr void check_view_type() {
  static_assert(Kokkos::is_view<View>::value, "kshard collectives take Kokkos::View arguments");
  using T = std::remove_const_t<typename View::value_type>;
  static_assert(has_dtype<T>::value,
                "element type has no kshard::DType (float, double, int32, int64, uint8, "
                "bfloat16_t, float16_t, float8_e4m3_t, float8_e5m2_t)");
}

template <class View>
constexpr MemKind mem_kind() {
  return compat::host_accessible_v<typename View::memory_space> ? MemKind::host
                                                                 : MemKind::device;
}

template <class Send, class Recv>
CollArgs make_args(const CommImpl& impl, const char* op, const Send& send, const Recv& recv) {
  check_view_type<Send>();
  check_view_type<Recv>();
  using S = std::remove_const_t<typename Send::value_type>;
  using R = typename Recv::value_type;
  static_assert(!std::is_const_v<R>, "the receive View must not be const");
  static_assert(std::is_same_v<S, R>, "send and receive Views must have the same element type");
  static_assert(mem_kind<Send>() == mem_kind<Recv>(),
                "send and receive Views must both be host-accessible or both device Views");
  if (!send.span_is_contiguous()) throw_layout_error(impl, op, "send");
  if (!recv.span_is_contiguous()) throw_layout_error(impl, op, "receive");
  CollArgs a;
  a.send = send.data();
  a.recv = recv.data();
  a.send_count = send.size();
  a.recv_count = recv.size();
  a.dtype = dtype_of<R>::value;
  a.mem = mem_kind<Recv>();
  return a;
}
}  // namespace detail

class Communicator {
 public:
  Communicator() = default;  // null: every call throws
  explicit Communicator(std::shared_ptr<detail::CommImpl> impl) : impl_(std::move(impl)) {}

  bool valid() const noexcept { return impl_ != nullptr; }
  int rank() const;
  int size() const;
  Backend backend() const;
  const std::string& name() const;
  void barrier() const;
  /// Cross-rank agreement check before each collective (default on).
  void set_validation(bool on) const;
  std::vector<TraceEntry> trace() const;

  /// recv.size() == send.size() * size(); rank r's block lands at r * send.size().
  template <class Send, class Recv>
  Request all_gather_async(const Send& send, const Recv& recv) const {
    return gather_impl(send, recv, false);
  }
  template <class Send, class Recv>
  void all_gather(const Send& send, const Recv& recv) const {
    gather_impl(send, recv, true);
  }

  /// send.size() == recv.size() * size(); rank r receives the reduced block r.
  template <class Send, class Recv>
  Request reduce_scatter_async(const Send& send, const Recv& recv, ReduceOp op) const {
    return scatter_impl(send, recv, op, false);
  }
  template <class Send, class Recv>
  void reduce_scatter(const Send& send, const Recv& recv, ReduceOp op) const {
    scatter_impl(send, recv, op, true);
  }

  /// send and recv may be the same View (in place).
  template <class Send, class Recv>
  Request all_reduce_async(const Send& send, const Recv& recv, ReduceOp op) const {
    return reduce_impl(send, recv, op, false);
  }
  template <class Send, class Recv>
  void all_reduce(const Send& send, const Recv& recv, ReduceOp op) const {
    reduce_impl(send, recv, op, true);
  }
  template <class View>
  void all_reduce(const View& inout, ReduceOp op) const {
    reduce_impl(inout, inout, op, true);
  }

  /// Every rank passes a View of the same size; root's contents end up everywhere.
  template <class View>
  Request broadcast_async(const View& buf, int root) const {
    return bcast_impl(buf, root, false);
  }
  template <class View>
  void broadcast(const View& buf, int root) const {
    bcast_impl(buf, root, true);
  }

  /// Sub-communicator of the ranks with the same color, ordered by key. Collective.
  Communicator split(int color, int key, const std::string& name) const;

  /// The backend behind this communicator (private to the mesh library:
  /// declared, not defined, for users).
  detail::CommImpl& impl() const;

 private:
  template <class Send, class Recv>
  Request gather_impl(const Send& send, const Recv& recv, bool blocking) const {
    auto a = detail::make_args(impl(), "all_gather", send, recv);
    if (a.recv_count != a.send_count * std::size_t(size()))
      detail::throw_size_error(impl(), "all_gather", a.recv_count, a.send_count * size(),
                               "receive elements (send elements x ranks)");
    a.blocking = blocking;
    return detail::run_collective(impl(), detail::CollKind::all_gather, a);
  }
  template <class Send, class Recv>
  Request scatter_impl(const Send& send, const Recv& recv, ReduceOp op, bool blocking) const {
    auto a = detail::make_args(impl(), "reduce_scatter", send, recv);
    if (a.send_count != a.recv_count * std::size_t(size()))
      detail::throw_size_error(impl(), "reduce_scatter", a.send_count, a.recv_count * size(),
                               "send elements (receive elements x ranks)");
    a.op = op;
    a.blocking = blocking;
    return detail::run_collective(impl(), detail::CollKind::reduce_scatter, a);
  }
  template <class Send, class Recv>
  Request reduce_impl(const Send& send, const Recv& recv, ReduceOp op, bool blocking) const {
    auto a = detail::make_args(impl(), "all_reduce", send, recv);
    if (a.send_count != a.recv_count)
      detail::throw_size_error(impl(), "all_reduce", a.recv_count, a.send_count,
                               "receive elements (= send elements)");
    a.op = op;
    a.blocking = blocking;
    return detail::run_collective(impl(), detail::CollKind::all_reduce, a);
  }
  template <class View>
  Request bcast_impl(const View& buf, int root, bool blocking) const {
    auto a = detail::make_args(impl(), "broadcast", buf, buf);
    a.root = root;
    a.blocking = blocking;
    return detail::run_collective(impl(), detail::CollKind::broadcast, a);
  }

  std::shared_ptr<detail::CommImpl> impl_;
};

}  // namespace kshard
