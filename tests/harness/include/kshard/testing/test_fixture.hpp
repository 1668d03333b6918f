#pragma once
// TestFixture: wrapped around every case of a KSHARD_TEST_SUITE.
// Set-up: Kokkos fence, check that all ranks entered the same test, barrier
// (so every rank's watchdog clock starts together). Tear-down, on every rank
// even when the test threw: fence; this rank failed if it had a failed
// assertion, threw, left a non-blocking collective in flight, leaked Kokkos
// memory (allocations labelled "kshard.cache:..." or "Kokkos::..." are long-lived
// caches and exempt) or left an unreceived message on MPI_COMM_WORLD; then the
// ranks exchange that verdict, and the ranks that passed fail too with
// "failed on ranks [...]", so the outcome of a test is the same everywhere.
#include <cstdint>

namespace kshard::testing {

class TestFixture {
 public:
  TestFixture();
  ~TestFixture();
  TestFixture(const TestFixture&) = delete;
  TestFixture& operator=(const TestFixture&) = delete;

 private:
  int uncaught_at_start_;
  std::int64_t live_bytes_at_start_;
  std::int64_t live_allocs_at_start_;
  std::int64_t inflight_at_start_;
  std::uint64_t alloc_seq_at_start_;
};

}  // namespace kshard::testing
