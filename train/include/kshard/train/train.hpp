#pragma once
// kshard::train umbrella header: Trainer (the training loop, with its
// checkpoints), its state and that state's JSON form, the token data sources
// and the memory estimate. Pulls in kshard::checkpoint, kshard::optim and
// kshard::engine.
#include "kshard/engine/nn/embedding.hpp"
#include "kshard/engine/fsdp/fsdp_model.hpp"
#include "kshard/engine/nn/layer_norm.hpp"
#include "kshard/engine/nn/linear.hpp"
#include "kshard/engine/nn/transformer_layer.hpp"
#include "kshard/train/memory_estimate.hpp"
#include "kshard/train/token_file.hpp"
#include "kshard/train/token_source.hpp"
#include "kshard/train/trainer.hpp"
#include "kshard/train/trainer_state.hpp"
#include "kshard/train/trainer_state_json.hpp"
