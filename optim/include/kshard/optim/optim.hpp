#pragma once
// kshard::optim umbrella header: FusedAdam/AdamW on flat shards and
// gradient clipping by the global norm.
#include "kshard/optim/fused_adam.hpp"
#include "kshard/optim/grad_clip.hpp"
