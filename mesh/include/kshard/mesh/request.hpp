#pragma once
// Request: the handle of a non-blocking collective.
//
// Two ways to complete one:
//  - wait(): the host blocks until the receive buffer is complete; it is then
//    usable from the host and from the default execution space.
//  - wait_on_device(): the host does not block; every kernel launched on the
//    default execution space afterwards runs after the collective (on CUDA a
//    stream-to-stream event dependency), so the overlap between a collective
//    and the compute queued before it survives. The host must not read the
//    result before a fence. Backends that complete on the host (MPI) wait()
//    here.
// Either way the Request is then complete. Dropping a request without
// completing it waits in the destructor (a collective can never be silently
// abandoned).
//
// Ordering contract for the send side (the Communicator's header states it per
// backend): a non-blocking collective starts after every kernel launched on
// the default execution space before the call, so its input may be produced by
// such a kernel without a fence.
#include <memory>

namespace kshard {
namespace detail {
class PendingOp {
 public:
  virtual ~PendingOp() = default;
  virtual void wait() = 0;
  /// Orders the default execution space after the operation; default: wait().
  virtual void wait_on_device() { wait(); }
  virtual bool test() = 0;
};
}  // namespace detail

class Request {
 public:
  Request() = default;  // an already-completed request
  explicit Request(std::unique_ptr<detail::PendingOp> op) : op_(std::move(op)) {}
  Request(Request&&) noexcept = default;
  Request& operator=(Request&& other) noexcept;
  Request(const Request&) = delete;
  Request& operator=(const Request&) = delete;
  ~Request();

  void wait();
  /// Completes the request without blocking the host (see the top of this file).
  void wait_on_device();
  /// Non-blocking completion check; true once complete (then wait() is free).
  bool test();
  bool pending() const noexcept { return op_ != nullptr; }

 private:
  std::unique_ptr<detail::PendingOp> op_;
};

}  // namespace kshard
