#pragma once
// kshard::optim umbrella header: FusedAdam/AdamW on flat shards and
// gradient clipping by the global norm, LR schedules.
#include "kshard/optim/fused_adam.hpp"
#include "kshard/optim/grad_clip.hpp"
#include "kshard/optim/lr_schedule.hpp"
