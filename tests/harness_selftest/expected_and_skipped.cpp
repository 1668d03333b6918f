// Harness self-test suite: expected failures and skips keep every rank in
// step and the suite passes; a data test case over meshes skips the meshes
// that do not fit the world size, on every rank, printing why.
#include <kshard/testing/harness.hpp>

#include <boost/test/data/monomorphic.hpp>
#include <boost/test/data/test_case.hpp>

#include <kshard/mesh/device_mesh.hpp>

namespace kt = kshard::testing;
namespace bdata = boost::unit_test::data;

// Built after MPI_Init: the dataset depends on the world size.
struct WorldSizes {
  using sample = int;
  enum { arity = 1 };
  bdata::size_t size() const { return kt::world_size(); }
  struct iterator {
    int i;
    int operator*() const { return i; }
    void operator++() { ++i; }
  };
  iterator begin() const { return iterator{0}; }
};
namespace boost::unit_test::data::monomorphic {
template <>
struct is_dataset<WorldSizes> : boost::mpl::true_ {};
}  // namespace boost::unit_test::data::monomorphic

KSHARD_TEST_SUITE(selftest)

BOOST_AUTO_TEST_CASE(expected_failure_on_rank_1, *boost::unit_test::expected_failures(1)) {
  BOOST_CHECK(kt::world_rank() != 1);
}

BOOST_AUTO_TEST_CASE(expected_collective_failure, *boost::unit_test::expected_failures(1)) {
  KSHARD_CHECK_ALL(kt::world_rank() == 0);
}

static const std::vector<std::vector<int>> kMeshes = {{2}, {1, 2}, {3}, {2, 3}};

BOOST_DATA_TEST_CASE(mesh_cases, bdata::xrange(kMeshes.size()), i) {
  const auto& shape = kMeshes[i];
  KSHARD_SKIP_IF(!kshard::DeviceMesh::fits(shape, kt::world_size()),
                 "mesh " << kshard::DeviceMesh::describe(shape) << " does not fit "
                         << kt::world_size() << " ranks");
  kshard::DeviceMesh mesh(kt::world(), shape);
  KSHARD_CHECK_ALL(mesh.shard_comm().size() == shape.back());
}

BOOST_DATA_TEST_CASE(one_case_per_rank, bdata::make_delayed<WorldSizes>(), r) {
  KSHARD_CHECK_ALL(r < kt::world_size());
}

KSHARD_TEST_SUITE_END()
