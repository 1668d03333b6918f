// DeviceMesh (1-D and 2-D), sub-communicators, Session facts, and every way a
// caller can get a mesh or a collective wrong: each must be a kshard::Error
// on every rank, never a hang.
#include <kshard/testing/harness.hpp>

#include <boost/test/data/monomorphic.hpp>
#include <boost/test/data/test_case.hpp>

#include <kshard/mesh/device_mesh.hpp>

#include "fill.hpp"

namespace kt = kshard::testing;
namespace bdata = boost::unit_test::data;
using kshard::DeviceMesh;
using kshard::ReduceOp;
using namespace kshard::test;

namespace {

// Candidate meshes: the ones that do not fit this world size are skipped.
const std::vector<std::vector<int>> kMeshes = {{1}, {2}, {4}, {1, 2}, {2, 1}, {2, 2}, {1, 4}, {4, 1}};

std::int64_t check_mesh(const std::vector<int>& shape) {
  const auto& world = kt::world();
  DeviceMesh mesh(world, shape);
  const int P = world.size(), r = world.rank();
  const int S = mesh.shard_size(), R = mesh.replicate_size();
  std::int64_t bad = 0;
  // Coordinates are row-major: rank = replica * S + shard index.
  const int rep = mesh.ndim() == 2 ? mesh.coord(0) : 0;
  const int sh = mesh.coord(mesh.ndim() - 1);
  bad += rep * S + sh != r;
  bad += mesh.shard_comm().size() != S || mesh.shard_comm().rank() != sh;
  bad += mesh.replicate_comm().size() != R || mesh.replicate_comm().rank() != rep;
  bad += R * S != P;

  // Shard dim all-gather: the blocks of the ranks of my replica row.
  const std::int64_t n = 5;
  Kokkos::View<float*> mine("mine", n), row("row", n * S);
  fill(mine, r);
  mesh.shard_comm().all_gather(mine, row);
  auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), row);
  for (std::int64_t i = 0; i < n * S; ++i) bad += h(i) != float(f(rep * S + int(i / n), i % n));

  // Replicate dim all-reduce: sum over my shard column, closed form.
  Kokkos::View<double*> col("col", n);
  fill(col, r);
  mesh.replicate_comm().all_reduce(col, ReduceOp::sum);
  auto hc = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), col);
  for (std::int64_t i = 0; i < n; ++i) {
    double want = 0;
    for (int q = 0; q < R; ++q) want += f(q * S + sh, i);
    bad += hc(i) != want;
  }
  // Shard dim reduce-scatter (avg), as FSDP does with gradients.
  Kokkos::View<float*> grads("grads", n * S), shard("shard", n);
  fill(grads, r);
  mesh.shard_comm().reduce_scatter(grads, shard, ReduceOp::avg);
  auto hs = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), shard);
  for (std::int64_t i = 0; i < n; ++i) {
    double want = 0;
    for (int q = 0; q < S; ++q) want += f(rep * S + q, sh * n + i);
    bad += hs(i) != float(want / S);
  }
  return bad;
}

}  // namespace

KSHARD_TEST_SUITE(device_mesh)

BOOST_DATA_TEST_CASE(meshes, bdata::xrange(kMeshes.size()), i) {
  const auto& shape = kMeshes[i];
  KSHARD_SKIP_IF(!DeviceMesh::fits(shape, kt::world_size()),
                 "mesh " << DeviceMesh::describe(shape) << " does not fit " << kt::world_size()
                         << " ranks");
  KSHARD_CHECK_ALL(check_mesh(shape) == 0);
}

BOOST_AUTO_TEST_CASE(named_dimensions) {
  const int P = kt::world_size();
  KSHARD_SKIP_IF(P % 2 != 0, "needs an even world size");
  DeviceMesh mesh(kt::world(), {2, P / 2}, {"dp", "fsdp"});
  KSHARD_CHECK_ALL(mesh.comm("fsdp").size() == P / 2 && mesh.comm("dp").size() == 2);
  KSHARD_CHECK_ALL(mesh.dim_index("dp") == 0);
  KSHARD_CHECK_THROWS_ALL(mesh.comm("tp"), kshard::Error);
}

BOOST_AUTO_TEST_CASE(invalid_meshes_fail_on_every_rank) {
  const auto& world = kt::world();
  const int P = world.size();
  KSHARD_CHECK_THROWS_ALL(DeviceMesh(world, {P + 1}), kshard::Error);
  KSHARD_CHECK_THROWS_ALL(DeviceMesh(world, {0, P}), kshard::Error);
  KSHARD_CHECK_THROWS_ALL(DeviceMesh(world, {-1, -P}), kshard::Error);
  KSHARD_CHECK_THROWS_ALL(DeviceMesh(world, {}), kshard::Error);
  KSHARD_CHECK_THROWS_ALL(DeviceMesh(world, {1, 1, P}), kshard::Error);
  KSHARD_CHECK_THROWS_ALL(DeviceMesh(world, {1, P}, {"shard", "shard"}), kshard::Error);
  KSHARD_CHECK_THROWS_ALL(DeviceMesh(world, {P}, {"a", "b"}), kshard::Error);
  // The message names the shape and the world size.
  std::string msg;
  try {
    DeviceMesh(world, {P + 1, 2});
  } catch (const kshard::Error& e) {
    msg = e.what();
  }
  const std::string shape = "[" + std::to_string(P + 1) + ", 2]";
  KSHARD_CHECK_ALL_MSG(msg.find(shape) != std::string::npos &&
                           msg.find("world has " + std::to_string(P)) != std::string::npos &&
                           msg.find("on rank " + std::to_string(world.rank())) != std::string::npos,
                       "error message: " << msg);
}

BOOST_AUTO_TEST_CASE(ranks_that_disagree_on_the_shape_fail_together) {
  const auto& world = kt::world();
  const int P = world.size();
  KSHARD_SKIP_IF(P < 2, "ranks can only disagree with 2 or more ranks");
  // Both shapes are valid for P ranks; only the agreement check can tell.
  const std::vector<int> shape = world.rank() == 0 ? std::vector<int>{P} : std::vector<int>{1, P};
  KSHARD_CHECK_THROWS_ALL(DeviceMesh(world, shape), kshard::Error);
}

BOOST_AUTO_TEST_CASE(split_by_parity) {
  const auto& world = kt::world();
  auto sub = world.split(world.rank() % 2, world.rank(), "parity");
  const int expect = (world.size() + 1 - world.rank() % 2) / 2;
  KSHARD_CHECK_ALL(sub.size() == expect && sub.rank() == world.rank() / 2);
  Kokkos::View<std::int64_t*> v("v", 1);
  Kokkos::deep_copy(v, std::int64_t(world.rank()));
  sub.all_reduce(v, ReduceOp::sum);
  auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), v);
  std::int64_t want = 0;
  for (int q = world.rank() % 2; q < world.size(); q += 2) want += q;
  KSHARD_CHECK_ALL(h(0) == want);
}

BOOST_AUTO_TEST_CASE(session_facts) {
  auto& s = kt::session();
  KSHARD_CHECK_ALL(s.size() == kt::world_size() && s.rank() == kt::world_rank());
  KSHARD_CHECK_ALL(s.local_rank() >= 0 && s.local_rank() < s.local_size());
  KSHARD_CHECK_ALL(kt::world().size() == s.size());
  KSHARD_CHECK_ALL(s.world(kshard::Backend::mpi).backend() == kshard::Backend::mpi);
}

BOOST_AUTO_TEST_CASE(mismatched_counts_across_ranks_fail_on_every_rank) {
  const auto& world = kt::world();
  const int P = world.size();
  KSHARD_SKIP_IF(P < 2, "ranks can only disagree with 2 or more ranks");
  const std::int64_t n = world.rank() == 1 ? 5 : 4;
  Kokkos::View<float*> send("send", n), recv("recv", n * P);
  KSHARD_CHECK_THROWS_ALL(world.all_gather(send, recv), kshard::Error);
  Kokkos::View<float*> buf("buf", n);
  KSHARD_CHECK_THROWS_ALL(world.all_reduce(buf, ReduceOp::sum), kshard::Error);
  // Nothing moved and the communicator still works afterwards.
  Kokkos::View<float*> ok("ok", 3), okr("okr", 3 * P);
  fill(ok, world.rank());
  world.all_gather(ok, okr);
  auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), okr);
  KSHARD_CHECK_ALL(h(3 * (P - 1)) == float(f(P - 1, 0)));
}

struct DtypeMismatch {
  static void run(const kshard::Communicator& world) {
    if (world.rank() == 0) {
      Kokkos::View<float*> b("b", 4);
      world.all_reduce(b, ReduceOp::sum);
    } else {
      Kokkos::View<std::int32_t*> b("b", 4);
      world.all_reduce(b, ReduceOp::sum);
    }
  }
};

BOOST_AUTO_TEST_CASE(mismatched_dtypes_and_ops_fail_on_every_rank) {
  const auto& world = kt::world();
  KSHARD_SKIP_IF(world.size() < 2, "ranks can only disagree with 2 or more ranks");
  KSHARD_CHECK_THROWS_ALL(DtypeMismatch::run(world), kshard::Error);
  Kokkos::View<float*> b("b", 4);
  KSHARD_CHECK_THROWS_ALL(
      world.all_reduce(b, world.rank() == 0 ? ReduceOp::max : ReduceOp::sum), kshard::Error);
  KSHARD_CHECK_THROWS_ALL(world.broadcast(b, world.rank() == 0 ? 0 : world.size() - 1 + (world.size() == 1)),
                          kshard::Error);
}

BOOST_AUTO_TEST_CASE(local_errors) {
  const auto& world = kt::world();
  const int P = world.size();
  Kokkos::View<float*> send("send", 4), wrong("wrong", 4 * P + 1), small("small", 3);
  KSHARD_CHECK_THROWS_ALL(world.all_gather(send, wrong), kshard::Error);
  KSHARD_CHECK_THROWS_ALL(world.reduce_scatter(wrong, small, ReduceOp::sum), kshard::Error);
  KSHARD_CHECK_THROWS_ALL(world.all_reduce(send, small, ReduceOp::sum), kshard::Error);
  KSHARD_CHECK_THROWS_ALL(world.broadcast(send, P), kshard::Error);
  Kokkos::View<kshard::float8_e4m3_t*> fp8("fp8", 4);
  KSHARD_CHECK_THROWS_ALL(world.all_reduce(fp8, ReduceOp::sum), kshard::Error);
  Kokkos::View<float**, Kokkos::LayoutRight> m("m", 4, 4);
  auto column = Kokkos::subview(m, Kokkos::ALL(), 1);  // strided
  Kokkos::View<float*> full("full", 4 * P);
  KSHARD_CHECK_THROWS_ALL(world.all_gather(column, full), kshard::Error);
  KSHARD_CHECK_THROWS_ALL(kshard::Communicator().size(), kshard::Error);
}

BOOST_AUTO_TEST_CASE(fp8_moves_as_bytes) {
  const auto& world = kt::world();
  const int P = world.size();
  Kokkos::View<kshard::float8_e4m3_t*> send("send", 3), recv("recv", 3 * P);
  Kokkos::deep_copy(send, kshard::from_float<kshard::float8_e4m3_t>(float(world.rank() + 1)));
  world.all_gather(send, recv);
  auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), recv);
  int bad = 0;
  for (int i = 0; i < 3 * P; ++i) bad += kshard::to_float(h(i)) != float(i / 3 + 1);
  KSHARD_CHECK_ALL(bad == 0);
}

KSHARD_TEST_SUITE_END()
