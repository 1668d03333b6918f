#pragma once
// TrainerState: everything of a Trainer that is not a tensor — what a
// checkpoint stores next to the parameter and moment bytes (which it reads
// through Trainer::model() and Trainer::optimizer()).
//
//   kshard::TrainerState s = trainer.state();   // any time between steps
//   ...
//   trainer.restore(s);                          // same step, scale, rates, data
//
// Plain data on purpose: a checkpoint writes the fields by name (JSON), and
// two states compare with ==. There is no random-number generator state to
// keep: parameter init and data offsets are counter-based (splitmix64 of a
// seed and an index), so a seed plus a position determines them.
#include <cstdint>

#include "kshard/optim/lr_schedule.hpp"

namespace kshard {

struct TrainerState {
  /// Optimizer steps attempted, skipped ones included: the next step is
  /// step + 1 (1-based) and takes its LR from schedule.at(step).
  std::int64_t step = 0;
  /// FusedAdam's step count (skipped steps do not count): Adam's bias correction.
  std::int64_t optimizer_steps = 0;
  /// DynamicLossScaler (fp16): current scale and good steps since the last change.
  float loss_scale = 1.f;
  std::int32_t loss_scale_good_steps = 0;
  /// Skipped steps in a row at the end of the run (the divergence guard's count).
  std::int32_t consecutive_skipped = 0;
  LrScheduleConfig schedule;
  /// Data: the seed of the window offsets and the number of the next global
  /// training sequence (see TokenSource).
  std::uint64_t data_seed = 0;
  std::int64_t data_position = 0;

  bool operator==(const TrainerState& o) const {
    return step == o.step && optimizer_steps == o.optimizer_steps &&
           loss_scale == o.loss_scale && loss_scale_good_steps == o.loss_scale_good_steps &&
           consecutive_skipped == o.consecutive_skipped && schedule == o.schedule &&
           data_seed == o.data_seed && data_position == o.data_position;
  }
  bool operator!=(const TrainerState& o) const { return !(*this == o); }
};

}  // namespace kshard
