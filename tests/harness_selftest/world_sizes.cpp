// Harness self-test suite written for 1 or 3 ranks (declared in two files'
// worth of declarations, which intersect): at 2 ranks it must run no case,
// print one line per rank naming the sizes, and exit non-zero; at 1 rank it
// runs its one case.
#include <kshard/testing/harness.hpp>

namespace kt = kshard::testing;

KSHARD_SUITE_WORLD_SIZES(1, 3, 4);
KSHARD_SUITE_WORLD_SIZES(3, 1);

KSHARD_TEST_SUITE(selftest)

BOOST_AUTO_TEST_CASE(runs_at_a_declared_size) {
  KSHARD_CHECK_ALL(kt::world_size() == 1 || kt::world_size() == 3);
}

KSHARD_TEST_SUITE_END()
