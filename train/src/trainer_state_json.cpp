#include "kshard/train/trainer_state_json.hpp"

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>

#include "kshard/error.hpp"
#include "kshard/optim/lr_schedule.hpp"

namespace kshard {
namespace {

using json = nlohmann::json;

const std::string& expected_text() {
  static const std::string e = std::string("a JSON object written by kshard::to_json(TrainerState) (\"format\": \"") +
                               trainer_state_format + "\", \"version\": " +
                               std::to_string(trainer_state_version) + ", every field present)";
  return e;
}

[[noreturn]] void bad(const std::string& what) {
  throw Error("trainer state " + what, expected_text());
}

const json& field(const json& j, const char* name, const std::string& path) {
  const auto it = j.find(name);
  if (it == j.end()) bad("lacks the field '" + path + "'");
  return *it;
}

/// Integers of the JSON (signed or unsigned), checked against [lo, hi] in
/// the signed 64-bit range. A double like 3.0 is not accepted: the writer
/// never writes one, so it means someone else's file.
std::int64_t integer(const json& j, const char* name, const std::string& prefix,
                     std::int64_t lo, std::int64_t hi) {
  const std::string path = prefix + name;
  const json& v = field(j, name, path);
  if (!v.is_number_integer())
    bad("field '" + path + "' is " + std::string(v.type_name()) + " " + v.dump() + ", not an integer");
  if (v.is_number_unsigned() &&
      v.get<std::uint64_t>() > std::uint64_t(std::numeric_limits<std::int64_t>::max()))
    bad("field '" + path + "' = " + v.dump() + " is out of range");
  const std::int64_t x = v.get<std::int64_t>();
  if (x < lo || x > hi)
    bad("field '" + path + "' = " + v.dump() + " is out of range [" + std::to_string(lo) + ", " +
        std::to_string(hi) + "]");
  return x;
}

std::uint64_t unsigned_integer(const json& j, const char* name, const std::string& prefix) {
  const std::string path = prefix + name;
  const json& v = field(j, name, path);
  if (!v.is_number_integer() || (!v.is_number_unsigned() && v.get<std::int64_t>() < 0))
    bad("field '" + path + "' is " + std::string(v.type_name()) + " " + v.dump() +
        ", not a non-negative integer");
  return v.get<std::uint64_t>();
}

double number(const json& j, const char* name, const std::string& prefix) {
  const std::string path = prefix + name;
  const json& v = field(j, name, path);
  if (!v.is_number()) bad("field '" + path + "' is " + std::string(v.type_name()) + ", not a number");
  return v.get<double>();
}

}  // namespace

json to_json(const TrainerState& s) {
  return json{{"format", trainer_state_format},
              {"version", trainer_state_version},
              {"step", s.step},
              {"optimizer_steps", s.optimizer_steps},
              {"loss_scale", double(s.loss_scale)},
              {"loss_scale_good_steps", s.loss_scale_good_steps},
              {"consecutive_skipped", s.consecutive_skipped},
              {"data_seed", s.data_seed},
              {"data_position", s.data_position},
              {"schedule",
               {{"kind", LrSchedule::kind_name(s.schedule.kind)},
                {"lr", s.schedule.lr},
                {"min_lr", s.schedule.min_lr},
                {"warmup", s.schedule.warmup},
                {"total_steps", s.schedule.total_steps}}}};
}

TrainerState trainer_state_from_json(const json& j) {
  if (!j.is_object()) bad("is " + std::string(j.type_name()) + ", not an object");
  const json& format = field(j, "format", "format");
  if (!format.is_string() || format.get<std::string>() != trainer_state_format)
    bad("has \"format\": " + format.dump());
  const std::int64_t version = integer(j, "version", "", 0, std::numeric_limits<int>::max());
  if (version != trainer_state_version)
    bad("has version " + std::to_string(version) + ", which this kshard cannot read");

  constexpr std::int64_t i64max = std::numeric_limits<std::int64_t>::max();
  constexpr std::int64_t i32min = std::numeric_limits<std::int32_t>::min();
  constexpr std::int64_t i32max = std::numeric_limits<std::int32_t>::max();
  TrainerState s;
  s.step = integer(j, "step", "", std::numeric_limits<std::int64_t>::min(), i64max);
  s.optimizer_steps = integer(j, "optimizer_steps", "", std::numeric_limits<std::int64_t>::min(), i64max);
  const double scale = number(j, "loss_scale", "");
  // A float written as a double: anything else would not come back exactly.
  if (!(std::isfinite(scale) && double(float(scale)) == scale))
    bad("field 'loss_scale' = " + j.at("loss_scale").dump() + " is not a finite float");
  s.loss_scale = float(scale);
  s.loss_scale_good_steps = std::int32_t(integer(j, "loss_scale_good_steps", "", i32min, i32max));
  s.consecutive_skipped = std::int32_t(integer(j, "consecutive_skipped", "", i32min, i32max));
  s.data_seed = unsigned_integer(j, "data_seed", "");
  s.data_position = integer(j, "data_position", "", std::numeric_limits<std::int64_t>::min(), i64max);

  const json& sched = field(j, "schedule", "schedule");
  if (!sched.is_object()) bad("field 'schedule' is " + std::string(sched.type_name()) + ", not an object");
  const json& kind = field(sched, "kind", "schedule.kind");
  if (!kind.is_string()) bad("field 'schedule.kind' is " + std::string(kind.type_name()) + ", not a string");
  const std::string k = kind.get<std::string>();
  if (k != "constant" && k != "linear" && k != "cosine")
    bad("field 'schedule.kind' is \"" + k + "\", not constant, linear or cosine");
  s.schedule.kind = LrSchedule::parse_kind(k);
  s.schedule.lr = number(sched, "lr", "schedule.");
  s.schedule.min_lr = number(sched, "min_lr", "schedule.");
  s.schedule.warmup = integer(sched, "warmup", "schedule.", std::numeric_limits<std::int64_t>::min(), i64max);
  s.schedule.total_steps =
      integer(sched, "total_steps", "schedule.", std::numeric_limits<std::int64_t>::min(), i64max);
  return s;
}

}  // namespace kshard
