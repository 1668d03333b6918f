// Harness self-test suite: failures on one rank must be seen on all ranks.
// Run by selftest_driver.py, which asserts on the output and the exit code.
#include <kshard/testing/harness.hpp>

#include <Kokkos_Core.hpp>

namespace kt = kshard::testing;

KSHARD_TEST_SUITE(selftest)

BOOST_AUTO_TEST_CASE(passes_everywhere) { KSHARD_CHECK_ALL(kt::world_size() >= 2); }

BOOST_AUTO_TEST_CASE(plain_check_fails_on_rank_1) { BOOST_CHECK(kt::world_rank() != 1); }

BOOST_AUTO_TEST_CASE(collective_check_fails_on_rank_1) { KSHARD_CHECK_ALL(kt::world_rank() != 1); }

BOOST_AUTO_TEST_CASE(throws_on_rank_0) {
  if (kt::world_rank() == 0) throw std::runtime_error("deliberate exception on rank 0");
}

static Kokkos::View<float*> g_leak;
BOOST_AUTO_TEST_CASE(leaks_memory_on_rank_1) {
  if (kt::world_rank() == 1) g_leak = Kokkos::View<float*>("deliberately_leaked", 1000);
}

BOOST_AUTO_TEST_CASE(passes_after_failures) {
  g_leak = Kokkos::View<float*>();
  KSHARD_CHECK_ALL(true);
}

KSHARD_TEST_SUITE_END()
