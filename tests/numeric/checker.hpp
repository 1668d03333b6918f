#pragma once
// Tally of element-wise comparisons: millions of values are checked per test,
// so failures are counted and only the first few are described, and one
// assertion per batch keeps the log readable and the run fast.
#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include <boost/test/unit_test.hpp>

namespace kshard_test {

class Checker {
 public:
  explicit Checker(std::string what) : what_(std::move(what)) {}

  template <class Describe>
  void check(bool ok, Describe&& describe) {
    ++checked_;
    if (ok) return;
    if (bad_ < 12) first_.push_back(describe());
    ++bad_;
  }

  std::size_t checked() const { return checked_; }
  std::size_t bad() const { return bad_; }

  /// One Boost assertion for everything checked so far.
  void report() const {
    std::string msg = what_ + ": " + std::to_string(bad_) + " of " + std::to_string(checked_) +
                      " values wrong";
    for (const auto& s : first_) msg += "\n    " + s;
    BOOST_CHECK_MESSAGE(bad_ == 0, msg);
    BOOST_TEST_MESSAGE(what_ << ": " << checked_ << " values checked");
  }

 private:
  std::string what_;
  std::size_t checked_ = 0;
  std::size_t bad_ = 0;
  std::vector<std::string> first_;
};

}  // namespace kshard_test
