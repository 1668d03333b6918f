// A distributed suite in an outside project, built against the installed harness.
#include <kshard/testing/harness.hpp>

#include <kshard/engine/fsdp/recipe.hpp>
#include <kshard/mesh/device_mesh.hpp>
#include <kshard/optim/fused_adam.hpp>

namespace kt = kshard::testing;

KSHARD_TEST_SUITE(consumer)

BOOST_AUTO_TEST_CASE(all_reduce_sums_ranks) {
  Kokkos::View<double*> v("v", 3);
  Kokkos::deep_copy(v, double(kt::world_rank()));
  kt::world().all_reduce(v, kshard::ReduceOp::sum);
  auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), v);
  const int P = kt::world_size();
  KSHARD_CHECK_ALL(h(2) == P * (P - 1) / 2.0);
}

BOOST_AUTO_TEST_CASE(invalid_mesh_is_an_error_everywhere) {
  KSHARD_CHECK_THROWS_ALL(kshard::DeviceMesh(kt::world(), {kt::world_size() + 1}), kshard::Error);
}

// The engine's headers install in their kernels/ nn/ fsdp/ layout, and the
// optimizer's public header (which includes engine headers) finds them.
BOOST_AUTO_TEST_CASE(installed_engine_headers_resolve) {
  KSHARD_CHECK_ALL(kshard::Recipe::parse("bf16").compute_dtype == kshard::DType::bf16);
}

KSHARD_TEST_SUITE_END()
