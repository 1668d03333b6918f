// Harness self-test suite: rank 1 skips a collective that rank 0 enters, so
// both hang; the watchdog must end the launch and say where each rank was.
#include <kshard/testing/harness.hpp>

#include <Kokkos_Core.hpp>

namespace kt = kshard::testing;

KSHARD_TEST_SUITE(selftest)

BOOST_AUTO_TEST_CASE(fine_before) { KSHARD_CHECK_ALL(true); }

BOOST_AUTO_TEST_CASE(rank_1_skips_all_gather, *kt::timeout(3)) {
  Kokkos::View<float*> a("a", 4), b("b", 4 * kt::world_size());
  if (kt::world_rank() != 1) kt::world().all_gather(a, b);
  KSHARD_CHECK_ALL(true);
}

BOOST_AUTO_TEST_CASE(never_reached) { KSHARD_CHECK_ALL(true); }

KSHARD_TEST_SUITE_END()
