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

 private:
  float scale_;
  int growth_interval_;
  float min_scale_;
  int good_ = 0;
};

}  // namespace kshard
