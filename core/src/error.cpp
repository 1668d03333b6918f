#include "kshard/error.hpp"

#include <atomic>

namespace kshard {
namespace {
std::atomic<int> g_rank{-1};

std::string compose(const std::string& what, const std::string& expected, int rank) {
  std::string s = "kshard error";
  if (rank >= 0) s += " on rank " + std::to_string(rank);
  s += ": " + what;
  if (!expected.empty()) s += "; expected " + expected;
  return s;
}
}  // namespace

int error_rank() noexcept { return g_rank.load(std::memory_order_relaxed); }
void set_error_rank(int rank) noexcept { g_rank.store(rank, std::memory_order_relaxed); }

Error::Error(std::string what, std::string expected, int rank)
    : std::runtime_error(compose(what, expected, rank)),
      problem_(std::move(what)),
      expected_(std::move(expected)),
      rank_(rank) {}

}  // namespace kshard
