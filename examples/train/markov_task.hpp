#pragma once
// MarkovTask: the built-in synthetic next-token language of kshard-train.
//
// A fixed random Markov chain over `vocab` tokens in which every token has
// exactly two possible successors, taken with probabilities 0.8 and 0.2. The
// chain is a pure function of the seed, so every rank knows the same
// language; sequence number g of the (conceptually infinite) global corpus is
// a pure function of (seed, g), so a rank generates just its slice of a
// global batch and the data-parallel ranks see different, reproducible data.
//
//   MarkovTask task(/*vocab=*/64, /*seed=*/1);
//   trainer.step(task);                           // a kshard::TokenSource
//   std::vector<std::int32_t> ids(batch * seq);   // or by hand: model input, token ids
//   std::vector<std::int32_t> next(batch * seq);  // target: the following token
//   task.fill(0, /*first_sequence=*/rank * batch, batch, seq, ids.data(), next.data());
//
// Why this language: the uniform guess costs ln(vocab) nats per token, while
// a model that has learnt the chain pays only the entropy of a successor
// choice, H(0.8, 0.2) = 0.500 nats, whatever the token. The gap is large and
// a few dozen optimizer steps close most of it, so a falling loss is a clear
// sign that forward, backward, the sharded gradient reduction and the
// optimizer all work together.
#include <cstdint>
#include <string>
#include <vector>

#include "kshard/train/token_source.hpp"

namespace kshard_train {

class MarkovTask final : public kshard::TokenSource {
 public:
  MarkovTask(std::int64_t vocab, std::uint64_t seed);

  std::int64_t vocab() const noexcept { return vocab_; }
  /// Sequences first_sequence .. first_sequence + count - 1, each seq tokens
  /// of input and the seq tokens that follow each of them as targets. The
  /// stream is keyed by the task's own seed (the one that also made the
  /// chain); the TokenSource seed is not used.
  void fill(std::uint64_t unused_seed, std::int64_t first_sequence, std::int64_t count,
            std::int64_t seq, std::int32_t* ids, std::int32_t* targets) const override;
  std::string describe() const override;
  /// Cross entropy (nats/token) of a model that knows the chain exactly.
  double entropy_floor() const noexcept;
  /// The successor token `t` is followed by with probability 0.8 (the other: 0.2).
  std::int32_t likely_successor(std::int32_t t) const { return likely_.at(std::size_t(t)); }
  std::int32_t unlikely_successor(std::int32_t t) const { return unlikely_.at(std::size_t(t)); }

 private:
  std::int64_t vocab_;
  std::uint64_t seed_;
  std::vector<std::int32_t> likely_, unlikely_;  // the two successors of each token
};

}  // namespace kshard_train
