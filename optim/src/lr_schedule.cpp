#include "kshard/optim/lr_schedule.hpp"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "kshard/error.hpp"

namespace kshard {

LrSchedule::LrSchedule(LrScheduleConfig config) : config_(config) {
  const LrScheduleConfig& c = config_;
  std::ostringstream bad;
  if (!(std::isfinite(c.lr) && c.lr > 0)) bad << "lr " << c.lr << "; ";
  if (!(std::isfinite(c.min_lr) && c.min_lr >= 0 && c.min_lr <= c.lr))
    bad << "min_lr " << c.min_lr << "; ";
  if (c.warmup < 0) bad << "warmup " << c.warmup << "; ";
  if (c.total_steps < 1) bad << "total_steps " << c.total_steps << "; ";
  if (c.kind != LrScheduleKind::constant && c.kind != LrScheduleKind::linear &&
      c.kind != LrScheduleKind::cosine)
    bad << "kind " << int(c.kind) << "; ";
  std::string s = bad.str();
  if (!s.empty())
    throw Error("LR schedule with " + s.substr(0, s.size() - 2),
                "a finite lr > 0, 0 <= min_lr <= lr, warmup >= 0, total_steps >= 1 and kind "
                "constant, linear or cosine");
}

double LrSchedule::at(std::int64_t step) const {
  if (step < 0)
    throw Error("LR schedule asked for step " + std::to_string(step), "a step >= 0");
  const LrScheduleConfig& c = config_;
  if (step < c.warmup) return c.lr * double(step + 1) / double(c.warmup + 1);
  if (c.kind == LrScheduleKind::constant) return c.lr;
  const std::int64_t span = c.total_steps - 1 - c.warmup;
  const double p = span > 0 ? std::min(1.0, double(step - c.warmup) / double(span)) : 1.0;
  const double kPi = 3.14159265358979323846;
  const double f = c.kind == LrScheduleKind::linear ? 1.0 - p : 0.5 * (1.0 + std::cos(kPi * p));
  return c.min_lr + (c.lr - c.min_lr) * f;
}

LrScheduleKind LrSchedule::parse_kind(const std::string& name) {
  if (name == "constant") return LrScheduleKind::constant;
  if (name == "linear") return LrScheduleKind::linear;
  if (name == "cosine") return LrScheduleKind::cosine;
  throw Error("LR schedule '" + name + "' is unknown", "constant, linear or cosine");
}

const char* LrSchedule::kind_name(LrScheduleKind kind) noexcept {
  switch (kind) {
    case LrScheduleKind::constant: return "constant";
    case LrScheduleKind::linear: return "linear";
    case LrScheduleKind::cosine: return "cosine";
  }
  return "unknown";
}

}  // namespace kshard
