// Trainer::save / save_async / load / resume: the checkpoint library's
// tensors plus the TrainerState as its JSON user_state
// (trainer_state_json.hpp).
#include <exception>
#include <optional>
#include <string>

#include "kshard/mesh/agree.hpp"
#include "kshard/checkpoint/manifest.hpp"
#include "kshard/train/trainer.hpp"
#include "kshard/train/trainer_state_json.hpp"

namespace kshard {
namespace {

namespace fs = std::filesystem;

/// The state in a checkpoint's user_state, with the checkpoint named in the
/// error, and checked against the checkpoint's own step (save() writes
/// step_count() as both).
TrainerState state_of(const nlohmann::json& user_state, std::int64_t step, const fs::path& where) {
  TrainerState s;
  try {
    s = trainer_state_from_json(user_state);
  } catch (const Error& e) {
    throw Error("checkpoint '" + where.string() + "': " + e.problem(), e.expected());
  }
  if (s.step != step)
    throw Error("checkpoint '" + where.string() + "' is of step " + std::to_string(step) +
                    " but its trainer state says step " + std::to_string(s.step),
                "a checkpoint written by Trainer::save (the same step in both)");
  return s;
}

}  // namespace

SaveInfo Trainer::save(const fs::path& dir, const SaveOptions& options) {
  wait_for_save();
  return save_checkpoint(dir, step_, model_, *adam_, to_json(state()), options);
}

void Trainer::save_async(const fs::path& dir, const SaveOptions& options) {
  saver_->start(dir, step_, model_, *adam_, to_json(state()), options);
}

void Trainer::reserve_async_save() { saver_->reserve(model_, *adam_); }

bool Trainer::save_pending() const noexcept { return saver_->pending(); }

std::optional<SaveInfo> Trainer::wait_for_save() { return saver_->wait(); }

LoadInfo Trainer::load(const fs::path& step_dir) {
  // A pending save finishes first: the checkpoint asked for may be that one,
  // and a failure of its write is reported now rather than at a later step.
  wait_for_save();
  // Check the trainer state before any tensor changes, so that a checkpoint
  // whose state would be refused leaves this trainer as it was. A manifest
  // that does not read is left to load_checkpoint, which says why with the
  // context of a load (missing directory, incomplete save, ...).
  std::exception_ptr failure;
  try {
    std::optional<Manifest> m;
    try {
      m = read_manifest(step_dir / "manifest.json");
    } catch (const Error&) {
    }
    if (m) {
      const TrainerState s = state_of(m->user_state, m->step, step_dir);
      check_restorable(s);
      // The manifest's own copy of Adam's step count (which load_checkpoint
      // sets) and the state's (which restore sets) must be one number.
      if (m->has_optimizer && m->optimizer_step != s.optimizer_steps)
        throw Error("checkpoint '" + step_dir.string() + "': its trainer state says " +
                        std::to_string(s.optimizer_steps) + " optimizer steps, its manifest " +
                        std::to_string(m->optimizer_step),
                    "a checkpoint written by Trainer::save (the same count in both)");
    }
  } catch (...) {
    failure = std::current_exception();
  }
  agree_ok(model_.mesh().world(), failure,
           "reading the trainer state of checkpoint '" + step_dir.string() + "'");

  LoadInfo info = load_checkpoint(step_dir, model_, *adam_);
  // Parsed again from what load read (the same bytes unless the file changed
  // in between); agreed before restore() communicates.
  TrainerState s;
  failure = nullptr;
  try {
    s = state_of(info.user_state, info.step, step_dir);
  } catch (...) {
    failure = std::current_exception();
  }
  agree_ok(model_.mesh().world(), failure,
           "reading the trainer state of checkpoint '" + step_dir.string() + "'");
  restore(s);
  return info;
}

std::optional<LoadInfo> Trainer::resume(const fs::path& dir) {
  wait_for_save();  // its checkpoint may be the newest
  std::optional<fs::path> latest;
  std::exception_ptr failure;
  try {
    latest = latest_checkpoint(dir);
  } catch (...) {
    failure = std::current_exception();
  }
  agree_ok(model_.mesh().world(), failure, "looking for checkpoints in '" + dir.string() + "'");
  // -1: none. Ranks that see different newest checkpoints (a file system that
  // is not shared, or one still catching up) must not load different steps.
  std::int64_t step = -1;
  if (latest) {
    const std::string name = latest->filename().string();  // step-0000000042
    step = std::stoll(name.substr(name.find('-') + 1));
  }
  agree_same(model_.mesh().world(), "resuming from '" + dir.string() + "'",
             {{"the newest step (-1: none)", step}},
             "one save directory that every rank sees alike");
  if (step < 0) return std::nullopt;
  return load(*latest);
}

}  // namespace kshard
