#include "kshard/testing/test_fixture.hpp"

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <exception>
#include <functional>
#include <string>
#include <vector>

#include "kshard/core/memory_tracker.hpp"
#include "kshard/mesh/trace.hpp"
#include "kshard/testing/collective_check.hpp"
#include "kshard/testing/context.hpp"
#include "run_state.hpp"

namespace kshard::testing {
using detail::TestOutcome;
namespace {

// All ranks must be running the same test; a rank that filtered or ordered
// tests differently would otherwise pair its collectives with another test's.
void check_same_test(const std::string& name) {
  auto& s = detail::state();
  unsigned long long h = std::hash<std::string>{}(name);
  std::vector<unsigned long long> all(s.size);
  MPI_Allgather(&h, 1, MPI_UNSIGNED_LONG_LONG, all.data(), 1, MPI_UNSIGNED_LONG_LONG, s.comm);
  std::vector<int> others;
  for (int r = 0; r < s.size; ++r)
    if (all[r] != h) others.push_back(r);
  BOOST_REQUIRE_MESSAGE(others.empty(), "ranks " << format_ranks(others)
                                                 << " are not running test " << name
                                                 << " (run every rank with the same filter)");
}

}  // namespace

TestFixture::TestFixture()
    : uncaught_at_start_(std::uncaught_exceptions()),
      live_bytes_at_start_(0),
      live_allocs_at_start_(0),
      inflight_at_start_(kshard::collectives_in_flight()),
      alloc_seq_at_start_(0) {
  Kokkos::fence();
  detail::set_phase("set-up sync");
  check_same_test(current_test());
  MPI_Barrier(harness_comm());
  const auto mem = kshard::memory::stats();
  live_bytes_at_start_ = mem.live_bytes;
  live_allocs_at_start_ = mem.live_allocs;
  alloc_seq_at_start_ = kshard::memory::allocation_count();
  {
    auto& s = detail::state();
    std::lock_guard<std::mutex> lock(s.mu);
    s.started = std::chrono::steady_clock::now();  // the deadline counts from here
  }
  detail::set_phase("body");
}

TestFixture::~TestFixture() {
  auto& s = detail::state();
  const bool threw = std::uncaught_exceptions() > uncaught_at_start_;
  try {
    Kokkos::fence();
  } catch (...) {
  }
  detail::set_phase("tear-down sync");
  bool local_problem = false;

  const std::int64_t inflight = kshard::collectives_in_flight() - inflight_at_start_;
  if (inflight > 0) {
    BOOST_ERROR("test left " << inflight << " non-blocking collective(s) in flight (never waited)");
    local_problem = true;
  }
  const auto mem = kshard::memory::stats();
  const std::int64_t leaked = mem.live_bytes - live_bytes_at_start_;
  const std::int64_t leaked_n = mem.live_allocs - live_allocs_at_start_;
  if (leaked_n > 0 || leaked > 0) {
    BOOST_ERROR("test leaked " << leaked << " bytes in " << leaked_n << " Kokkos allocation(s): "
                               << kshard::memory::live_labels_since(alloc_seq_at_start_, 8));
    local_problem = true;
  }
  int stray = 0;
  MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, MPI_COMM_WORLD, &stray, MPI_STATUS_IGNORE);
  if (stray) {
    BOOST_ERROR("test left an unreceived message on MPI_COMM_WORLD");
    local_problem = true;
  }

  const int all_failures = s.failures_in_test.load();
  const bool failed_here =
      threw || local_problem || all_failures - s.collective_failures_in_test > 0;
  // A plain exchange (not failing_ranks(): that would count as a check).
  std::vector<int> failing = detail::ranks_where(failed_here);
  failing.insert(failing.end(), s.collective_origins.begin(), s.collective_origins.end());
  std::sort(failing.begin(), failing.end());
  failing.erase(std::unique(failing.begin(), failing.end()), failing.end());
  const std::string name = current_test();
  TestOutcome& o = detail::outcome(name);
  o.failing_ranks = failing;
  o.expected_failures =
      boost::unit_test::framework::current_test_case().p_expected_failures.get() > 0;
  if (!failing.empty() && !threw && !local_problem && all_failures == 0)
    BOOST_ERROR("test failed on ranks " << format_ranks(failing)
                                        << " (see their logs); failing it here too");
  detail::set_phase("between tests");
}

}  // namespace kshard::testing
