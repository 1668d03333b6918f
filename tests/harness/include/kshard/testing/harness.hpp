#pragma once
// kshard::testing — Boost.Test suites that run as ONE MPI launch.
//
//   #include <kshard/testing/harness.hpp>
//
//   KSHARD_TEST_SUITE(mesh)                       // every case gets TestFixture
//   BOOST_AUTO_TEST_CASE(all_gather) {
//     auto& world = kshard::testing::world();
//     ...
//     KSHARD_CHECK_ALL(max_err < 1e-6);           // fails on EVERY rank if it fails on any
//   }
//   KSHARD_TEST_SUITE_END()
//   KSHARD_SUITE_WORLD_SIZES(1, 2);             // optional: the sizes it is written for
//
// Link kshard::testing (it provides main and the global fixture that owns the
// kshard::Session) and register with kshard_add_distributed_suite(). What the
// harness guarantees is in docs/ARCHITECTURE.md ("The test harness").
#include <boost/test/unit_test.hpp>

#include "kshard/testing/collective_check.hpp"
#include "kshard/testing/context.hpp"
#include "kshard/testing/test_fixture.hpp"
#include "kshard/testing/timeout.hpp"
#include "kshard/testing/world_sizes.hpp"

#define KSHARD_TEST_SUITE(name) BOOST_FIXTURE_TEST_SUITE(name, ::kshard::testing::TestFixture)
#define KSHARD_TEST_SUITE_END() BOOST_AUTO_TEST_SUITE_END()
