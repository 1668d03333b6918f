// Trainer: its steps are the hand-written loop it replaced (bitwise), its
// state round-trips (a restored trainer continues bitwise), and the
// divergence guard trips on every rank.
#include <kshard_test/gathers.hpp>
#include <kshard/testing/harness.hpp>

#include <cmath>
#include <sstream>

#include <kshard/optim/loss_scaler.hpp>
#include <kshard/optim/fused_adam.hpp>
#include <kshard/train/trainer.hpp>

#include "train_test_util.hpp"

namespace kt = kshard::testing;
using namespace train_test;

namespace {

kshard::TrainerOptions options(int accum, const char* recipe_name = "fp32") {
  kshard::TrainerOptions o;
  o.batch = 2;
  o.seq = kSeq;
  o.accum = accum;
  o.schedule.lr = 3e-3;
  o.schedule.total_steps = 6;
  o.clip = 1.0;
  (void)recipe_name;
  return o;
}

/// The loop kshard-train ran before the Trainer existed (examples/train at
/// the commit before this suite), verbatim but for the data source: each
/// micro-batch's loss read at once (forward_backward_ce), where the Trainer
/// queues them and reads them with the gradient statistics.
std::vector<double> manual_glue(const kshard::DeviceMesh& mesh, const kshard::TokenSource& data,
                                int steps, int accum, std::vector<std::vector<float>>& params) {
  kshard::FsdpModel model(mesh, tiny_lm(), kshard::Recipe::parse("fp32"));
  model.init_parameters(5);
  kshard::AdamOptions ao;
  ao.lr = float(3e-3);
  kshard::FusedAdam adam(ao, mesh.shard_comm(), mesh.world());
  for (std::size_t i = 0; i < model.num_units(); ++i) {
    kshard::ShardedGroup& g = model.group(i);
    adam.add_group(g.master(), g.grad(), g.low_precision_shard());
  }
  const int world_size = mesh.world().size(), rank = mesh.world().rank();
  const std::int64_t batch = 2, rows = batch * kSeq;
  Kokkos::View<std::int32_t*> ids("test.ids", std::size_t(rows)), targets("test.targets", std::size_t(rows));
  auto ids_h = Kokkos::create_mirror_view(ids);
  auto targets_h = Kokkos::create_mirror_view(targets);
  std::vector<double> losses;
  for (int step = 0; step < steps; ++step) {
    const float scale = 1.f;
    model.zero_grad();
    double loss = 0;
    for (int m = 0; m < accum; ++m) {
      const std::int64_t first = ((std::int64_t(step) * accum + m) * world_size + rank) * batch;
      data.fill(0, first, batch, kSeq, ids_h.data(), targets_h.data());
      Kokkos::deep_copy(ids, ids_h);
      Kokkos::deep_copy(targets, targets_h);
      loss += model.forward_backward_ce(ids, {batch, kSeq, 1}, targets, double(scale) / accum,
                                        m == accum - 1);
    }
    loss /= accum;
    const kshard::GradShardStats local = model.prepare_optimizer_step().grads;
    adam.apply(adam.combine_stats(local.sum_squares, local.nonfinite > 0, scale), scale, 1.0);
    model.finish_optimizer_step();
    losses.push_back(loss);
  }
  params = kshard::test::gather_master_parameters(model);
  return losses;
}

std::vector<double> with_trainer(const kshard::DeviceMesh& mesh, const kshard::TokenSource& data,
                                 int steps, int accum, std::vector<std::vector<float>>& params) {
  kshard::FsdpModel model(mesh, tiny_lm(), kshard::Recipe::parse("fp32"));
  model.init_parameters(5);
  kshard::Trainer trainer(std::move(model), options(accum));
  std::vector<double> losses;
  for (int s = 0; s < steps; ++s) losses.push_back(trainer.step(data).local_loss);
  params = kshard::test::gather_master_parameters(trainer.model());
  return losses;
}

}  // namespace

KSHARD_TEST_SUITE(trainer)

// Same losses (bitwise, fp32) and the same parameters at the end, on 2 ranks,
// with and without gradient accumulation.
BOOST_AUTO_TEST_CASE(steps_equal_the_manual_glue) {
  KSHARD_SKIP_IF(kt::world_size() < 2, "compares on a 2-rank mesh");
  const auto& world = kt::world();
  const kshard::Communicator two = first_ranks(world, 2);
  const VectorSource data(make_tokens(4000, 3));
  std::string why;
  if (world.rank() < 2) {
    const kshard::DeviceMesh mesh(two, {2});
    for (int accum : {1, 2}) {
      std::vector<std::vector<float>> pa, pb;
      const auto a = manual_glue(mesh, data, 5, accum, pa);
      const auto b = with_trainer(mesh, data, 5, accum, pb);
      for (std::size_t s = 0; s < a.size(); ++s)
        if (bits(a[s]) != bits(b[s])) {
          std::ostringstream m;
          m << "accum " << accum << " step " << s + 1 << ": loss " << b[s] << " vs glue " << a[s];
          if (why.empty()) why = m.str();
        }
      if (!same_bits(pa, pb) && why.empty()) why = "accum " + std::to_string(accum) + ": parameters differ";
    }
  }
  KSHARD_CHECK_ALL_MSG(why.empty(), why);
}

// state() + the tensors, put into a fresh trainer, continue exactly where the
// first one would have: the checkpoint contract.
BOOST_AUTO_TEST_CASE(restored_state_continues_bitwise) {
  const auto& world = kt::world();
  const kshard::DeviceMesh mesh(world, {world.size()});
  const VectorSource data(make_tokens(4000, 4));
  kshard::TrainerOptions o = options(1);
  o.schedule = {kshard::LrScheduleKind::cosine, 3e-3, 3e-4, 2, 8};
  o.adam.weight_decay = 0.1f;

  kshard::FsdpModel m1(mesh, tiny_lm(), kshard::Recipe::parse("fp32"));
  m1.init_parameters(9);
  kshard::Trainer straight(std::move(m1), o);
  std::vector<double> want;
  for (int s = 0; s < 8; ++s) want.push_back(straight.step(data).local_loss);

  kshard::FsdpModel m2(mesh, tiny_lm(), kshard::Recipe::parse("fp32"));
  m2.init_parameters(9);
  kshard::Trainer first(std::move(m2), o);
  std::vector<double> got;
  for (int s = 0; s < 3; ++s) got.push_back(first.step(data).local_loss);
  const kshard::TrainerState saved = first.state();
  KSHARD_CHECK_ALL(saved.step == 3 && saved.optimizer_steps == 3 &&
                   saved.data_position == 3 * first.sequences_per_step() && saved.schedule == o.schedule);

  // A second trainer built with other settings, then restored.
  kshard::TrainerOptions other = o;
  other.schedule = {kshard::LrScheduleKind::constant, 1.0, 0.0, 0, 1};
  kshard::FsdpModel m3(mesh, tiny_lm(), kshard::Recipe::parse("fp32"));
  m3.init_parameters(77);
  kshard::Trainer second(std::move(m3), other);
  second.restore(saved);
  for (std::size_t i = 0; i < first.model().num_units(); ++i) {
    Kokkos::deep_copy(second.model().group(i).master(), first.model().group(i).master());
    const auto& a = first.optimizer().state(int(i));
    const auto& b = second.optimizer().state(int(i));
    Kokkos::deep_copy(b.exp_avg, a.exp_avg);
    Kokkos::deep_copy(b.exp_avg_sq, a.exp_avg_sq);
  }
  KSHARD_CHECK_ALL(second.state() == saved);
  for (int s = 3; s < 8; ++s) got.push_back(second.step(data).local_loss);
  bool ok = got.size() == want.size();
  for (std::size_t s = 0; ok && s < got.size(); ++s) ok = bits(got[s]) == bits(want[s]);
  KSHARD_CHECK_ALL_MSG(ok, "resumed losses differ from the straight run");

  // Bad states change nothing and throw everywhere.
  kshard::TrainerState bad = saved;
  bad.optimizer_steps = saved.step + 1;
  KSHARD_CHECK_THROWS_ALL(second.restore(bad), kshard::Error);
  bad = saved;
  bad.loss_scale = -1.f;
  KSHARD_CHECK_THROWS_ALL(second.restore(bad), kshard::Error);
  bad = saved;
  if (world.size() > 1) {  // (at 1 rank no rank can differ)
    if (world.rank() == world.size() - 1) bad.data_position += 1;  // one rank differs
    KSHARD_CHECK_THROWS_ALL(second.restore(bad), kshard::Error);
  }
  KSHARD_CHECK_ALL(second.state().step == 8);
}

// fp16's loss scaler state is part of TrainerState and restores.
BOOST_AUTO_TEST_CASE(loss_scaler_state_restores) {
  kshard::DynamicLossScaler s(1024.f, 3);
  s.update(false);
  s.update(true);
  s.update(false);
  kshard::DynamicLossScaler t(4096.f, 3);
  t.restore(s.scale(), s.good_steps());
  bool ok = true;
  for (bool bad : {false, false, true, false, false, false}) {
    s.update(bad);
    t.update(bad);
    ok = ok && s.scale() == t.scale() && s.good_steps() == t.good_steps();
  }
  KSHARD_CHECK_ALL(ok && t.scale() == 1024.f);
  KSHARD_CHECK_THROWS_ALL(t.restore(0.5f, 0), kshard::Error);
  KSHARD_CHECK_THROWS_ALL(t.restore(8.f, 3), kshard::Error);
}

// lr 1e30: the first step makes the parameters non-finite; every later step is
// skipped; the third skip in a row throws TrainingDiverged on every rank, and
// the report says NaN for the norm.
BOOST_AUTO_TEST_CASE(divergence_guard_trips_on_every_rank) {
  const auto& world = kt::world();
  const kshard::DeviceMesh mesh(world, {world.size()});
  const VectorSource data(make_tokens(4000, 5));
  kshard::TrainerOptions o = options(1);
  o.schedule.lr = 1e30;
  o.max_skipped = 3;
  kshard::FsdpModel model(mesh, tiny_lm(), kshard::Recipe::parse("fp32"));
  model.init_parameters(1);
  kshard::Trainer trainer(std::move(model), o);
  int steps = 0;
  bool nan_norm = true;
  std::string caught;
  try {
    for (; steps < 20; ++steps) {
      const kshard::StepReport r = trainer.step(data);
      if (r.optimizer.skipped) nan_norm = nan_norm && std::isnan(r.optimizer.grad_norm);
    }
  } catch (const kshard::TrainingDiverged& e) {
    caught = e.what();
    nan_norm = nan_norm && std::isnan(e.report().optimizer.grad_norm) && e.report().step == 4;
  }
  KSHARD_CHECK_ALL_MSG(caught.find("3 optimizer steps in a row were skipped") != std::string::npos,
                       "caught '" << caught << "' after " << steps << " steps");
  KSHARD_CHECK_ALL(nan_norm && steps == 3);
}

namespace {

/// VectorSource, but a target >= vocab (or a token id outside [0, vocab))
/// in the sequences of the odd ranks' slices (bad_rank 1; every rank's when
/// bad_rank < 0) while `armed`.
class BadTargetSource final : public kshard::TokenSource {
 public:
  BadTargetSource(const kshard::TokenSource& inner, std::int64_t batch, int bad_rank)
      : inner_(inner), batch_(batch), bad_rank_(bad_rank) {}
  void fill(std::uint64_t seed, std::int64_t first, std::int64_t count, std::int64_t seq,
            std::int32_t* ids, std::int32_t* targets) const override {
    inner_.fill(seed, first, count, seq, ids, targets);
    if (armed && (bad_rank_ < 0 || (first / batch_) % 2 == bad_rank_)) {
      if (bad_id)
        ids[seq - 1] = id_value;
      else
        targets[seq - 1] = kVocab;
    }
  }
  std::string describe() const override { return "bad-target source"; }
  bool armed = true;
  bool bad_id = false;
  std::int32_t id_value = -1;

 private:
  const kshard::TokenSource& inner_;
  std::int64_t batch_;
  int bad_rank_;
};

}  // namespace

// A target >= vocab, or a token id below 0 or >= vocab, on some ranks (all
// at 1 rank): the queued step finds it at its one read (the embedding
// counted the ids instead of waiting to check them), every rank throws
// before the optimizer (the parameters are unchanged) and the next good step
// trains normally.
BOOST_AUTO_TEST_CASE(bad_target_or_id_throws_everywhere_before_the_update) {
  const auto& world = kt::world();
  const kshard::DeviceMesh mesh(world, {world.size()});
  const VectorSource good(make_tokens(4000, 8));
  kshard::TrainerOptions o = options(2);
  kshard::FsdpModel model(mesh, tiny_lm(), kshard::Recipe::parse("fp32"));
  model.init_parameters(4);
  kshard::Trainer t(std::move(model), o);
  t.step(good);
  struct Case {
    bool bad_id;
    std::int32_t id;
    const char* says;
  };
  for (const Case c : {Case{false, 0, "targets are >= vocab"},
                       Case{true, -1, "token ids are not integers in [0, 40)"},
                       Case{true, std::int32_t(kVocab), "token ids are not integers in [0, 40)"}}) {
    BadTargetSource bad(good, o.batch, world.size() > 1 ? 1 : -1);
    bad.bad_id = c.bad_id;
    bad.id_value = c.id;
    const std::int64_t steps = t.step_count();
    const auto before = kshard::test::gather_master_parameters(t.model());
    std::string caught;
    try {
      t.step(bad);
    } catch (const kshard::Error& e) {
      caught = e.what();
    }
    KSHARD_CHECK_ALL_MSG(caught.find(c.says) != std::string::npos,
                         "caught '" << caught << "', expected '" << c.says << "'");
    KSHARD_CHECK_ALL(same_bits(before, kshard::test::gather_master_parameters(t.model())));
    KSHARD_CHECK_ALL(t.step_count() == steps);
    bad.armed = false;
    const kshard::StepReport r = t.step(bad);
    KSHARD_CHECK_ALL(std::isfinite(r.loss) && !r.optimizer.skipped && t.step_count() == steps + 1);
  }
}

BOOST_AUTO_TEST_CASE(bad_options_throw) {
  const auto& world = kt::world();
  const kshard::DeviceMesh mesh(world, {world.size()});
  for (int k = 0; k < 3; ++k) {
    kshard::TrainerOptions o = options(1);
    if (k == 0) o.accum = 0;
    if (k == 1) o.schedule.min_lr = 1.0;  // above lr
    if (k == 2) o.clip = -1;
    kshard::FsdpModel model(mesh, tiny_lm(), kshard::Recipe::parse("fp32"));
    KSHARD_CHECK_THROWS_ALL(kshard::Trainer(std::move(model), o), kshard::Error);
  }
}

KSHARD_TEST_SUITE_END()
