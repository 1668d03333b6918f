// Harness self-test suite: rank 1 dies in the middle of a test; the launch
// must end promptly and name the test it died in.
#include <kshard/testing/harness.hpp>

#include <cstdlib>

namespace kt = kshard::testing;

KSHARD_TEST_SUITE(selftest)

BOOST_AUTO_TEST_CASE(fine_before) { KSHARD_CHECK_ALL(true); }

BOOST_AUTO_TEST_CASE(rank_1_exits, *kt::timeout(30)) {
  if (kt::world_rank() == 1) std::_Exit(3);
  KSHARD_CHECK_ALL(true);  // rank 0 waits here for a rank that is gone
}

KSHARD_TEST_SUITE_END()
