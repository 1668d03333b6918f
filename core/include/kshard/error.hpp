#pragma once
// kshard::Error: every error kshard raises says what was wrong, what was
// expected instead, and on which rank it happened.
//
//   throw kshard::Error("mesh shape [3, 2] has 6 ranks",
//                       "a shape whose product equals the world size 4");
//   // what(): "kshard error on rank 1: mesh shape [3, 2] has 6 ranks; expected a shape ..."
#include <stdexcept>
#include <string>

namespace kshard {

/// Rank put into errors raised on this process; -1 until a Session knows it.
int error_rank() noexcept;
/// Set by Session once MPI is up (and by tests that simulate ranks).
void set_error_rank(int rank) noexcept;

class Error : public std::runtime_error {
 public:
  Error(std::string what, std::string expected, int rank = error_rank());

  const std::string& problem() const noexcept { return problem_; }
  const std::string& expected() const noexcept { return expected_; }
  int rank() const noexcept { return rank_; }

 private:
  std::string problem_;
  std::string expected_;
  int rank_;
};

}  // namespace kshard
