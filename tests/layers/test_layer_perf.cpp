// Timing of one TransformerLayer forward + backward (float). Disabled by
// default (it is a measurement, not a check); run it with
//   kshard_layers_unit --run_test=layer_perf --log_level=message
// Sizes from KSHARD_LAYER_PERF="batch,seq,d_model,heads,d_ff" (default
// 4,128,768,12,3072: GPT-2 small's block).
#include <boost/test/unit_test.hpp>

#include <chrono>
#include <cstdio>
#include <cstdlib>

#include "kshard/engine/nn/transformer_layer.hpp"
#include "layer_test_util.hpp"

using namespace kshard;
using namespace kshard::test;

BOOST_AUTO_TEST_SUITE(layer_perf, *boost::unit_test::disabled())

BOOST_AUTO_TEST_CASE(transformer_layer_forward_backward) {
  long b = 4, s = 128, d = 768, h = 12, ff = 3072;
  if (const char* e = std::getenv("KSHARD_LAYER_PERF"))
    BOOST_REQUIRE(std::sscanf(e, "%ld,%ld,%ld,%ld,%ld", &b, &s, &d, &h, &ff) == 5);
  TransformerLayer<float> block(d, h, ff);
  auto params = allocate_parameters(block);
  init_parameters(block, params, 1);
  auto grads = allocate_parameters(block);
  const ActShape shape{b, s, d};
  std::mt19937_64 rng(1);
  auto x = to_device<float>(random_vec(static_cast<std::size_t>(shape.numel()), rng), "x");
  auto dy = to_device<float>(random_vec(static_cast<std::size_t>(shape.numel()), rng), "dy");
  Kokkos::View<float*> y("y", x.extent(0)), dx("dx", x.extent(0));
  const auto cp = const_views(params);
  using clock = std::chrono::steady_clock;
  double t_fwd = 0, t_bwd = 0;
  const int warm = 2, iters = 10;
  for (int i = 0; i < warm + iters; ++i) {
    Kokkos::fence();
    const auto t0 = clock::now();
    block.forward(x, shape, cp, y);
    Kokkos::fence();
    const auto t1 = clock::now();
    block.backward(dy, cp, grads, dx);
    Kokkos::fence();
    const auto t2 = clock::now();
    if (i >= warm) {
      t_fwd += std::chrono::duration<double>(t1 - t0).count() / iters;
      t_bwd += std::chrono::duration<double>(t2 - t1).count() / iters;
    }
  }
  // Matmul flops: 4 projections (qkv 3d^2, proj d^2), 2 MLP (2 d ff), scores + ctx (2 s d).
  const double rows = double(b) * s;
  const double fwd_flops = 2 * rows * (4.0 * d * d + 2.0 * d * ff) + 2 * 2.0 * b * s * s * d;
  BOOST_TEST_MESSAGE("TransformerLayer<float> b=" << b << " s=" << s << " d=" << d << " h=" << h
                     << " ff=" << ff << ": forward " << t_fwd * 1e3 << " ms ("
                     << fwd_flops / t_fwd * 1e-9 << " GFLOP/s), backward " << t_bwd * 1e3
                     << " ms (" << 2 * fwd_flops / t_bwd * 1e-9 << " GFLOP/s)");
  BOOST_TEST(t_fwd > 0);
}

BOOST_AUTO_TEST_SUITE_END()
