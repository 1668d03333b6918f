#pragma once
// generate: what a trained language model says next, one token at a time.
//
//   kshard::GenerateOptions g;
//   g.new_tokens = 100;
//   g.temperature = 0.8;  // 0: greedy (argmax)
//   g.top_k = 40;         // 0: the whole vocabulary
//   g.context = seq;      // the most tokens the model sees at once
//   std::vector<std::int32_t> out = kshard::generate(model, world, prompt, g,
//       [](std::int32_t t) { std::putchar(t); });  // each new token as it comes
//
// Collective over `world`: every rank passes the same prompt and options and
// gets the same tokens (rank 0's choice each step, so ranks never drift
// apart). The model is any FsdpModel whose first layer takes token ids and
// whose last one gives logits over the vocabulary. Each step's logits are
// those of the last token after the last `context` tokens (positions counted
// from the window's start, as the model was trained).
//
// With kv_cache (the default, for models that can_decode(): an Embedding,
// TransformerLayer / LlamaLayer blocks, norms and a head) the prompt runs
// once (prefill) and every attention layer keeps its keys and values
// (FsdpModel::decode, KvCache); each new token then runs one row per sequence
// through the model, attending over the cache: O(tokens so far) per token
// instead of a forward over the whole window. Once the sequence is longer
// than `context` the window moves by one token per step, which changes every
// cached position (learned positions, RoPE angles), so each step past that
// point prefills the new window again: the cost of the uncached path (one
// forward over `context` tokens per token), not more. Without kv_cache (or a
// model that cannot decode) each step runs the forward over the window and
// reads the last row's logits through forward_chunks, so the [tokens, vocab]
// logits are never all kept: the reference the cached path is tested
// against. Both give the same logits up to f32 summation order.
//
// Choice of the next token from logits z (f32, on the host): greedy takes the
// first index of the largest z; otherwise the top_k largest (ties by index)
// are softmaxed at z / temperature (in double) and one is drawn with a
// std::mt19937_64 seeded by `seed` (the same sequence on every platform).
#include <cstdint>
#include <functional>
#include <random>
#include <vector>

#include "kshard/engine/fsdp/fsdp_model.hpp"
#include "kshard/mesh/communicator.hpp"

namespace kshard {

struct GenerateOptions {
  int new_tokens = 32;
  double temperature = 0.0;  ///< 0: greedy
  int top_k = 0;             ///< 0: every token may be drawn
  std::uint64_t seed = 1;
  std::int64_t context = 0;  ///< most tokens per forward (0: the whole sequence so far)
  bool kv_cache = true;      ///< incremental decoding with a key/value cache (see above)
};

/// The prompt's continuation (new_tokens ids). kshard::Error (on every rank)
/// for an empty prompt, an id outside [0, vocab), or options out of range.
std::vector<std::int32_t> generate(FsdpModel& model, const Communicator& world,
                                   const std::vector<std::int32_t>& prompt,
                                   const GenerateOptions& options,
                                   const std::function<void(std::int32_t)>& on_token = {});

/// Batched generation: the continuations of equal-length prompts (one row
/// each of a batch), as generate() above does for one; sequence b draws with
/// its own generator seeded by seed + b, so sequence 0 is what the single-
/// prompt call gives, and greedy decoding gives every sequence what it gets
/// alone. on_token(b, t) for each new token of sequence b. kshard::Error (on
/// every rank) for no prompts or prompts of different lengths, and as above.
std::vector<std::vector<std::int32_t>> generate_batch(
    FsdpModel& model, const Communicator& world,
    const std::vector<std::vector<std::int32_t>>& prompts, const GenerateOptions& options,
    const std::function<void(std::size_t, std::int32_t)>& on_token = {});

/// The next token from one row of logits: greedy or drawn as described above.
std::int32_t pick_token(const std::vector<float>& logits, const GenerateOptions& options,
                        std::mt19937_64& rng);

}  // namespace kshard
