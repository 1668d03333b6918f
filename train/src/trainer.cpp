#include "kshard/train/trainer.hpp"

#include <algorithm>
#include <cmath>
#include <exception>
#include <sstream>
#include <string>
#include <utility>

#include "kshard/engine/nn/loss.hpp"
#include "kshard/mesh/agree.hpp"

namespace kshard {
namespace {

using HostIds = Kokkos::View<const std::int32_t*, Kokkos::HostSpace,
                             Kokkos::MemoryTraits<Kokkos::Unmanaged>>;

void check_options(const TrainerOptions& o) {
  std::ostringstream bad;
  if (o.batch < 1) bad << "batch " << o.batch << "; ";
  if (o.seq < 1) bad << "seq " << o.seq << "; ";
  if (o.accum < 1) bad << "accum " << o.accum << "; ";
  if (!(std::isfinite(o.clip) && o.clip >= 0)) bad << "clip " << o.clip << "; ";
  if (o.max_skipped < 0) bad << "max_skipped " << o.max_skipped << "; ";
  if (!(std::isfinite(o.initial_loss_scale) && o.initial_loss_scale >= 1))
    bad << "initial_loss_scale " << o.initial_loss_scale << "; ";
  if (o.loss_scale_growth_interval < 1)
    bad << "loss_scale_growth_interval " << o.loss_scale_growth_interval << "; ";
  const std::string s = bad.str();
  if (!s.empty())
    throw Error("TrainerOptions with " + s.substr(0, s.size() - 2),
                "batch, seq, accum >= 1, a finite clip >= 0, max_skipped >= 0, a finite "
                "initial_loss_scale >= 1 and loss_scale_growth_interval >= 1");
}

AdamOptions with_lr(AdamOptions a, double lr) {
  a.lr = float(lr);
  return a;
}

}  // namespace

Trainer::Trainer(FsdpModel model, TrainerOptions options)
    : model_(std::move(model)),
      options_((check_options(options), options)),
      schedule_(options_.schedule),
      scaler_(options_.initial_loss_scale, options_.loss_scale_growth_interval),
      saver_(std::make_unique<AsyncSaver>()) {
  const DeviceMesh& mesh = model_.mesh();
  adam_ = std::make_unique<FusedAdam>(with_lr(options_.adam, schedule_.at(0)), mesh.shard_comm(),
                                      mesh.world());
  for (std::size_t i = 0; i < model_.num_units(); ++i) adam_->add_group(model_.group(i));
  const std::size_t rows = std::size_t(options_.batch * options_.seq);
  ids_ = Kokkos::View<std::int32_t*>("kshard.train.ids", rows);
  targets_ = Kokkos::View<std::int32_t*>("kshard.train.targets", rows);
  ids_host_.resize(rows * std::size_t(options_.accum));
  targets_host_.resize(rows * std::size_t(options_.accum));
}

Trainer::~Trainer() = default;

std::int64_t Trainer::sequences_per_step() const noexcept {
  return std::int64_t(options_.accum) * model_.mesh().world().size() * options_.batch;
}

void Trainer::fill_host(const TokenSource& data) {
  const Communicator& world = model_.mesh().world();
  const std::int64_t rows = options_.batch * options_.seq;
  std::exception_ptr failure;
  try {
    for (int m = 0; m < options_.accum; ++m) {
      // Global micro-batch m of this step holds world * batch sequences;
      // this rank's slice starts at its world rank.
      const std::int64_t first =
          position_ + (std::int64_t(m) * world.size() + world.rank()) * options_.batch;
      data.fill(options_.data_seed, first, options_.batch, options_.seq,
                ids_host_.data() + m * rows, targets_host_.data() + m * rows);
    }
  } catch (...) {
    failure = std::current_exception();
  }
  agree_ok(model_.mesh().world(), failure, "reading training data from " + data.describe());
}

StepReport Trainer::step(const TokenSource& data) {
  // A pending asynchronous save is committed here once every rank's write
  // has ended (collective: every rank steps alike); a failed write throws
  // before this step changes anything.
  std::optional<SaveInfo> committed = saver_->poll();
  fill_host(data);
  StepReport r;
  r.committed_save = std::move(committed);
  r.lr = schedule_.at(step_);
  adam_->set_lr(float(r.lr));
  const bool scaling = model_.recipe().loss_scaling;
  const float scale = scaling ? scaler_.scale() : 1.f;
  r.loss_scale = scale;
  const std::int64_t rows = options_.batch * options_.seq;
  const ActShape shape{options_.batch, options_.seq, 1};

  model_.zero_grad();
  for (int m = 0; m < options_.accum; ++m) {
    // deep_copy without an execution space fences first: the previous
    // micro-batch's forward and backward, which read ids_, have finished.
    // (So the step still waits here once per micro-batch after the first, and
    // at the first for the previous step's optimizer.)
    Kokkos::deep_copy(ids_, HostIds(ids_host_.data() + m * rows, std::size_t(rows)));
    Kokkos::deep_copy(targets_, HostIds(targets_host_.data() + m * rows, std::size_t(rows)));
    model_.queue_forward_backward_ce(ids_, shape, targets_, double(scale) / options_.accum,
                                     m == options_.accum - 1);
  }
  // The step's one wait: the losses and the gradient statistics (global norm
  // for clipping, inf/NaN for the skip), computed while the reduce-scatters
  // were accumulated into the shards, come in one copy; the statistics are
  // combined across ranks and the update runs without a second read of every
  // gradient (FusedAdam::step() would do that pass itself).
  PreparedStep local;
  {
    std::exception_ptr failure;
    try {
      local = model_.prepare_optimizer_step();
    } catch (...) {
      failure = std::current_exception();
    }
    agree_ok(model_.mesh().world(), failure, "the step's losses and gradient statistics");
  }
  double loss = 0;
  for (double l : local.losses) loss += l;
  r.local_loss = loss / options_.accum;
  r.optimizer = adam_->apply(
      adam_->combine_stats(local.grads.sum_squares, local.grads.nonfinite > 0, scale), scale,
      options_.clip);
  if (scaling) scaler_.update(r.optimizer.found_nonfinite);
  model_.finish_optimizer_step();

  ++step_;
  position_ += sequences_per_step();
  consecutive_skipped_ = r.optimizer.skipped ? consecutive_skipped_ + 1 : 0;
  r.step = step_;
  r.consecutive_skipped = consecutive_skipped_;
  std::vector<double> loss_avg = {r.local_loss};
  host_all_reduce(model_.mesh().world(), loss_avg, ReduceOp::avg);
  r.loss = loss_avg[0];

  if (options_.max_skipped > 0 && consecutive_skipped_ >= options_.max_skipped) {
    std::ostringstream m;
    m << "training diverged: " << consecutive_skipped_
      << " optimizer steps in a row were skipped for inf/NaN gradients (step " << step_
      << ", loss " << (std::isnan(r.loss) ? std::fabs(r.loss) : r.loss) << ", lr " << r.lr;
    if (scaling) m << ", loss scale " << scale;
    m << ")";
    throw TrainingDiverged(m.str(),
                           "finite gradients: a lower learning rate, gradient clipping, or a "
                           "larger max_skipped (--max-skipped, 0: off)",
                           r);
  }
  return r;
}

EvalResult Trainer::evaluate(const TokenFile& data, std::int64_t batches) {
  const std::int64_t batch = options_.batch, seq = options_.seq, rows = batch * seq;
  if (batches < 1)
    throw Error("evaluation over " + std::to_string(batches) + " batches", "at least 1");
  const std::int64_t windows = batches * batch;
  if (data.num_tokens() < windows * seq + 1)
    throw Error(data.describe() + " is too short to evaluate " + std::to_string(batches) +
                    " batches of " + std::to_string(batch) + " windows of " +
                    std::to_string(seq + 1) + " tokens",
                "at least batches x batch x seq + 1 = " + std::to_string(windows * seq + 1) +
                    " tokens (or fewer --eval-batches)");
  const Communicator& world = model_.mesh().world();
  const std::int64_t per_pass = std::int64_t(world.size()) * batch;
  // Every rank runs the same number of forward passes (they are collective).
  const std::int64_t passes = (windows + per_pass - 1) / per_pass;
  const ActShape shape{batch, seq, 1};
  // A forward without backward leaves the last unit (every unit without
  // reshard_after_forward) unsharded: free them when leaving, also on an
  // error, or the next forward would use these parameters after the
  // optimizer has changed the shards. (Resharding is local.)
  struct Reshard {
    FsdpModel& m;
    ~Reshard() {
      for (std::size_t i = 0; i < m.num_units(); ++i)
        m.group(i).reshard();
    }
  } reshard{model_};
  double sum = 0, count = 0;
  for (std::int64_t p = 0; p < passes; ++p) {
    const std::int64_t first = p * per_pass + std::int64_t(world.rank()) * batch;
    const std::int64_t valid = std::max<std::int64_t>(0, std::min(batch, windows - first));
    std::exception_ptr failure;
    try {
      data.fill_eval(first, valid, seq, ids_host_.data(), targets_host_.data());
    } catch (...) {
      failure = std::current_exception();
    }
    agree_ok(model_.mesh().world(), failure, "reading evaluation data from " + data.describe());
    // Padding rows: a valid id, an ignored target.
    std::fill(ids_host_.begin() + valid * seq, ids_host_.begin() + rows, 0);
    std::fill(targets_host_.begin() + valid * seq, targets_host_.begin() + rows, -1);
    count += double(valid * seq);
    Kokkos::deep_copy(ids_, HostIds(ids_host_.data(), std::size_t(rows)));
    Kokkos::deep_copy(targets_, HostIds(targets_host_.data(), std::size_t(rows)));
    // The head runs in row chunks (FsdpOptions::loss_chunk_bytes): the
    // evaluation never holds the whole logits either.
    model_.forward_chunks(ids_, shape,
                          [&](std::int64_t r0, std::int64_t n, Kokkos::View<const float*> logits) {
                            const std::int64_t vocab = std::int64_t(logits.extent(0)) / n;
                            sum += cross_entropy_sum<float, std::int32_t>(
                                       logits, n, vocab,
                                       Kokkos::subview(targets_, std::make_pair(r0, r0 + n)))
                                       .sum;
                          });
  }
  std::vector<double> total = {sum, count};
  host_all_reduce(model_.mesh().world(), total, ReduceOp::sum);
  EvalResult e;
  e.tokens = std::int64_t(total[1]);
  e.loss = total[0] / total[1];
  return e;
}

TrainerState Trainer::state() const {
  TrainerState s;
  s.step = step_;
  s.optimizer_steps = adam_->step_count();
  s.loss_scale = scaler_.scale();
  s.loss_scale_good_steps = scaler_.good_steps();
  s.consecutive_skipped = consecutive_skipped_;
  s.schedule = schedule_.config();
  s.data_seed = options_.data_seed;
  s.data_position = position_;
  return s;
}

void Trainer::check_restorable(const TrainerState& s) const {
  std::ostringstream bad;
  if (s.step < 0) bad << "step " << s.step << "; ";
  if (s.optimizer_steps < 0 || s.optimizer_steps > s.step)
    bad << "optimizer_steps " << s.optimizer_steps << " for step " << s.step << "; ";
  if (s.consecutive_skipped < 0) bad << "consecutive_skipped " << s.consecutive_skipped << "; ";
  if (s.data_position < 0) bad << "data_position " << s.data_position << "; ";
  const std::string problem = bad.str();
  if (!problem.empty())
    throw Error("TrainerState with " + problem.substr(0, problem.size() - 2),
                "a state saved by Trainer::state()");
  LrSchedule check(s.schedule);
  DynamicLossScaler probe(options_.initial_loss_scale, options_.loss_scale_growth_interval);
  probe.restore(s.loss_scale, s.loss_scale_good_steps);
}

void Trainer::restore(const TrainerState& s) {
  // Validated here, before anything changes, so a bad state changes nothing.
  std::exception_ptr failure;
  try {
    check_restorable(s);
  } catch (...) {
    failure = std::current_exception();
  }
  agree_ok(model_.mesh().world(), failure, "Trainer::restore");
  // Every rank must continue from the same state.
  agree_same(model_.mesh().world(), "Trainer::restore",
             {{"the step", s.step},
              {"the optimizer step count", s.optimizer_steps},
              {"the data position", s.data_position},
              {"the data seed", std::int64_t(s.data_seed & ((std::uint64_t(1) << 62) - 1))}},
             "the same TrainerState on every rank");
  schedule_ = LrSchedule(s.schedule);
  options_.schedule = s.schedule;
  adam_->set_step_count(s.optimizer_steps);
  scaler_.restore(s.loss_scale, s.loss_scale_good_steps);
  options_.data_seed = s.data_seed;
  step_ = s.step;
  position_ = s.data_position;
  consecutive_skipped_ = s.consecutive_skipped;
}

}  // namespace kshard
