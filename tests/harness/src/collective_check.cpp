#include "kshard/testing/collective_check.hpp"

#include <cstdio>

#include "kshard/testing/context.hpp"
#include "run_state.hpp"

namespace kshard::testing {

std::vector<int> failing_ranks(bool failed) {
  auto& s = detail::state();
  detail::set_phase("body, in a collective check");
  std::vector<int> out = detail::ranks_where(failed);
  detail::set_phase("body");
  if (!out.empty()) {
    // The caller reports this failure on every rank.
    ++s.collective_failures_in_test;
    for (int r : out) s.collective_origins.push_back(r);
  }
  return out;
}

std::string format_ranks(const std::vector<int>& ranks) {
  std::string s = "[";
  for (std::size_t i = 0; i < ranks.size(); ++i) s += (i ? ", " : "") + std::to_string(ranks[i]);
  return s + "]";
}

bool any_rank(bool value) {
  int v = value ? 1 : 0;
  detail::set_phase("body, in a collective check");
  MPI_Allreduce(MPI_IN_PLACE, &v, 1, MPI_INT, MPI_MAX, detail::state().comm);
  detail::set_phase("body");
  return v != 0;
}

namespace detail {
void record_skip(const std::string& reason) {
  RunState& s = state();
  const std::string name = current_test();
  outcome(name).skip_reason = reason;
  BOOST_TEST_MESSAGE("SKIPPED: " << reason);
  if (s.rank == 0) {
    std::printf("[kshard] SKIP %s: %s\n", name.c_str(), reason.c_str());
    std::fflush(stdout);
  }
}
}  // namespace detail

}  // namespace kshard::testing
