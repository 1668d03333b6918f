#pragma once
// Per-test timeouts for the harness watchdog. A suite's default comes from
// KSHARD_TEST_TIMEOUT (seconds; kshard_add_distributed_suite(TEST_TIMEOUT)
// sets it, 60 if unset). Override per test with the decorator
//
//   BOOST_AUTO_TEST_CASE(big_allgather, *kshard::testing::timeout(120)) { ... }
//
// or from inside a test with set_test_timeout(). Never use Boost's own
// boost::unit_test::timeout: it interrupts the one rank with a signal while
// the others wait in a collective, which turns a slow test into a hang.
#include <boost/test/unit_test.hpp>

namespace kshard::testing {

/// Decorator: this test may run `seconds` before the watchdog ends the launch.
boost::unit_test::decorator::label timeout(int seconds);
/// Reset the running test's deadline to `seconds` from its start.
void set_test_timeout(double seconds);
/// The running test's timeout in seconds.
double test_timeout();

}  // namespace kshard::testing
