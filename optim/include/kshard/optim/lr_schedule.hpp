#pragma once
// LrSchedule: the learning rate of optimizer step s as a closed-form function
// of a small config — no state that evolves, so a checkpoint saves the config
// (a plain struct) and the step, and a resumed run gets the very same rates.
//
//   kshard::LrScheduleConfig c;
//   c.kind = kshard::LrScheduleKind::cosine;
//   c.lr = 6e-4; c.min_lr = 6e-5; c.warmup = 100; c.total_steps = 5000;
//   kshard::LrSchedule sched(c);          // throws kshard::Error on a bad config
//   adam.set_lr(float(sched.at(step)));   // step = 0 for the first optimizer step
//
// With W = warmup, T = total_steps, s = 0, 1, ... (steps past T-1 keep the
// last value):
//   s <  W:  lr * (s + 1) / (W + 1)          linear warmup from 0 (at s = -1)
//                                            up to lr (reached at s = W)
//   s >= W:  constant   lr
//            linear     min_lr + (lr - min_lr) * (1 - p)
//            cosine     min_lr + (lr - min_lr) * (1 + cos(pi p)) / 2
//   with p = min(1, (s - W) / (T - 1 - W)) (p = 1 when T - 1 - W <= 0), so the
//   decays reach min_lr exactly at the last step s = T - 1.
// The warmup never gives 0 (a step with lr 0 would only move Adam's moments);
// it is nanoGPT's convention.
#include <cstdint>
#include <string>

namespace kshard {

enum class LrScheduleKind : std::uint8_t { constant = 0, linear = 1, cosine = 2 };

/// Everything the schedule depends on: plain data, saved as is in checkpoints.
struct LrScheduleConfig {
  LrScheduleKind kind = LrScheduleKind::constant;
  double lr = 1e-3;               ///< peak rate (after warmup)
  double min_lr = 0.0;            ///< end of the linear / cosine decay
  std::int64_t warmup = 0;        ///< warmup steps W
  std::int64_t total_steps = 1;   ///< T: the decay ends at step T - 1
  bool operator==(const LrScheduleConfig& o) const {
    return kind == o.kind && lr == o.lr && min_lr == o.min_lr && warmup == o.warmup &&
           total_steps == o.total_steps;
  }
  bool operator!=(const LrScheduleConfig& o) const { return !(*this == o); }
};

class LrSchedule {
 public:
  /// Throws kshard::Error unless lr > 0 is finite, 0 <= min_lr <= lr,
  /// warmup >= 0 and total_steps >= 1.
  explicit LrSchedule(LrScheduleConfig config);

  /// The rate of step s (0-based; s < 0 is an error).
  double at(std::int64_t step) const;
  const LrScheduleConfig& config() const noexcept { return config_; }

  /// "constant" | "linear" | "cosine" -> kind; anything else: kshard::Error.
  static LrScheduleKind parse_kind(const std::string& name);
  static const char* kind_name(LrScheduleKind kind) noexcept;

 private:
  LrScheduleConfig config_;
};

}  // namespace kshard
