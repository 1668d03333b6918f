#pragma once
// Request: the handle of a non-blocking collective. wait() returns once the
// receive buffer is complete and usable from the default execution space and
// from the host. Dropping a request without waiting waits in the destructor
// (a collective can never be silently abandoned).
#include <memory>

namespace kshard {
namespace detail {
class PendingOp {
 public:
  virtual ~PendingOp() = default;
  virtual void wait() = 0;
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
  /// Non-blocking completion check; true once complete (then wait() is free).
  bool test();
  bool pending() const noexcept { return op_ != nullptr; }

 private:
  std::unique_ptr<detail::PendingOp> op_;
};

}  // namespace kshard
