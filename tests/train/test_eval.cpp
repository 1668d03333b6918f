// Trainer::evaluate: the same number at 1, 2 and 4 ranks and on a 2x2 HSDP
// mesh, with the head's logits in chunks of one row, three rows, all rows
// (the default) or kept whole, equal to an independent reference, and without
// side effects on training.
//
// Tolerance: 2e-6 relative. Every window's loss is computed from the same f32
// logits whatever the world size (a row's logits do not depend on the other
// rows of its batch), in double; only the order of the final double sum and
// of the GEMMs' row blocking can differ (measured on the host: bitwise equal
// at 1, 2, 4 ranks and 2x2). The reference runs the whole evaluation as ONE
// batch of all windows through an unsharded model (one rank) and the
// engine's own cross_entropy_loss (f32 softmax statistics): measured 4e-9
// relative; 2e-6 leaves room for other BLAS blockings and devices.
#include <kshard/testing/harness.hpp>

#include <cmath>
#include <sstream>

#include <kshard/engine/nn/loss.hpp>
#include <kshard/train/trainer.hpp>

#include "train_test_util.hpp"

namespace kt = kshard::testing;
using namespace train_test;

namespace {

constexpr std::int64_t kBatch = 4, kBatches = 5;  // 20 windows: not a multiple of 4 x 4 = 16

double eval_on(const kshard::Communicator& comm, std::vector<int> shape, const std::string& path,
               const char* recipe, bool reshard, std::size_t loss_chunk_bytes) {
  const kshard::DeviceMesh mesh(comm, shape);
  kshard::FsdpOptions fo;
  fo.reshard_after_forward = reshard;
  fo.loss_chunk_bytes = loss_chunk_bytes;
  kshard::FsdpModel model(mesh, tiny_lm(), kshard::Recipe::parse(recipe), fo);
  model.init_parameters(21);
  kshard::TrainerOptions o;
  o.batch = kBatch;
  o.seq = kSeq;
  kshard::Trainer trainer(std::move(model), o);
  const kshard::TokenFile f = kshard::TokenFile::open(comm, path, kshard::TokenDType::u16, kVocab, kSeq + 1);
  const kshard::EvalResult e = trainer.evaluate(f, kBatches);
  if (e.tokens != kBatches * kBatch * kSeq) return NAN;
  return e.loss;
}

/// The whole evaluation in one forward of an unsharded f32 model on this
/// rank alone, windows cut from the test's own token vector, the loss from
/// the engine's cross_entropy_loss.
double reference(const kshard::Communicator& self, const std::vector<std::uint32_t>& tokens) {
  const kshard::DeviceMesh mesh(self, {1});
  kshard::FsdpModel model(mesh, tiny_lm(), kshard::Recipe::parse("fp32"));
  model.init_parameters(21);
  const std::int64_t windows = kBatches * kBatch, rows = windows * kSeq;
  Kokkos::View<std::int32_t*> ids("test.ids", std::size_t(rows)), targets("test.targets", std::size_t(rows));
  auto ih = Kokkos::create_mirror_view(ids);
  auto th = Kokkos::create_mirror_view(targets);
  for (std::int64_t j = 0; j < windows; ++j)
    for (std::int64_t t = 0; t < kSeq; ++t) {
      ih(j * kSeq + t) = std::int32_t(tokens[std::size_t(j * kSeq + t)]);
      th(j * kSeq + t) = std::int32_t(tokens[std::size_t(j * kSeq + t + 1)]);
    }
  Kokkos::deep_copy(ids, ih);
  Kokkos::deep_copy(targets, th);
  const Kokkos::View<const float*> logits = model.forward(ids, {windows, kSeq, 1});
  Kokkos::View<float*> grad("test.dlogits", logits.extent(0));
  const double loss = kshard::cross_entropy_loss<float, std::int32_t>(
      logits, rows, kVocab, Kokkos::View<const std::int32_t*>(targets), grad);
  for (std::size_t i = 0; i < model.num_units(); ++i)
    model.group(i).reshard();
  return loss;
}

}  // namespace

KSHARD_TEST_SUITE(evaluation)

BOOST_AUTO_TEST_CASE(same_loss_for_any_world_size_and_mesh) {
  const auto& world = kt::world();
  KSHARD_SKIP_IF(world.size() < 4, "needs 4 ranks, have " << world.size());
  const auto tokens = make_tokens(400, 31);
  const TempTokenFile f("eval", world.rank(), tokens);
  const kshard::Communicator self = world.split(world.rank(), 0, "self");
  const double ref = reference(self, tokens);
  struct Run {
    int n;
    std::vector<int> shape;
    const char* recipe;
    bool reshard;
    std::size_t chunk_bytes;  // of the head's output: 1 = one row per chunk, 0 = all kept
  };
  const std::size_t one_chunk = std::size_t(128) << 20;
  for (const Run& r :
       {Run{1, {1}, "fp32", true, one_chunk}, Run{2, {2}, "fp32", true, one_chunk},
        Run{4, {4}, "fp32", true, one_chunk}, Run{4, {2, 2}, "fp32", true, one_chunk},
        Run{4, {4}, "fp32", false, one_chunk}, Run{2, {2}, "fp32", true, 1},
        Run{2, {2}, "fp32", true, 3 * kVocab * sizeof(float)}, Run{1, {1}, "fp32", true, 0}}) {
    const kshard::Communicator comm = first_ranks(world, r.n);
    double loss = 0;
    if (world.rank() < r.n)
      loss = eval_on(comm, r.shape, f.path(), r.recipe, r.reshard, r.chunk_bytes);
    // Rank 0's value, seen by every rank.
    std::vector<double> v = {world.rank() == 0 ? loss : 0.0};
    Kokkos::View<double*, Kokkos::HostSpace> buf(v.data(), 1);
    world.broadcast(buf, 0);
    const double rel = std::fabs(v[0] - ref) / ref;
    KSHARD_CHECK_ALL_MSG(std::isfinite(v[0]) && rel <= 2e-6,
                         r.n << " ranks, mesh " << kshard::DeviceMesh::describe(r.shape)
                             << ", head chunks of " << r.chunk_bytes << " B: eval loss " << v[0]
                             << " vs reference " << ref << " (rel " << rel << ")");
    if (world.rank() < r.n)
      BOOST_TEST_MESSAGE(r.n << " ranks " << kshard::DeviceMesh::describe(r.shape)
                             << (r.reshard ? "" : " no-reshard") << ", chunks of "
                             << r.chunk_bytes << " B: " << loss << " (ref "
                             << ref << ", rel " << std::fabs(loss - ref) / ref << ")");
  }
}

// Evaluating between steps changes nothing about training: the same losses
// (bitwise) with and without evaluations, also when units stay unsharded
// from forward to backward (the evaluation's forward must not leave stale
// unsharded parameters behind for the next step). bf16 too.
BOOST_AUTO_TEST_CASE(evaluation_does_not_disturb_training) {
  const auto& world = kt::world();
  const auto tokens = make_tokens(3000, 32);
  const TempTokenFile f("evalmix", world.rank(), tokens);
  const kshard::DeviceMesh mesh(world, {world.size()});
  const kshard::TokenFile file = kshard::TokenFile::open(world, f.path(), kshard::TokenDType::u16, kVocab, kSeq + 1);
  for (const char* recipe : {"fp32", "bf16"})
    for (bool reshard : {true, false}) {
      std::vector<double> curves[2];
      for (int with_eval = 0; with_eval < 2; ++with_eval) {
        kshard::FsdpOptions fo;
        fo.reshard_after_forward = reshard;
        kshard::FsdpModel model(mesh, tiny_lm(), kshard::Recipe::parse(recipe), fo);
        model.init_parameters(3);
        kshard::TrainerOptions o;
        o.batch = 2;
        o.seq = kSeq;
        kshard::Trainer trainer(std::move(model), o);
        for (int s = 0; s < 4; ++s) {
          curves[with_eval].push_back(trainer.step(file).loss);
          if (with_eval) trainer.evaluate(file, 2);
        }
      }
      bool same = true;
      for (std::size_t s = 0; s < 4; ++s) same = same && bits(curves[0][s]) == bits(curves[1][s]);
      KSHARD_CHECK_ALL_MSG(same, recipe << (reshard ? "" : " without reshard-after-forward")
                                        << ": losses changed by evaluations in between");
    }
}

KSHARD_TEST_SUITE_END()
