// main() for single-process unit tests (label "unit"): Boost.Test with Kokkos
// initialised once for the whole executable, on the default device.
#define BOOST_TEST_MODULE kshard_unit
#include <boost/test/unit_test.hpp>

#include <Kokkos_Core.hpp>

namespace {
struct KokkosFixture {
  KokkosFixture() {
    auto& m = boost::unit_test::framework::master_test_suite();
    Kokkos::initialize(m.argc, m.argv);
  }
  ~KokkosFixture() { Kokkos::finalize(); }
};
}  // namespace
BOOST_TEST_GLOBAL_FIXTURE(KokkosFixture);
