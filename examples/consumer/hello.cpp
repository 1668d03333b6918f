// The smallest kshard program: a Session and one all-reduce.
#include <cstdio>

#include <kshard/mesh/session.hpp>

int main(int argc, char** argv) {
  kshard::Session session(argc, argv);
  const auto& world = session.world();
  Kokkos::View<int*> v("v", 1);
  Kokkos::deep_copy(v, world.rank() + 1);
  world.all_reduce(v, kshard::ReduceOp::sum);
  auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), v);
  if (world.rank() == 0) std::printf("sum over %d ranks: %d\n", world.size(), h(0));
  return h(0) == world.size() * (world.size() + 1) / 2 ? 0 : 1;
}
