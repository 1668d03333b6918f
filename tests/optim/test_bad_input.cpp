// Bad arguments are a kshard::Error on EVERY rank, also when only one rank
// got them (the others would otherwise wait in the next collective), and the
// ranks stay in step afterwards.
#include <kshard/testing/harness.hpp>

#include <cmath>

#include <kshard/optim/fused_adam.hpp>

#include "optim_test_util.hpp"

namespace kt = kshard::testing;
using namespace optim_test;

KSHARD_TEST_SUITE(optim_bad_input)

BOOST_AUTO_TEST_CASE(mismatched_master_and_grad) {
  const auto& w = kt::world();
  kshard::FusedAdam opt({}, w, w);
  Vec master("test.master", 10), grad("test.grad", 9), ok("test.ok", 10);
  KSHARD_CHECK_THROWS_ALL(opt.add_group(master, grad), kshard::Error);
  // Only the last rank passes a bad size: every rank throws all the same.
  KSHARD_CHECK_THROWS_ALL(opt.add_group(master, w.rank() == w.size() - 1 ? grad : ok),
                          kshard::Error);
  KSHARD_CHECK_THROWS_ALL(opt.add_group(master, master), kshard::Error);  // aliasing
  KSHARD_CHECK_ALL(opt.num_groups() == 0);
  // Still usable, and still in step: a good group and a step.
  KSHARD_CHECK_ALL(opt.add_group(master, ok) == 0);
  KSHARD_CHECK_ALL(!opt.step().skipped);
}

BOOST_AUTO_TEST_CASE(bad_model_copy) {
  const auto& w = kt::world();
  kshard::FusedAdam opt({}, w, w);
  Vec master("test.master", 8), grad("test.grad", 8);
  Kokkos::View<kshard::bfloat16_t*> short_copy("test.model", 7);
  KSHARD_CHECK_THROWS_ALL(opt.add_group(master, grad, short_copy), kshard::Error);
  Kokkos::View<kshard::float16_t*> long_copy("test.model16", 9);
  KSHARD_CHECK_THROWS_ALL(opt.add_group(master, grad, long_copy), kshard::Error);
  // (A copy of another dtype, or a null one, cannot be expressed: the copy
  // is a typed bf16/f16 View.)
}

BOOST_AUTO_TEST_CASE(unsupported_moment_dtype) {
  const auto& w = kt::world();
  for (kshard::DType t : {kshard::DType::f16, kshard::DType::e4m3, kshard::DType::f64, kshard::DType::i32}) {
    kshard::AdamOptions o;
    o.moment_dtype = t;
    KSHARD_CHECK_THROWS_ALL(kshard::FusedAdam(o, w, w), kshard::Error);
  }
  kshard::AdamOptions o;
  if (w.rank() == 0) o.moment_dtype = kshard::DType::f16;  // one rank only
  KSHARD_CHECK_THROWS_ALL(kshard::FusedAdam(o, w, w), kshard::Error);
}

BOOST_AUTO_TEST_CASE(bad_hyperparameters) {
  const auto& w = kt::world();
  auto with = [](auto f) {
    kshard::AdamOptions o;
    f(o);
    return o;
  };
  const kshard::AdamOptions bad[] = {
      with([](kshard::AdamOptions& o) { o.lr = -1e-3f; }),
      with([](kshard::AdamOptions& o) { o.lr = NAN; }),
      with([](kshard::AdamOptions& o) { o.beta1 = 1.f; }),
      with([](kshard::AdamOptions& o) { o.beta2 = -0.1f; }),
      with([](kshard::AdamOptions& o) { o.eps = -1.f; }),
      with([](kshard::AdamOptions& o) { o.weight_decay = -0.1f; }),
  };
  for (const auto& o : bad) KSHARD_CHECK_THROWS_ALL(kshard::FusedAdam(o, w, w), kshard::Error);
  // Ranks that disagree on the options (silently different updates) are caught.
  kshard::AdamOptions o;
  if (w.rank() == w.size() - 1) o.lr = 2e-3f;
  if (w.size() > 1) KSHARD_CHECK_THROWS_ALL(kshard::FusedAdam(o, w, w), kshard::Error);
  KSHARD_CHECK_THROWS_ALL(kshard::FusedAdam({}, kshard::Communicator(), w), kshard::Error);
}

BOOST_AUTO_TEST_CASE(bad_step_arguments) {
  const auto& w = kt::world();
  kshard::FusedAdam opt({}, w, w);
  Vec master("test.master", 4), grad("test.grad", 4);
  opt.add_group(master, grad);
  KSHARD_CHECK_THROWS_ALL(opt.step(0.f), kshard::Error);
  KSHARD_CHECK_THROWS_ALL(opt.step(NAN), kshard::Error);
  KSHARD_CHECK_THROWS_ALL(opt.step(1.f, -1.0), kshard::Error);
  KSHARD_CHECK_THROWS_ALL(opt.step(w.rank() == 0 ? -1.f : 1.f), kshard::Error);  // one rank
  KSHARD_CHECK_ALL(opt.step_count() == 0);
  KSHARD_CHECK_THROWS_ALL(opt.state(1), kshard::Error);
  KSHARD_CHECK_THROWS_ALL(opt.set_lr(-1.f), kshard::Error);
  KSHARD_CHECK_THROWS_ALL(opt.set_step_count(-1), kshard::Error);
  KSHARD_CHECK_ALL(opt.step().step == 1);
}

KSHARD_TEST_SUITE_END()
