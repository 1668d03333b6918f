#include "kshard/mesh/request.hpp"

namespace kshard {

Request& Request::operator=(Request&& other) noexcept {
  if (this != &other) {
    if (op_) {
      try {
        op_->wait();
      } catch (...) {
      }
    }
    op_ = std::move(other.op_);
  }
  return *this;
}

Request::~Request() {
  if (op_) {
    try {
      op_->wait();
    } catch (...) {
      // A destructor must not throw; the error was the caller's to see via wait().
    }
  }
}

void Request::wait() {
  if (!op_) return;
  auto op = std::move(op_);
  op->wait();
}

void Request::wait_on_device() {
  if (!op_) return;
  auto op = std::move(op_);
  op->wait_on_device();
}

bool Request::test() {
  if (!op_) return true;
  if (!op_->test()) return false;
  wait();
  return true;
}

}  // namespace kshard
