#pragma once
// Dynamic loss scaling for the fp16 recipe: the loss gradient is multiplied by
// scale() so that small gradients survive the fp16 reduce-scatter; the
// optimizer divides by it again. A step whose gradients overflowed is skipped
// (by every rank: the optimizer agrees on the flag) and the scale halves;
// after `growth_interval` good steps in a row it doubles.
//
//   kshard::DynamicLossScaler scaler;          // 2^12, x2 every 200 good steps
//   model.forward_backward(..., scaler.scale());
//   auto r = adam.step(scaler.scale());
//   scaler.update(r.found_nonfinite);
//   ...
//   saved = {scaler.scale(), scaler.good_steps()};   // checkpoint
//   scaler.restore(saved.scale, saved.good_steps);   // resume: the same next scales
#include <cmath>
#include <string>

#include "kshard/error.hpp"

namespace kshard {

class DynamicLossScaler {
 public:
  explicit DynamicLossScaler(float initial = 4096.f, int growth_interval = 200,
                             float min_scale = 1.f)
      : scale_(initial), growth_interval_(growth_interval), min_scale_(min_scale) {}

  float scale() const noexcept { return scale_; }
  /// Call once per optimizer step with whether the gradients held inf/NaN.
  void update(bool found_nonfinite) noexcept {
    if (found_nonfinite) {
      scale_ = scale_ / 2 < min_scale_ ? min_scale_ : scale_ / 2;
      good_ = 0;
    } else if (++good_ >= growth_interval_) {
      scale_ *= 2;
      good_ = 0;
    }
  }
  int good_steps() const noexcept { return good_; }
  int growth_interval() const noexcept { return growth_interval_; }
  float min_scale() const noexcept { return min_scale_; }

  /// Puts back a saved state (scale() and good_steps()), so that a resumed
  /// run grows and backs off exactly where the saved one would have.
  void restore(float scale, int good_steps) {
    if (!(std::isfinite(scale) && scale >= min_scale_) || good_steps < 0 ||
        good_steps >= growth_interval_)
      throw Error("DynamicLossScaler::restore(scale " + std::to_string(scale) + ", good steps " +
                      std::to_string(good_steps) + ")",
                  "a finite scale >= min_scale " + std::to_string(min_scale_) +
                      " and 0 <= good steps < growth_interval " + std::to_string(growth_interval_));
    scale_ = scale;
    good_ = good_steps;
  }

 private:
  float scale_;
  int growth_interval_;
  float min_scale_;
  int good_ = 0;
};

}  // namespace kshard
