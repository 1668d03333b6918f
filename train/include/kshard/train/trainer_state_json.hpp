#pragma once
// TrainerState <-> JSON: the form in which a checkpoint carries the Trainer's
// scalar state (the checkpoint library stores it as its opaque user_state;
// see Trainer::save / load and docs/CHECKPOINTS.md).
//
//   nlohmann::json j = kshard::to_json(trainer.state());
//   kshard::TrainerState s = kshard::trainer_state_from_json(j);   // s == trainer.state()
//
//   {"format": "kshard.trainer_state", "version": 1,
//    "step": 3, "optimizer_steps": 3, "loss_scale": 4096.0, "loss_scale_good_steps": 3,
//    "consecutive_skipped": 0, "data_seed": 1234, "data_position": 48,
//    "schedule": {"kind": "cosine", "lr": 0.003, "min_lr": 0.0003, "warmup": 2,
//                 "total_steps": 8}}
//
// Every field is written by name and read back exactly (doubles are printed
// with round-trip precision, the float loss scale is a double in JSON,
// data_seed an unsigned 64-bit integer). Reading checks the format name and
// version and that every field is present with its type and in its type's
// range; anything else is a kshard::Error naming the field. Whether the
// values make a sensible state (optimizer_steps <= step, a valid schedule)
// is Trainer::restore's check. Local: no communication.
#include <nlohmann/json.hpp>

#include "kshard/train/trainer_state.hpp"

namespace kshard {

/// "kshard.trainer_state": the "format" of the JSON object.
inline constexpr const char* trainer_state_format = "kshard.trainer_state";
/// Its "version"; a reader rejects other versions.
inline constexpr int trainer_state_version = 1;

nlohmann::json to_json(const TrainerState& state);
TrainerState trainer_state_from_json(const nlohmann::json& json);

}  // namespace kshard
