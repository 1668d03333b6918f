#include "markov_task.hpp"

#include <cmath>

namespace kshard_train {
namespace {

constexpr double kLikely = 0.8;

// splitmix64: a counter-based generator, so a value depends only on its key.
std::uint64_t mix(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

struct Stream {
  std::uint64_t state;
  std::uint64_t next() { return mix(state++ * 0x2545f4914f6cdd1dULL); }
  double uniform() { return double(next() >> 11) * (1.0 / 9007199254740992.0); }
  std::int64_t below(std::int64_t n) { return std::int64_t(next() % std::uint64_t(n)); }
};

}  // namespace

MarkovTask::MarkovTask(std::int64_t vocab, std::uint64_t seed)
    : vocab_(vocab), seed_(mix(seed ^ 0x6b73686172642d74ULL)) {
  likely_.resize(std::size_t(vocab));
  unlikely_.resize(std::size_t(vocab));
  Stream s{mix(seed_ + 1)};
  for (std::int64_t t = 0; t < vocab; ++t) {
    const std::int64_t a = s.below(vocab);
    // A second successor different from the first (vocab 1 has only one).
    const std::int64_t b = vocab > 1 ? (a + 1 + s.below(vocab - 1)) % vocab : a;
    likely_[std::size_t(t)] = std::int32_t(a);
    unlikely_[std::size_t(t)] = std::int32_t(b);
  }
}

std::string MarkovTask::describe() const {
  return "the built-in Markov task (vocab " + std::to_string(vocab_) + ")";
}

void MarkovTask::fill(std::uint64_t, std::int64_t first_sequence, std::int64_t count,
                      std::int64_t seq, std::int32_t* ids, std::int32_t* targets) const {
  for (std::int64_t i = 0; i < count; ++i) {
    Stream s{mix(seed_ ^ mix(std::uint64_t(first_sequence + i) + 0x51ULL))};
    std::int64_t tok = s.below(vocab_);
    for (std::int64_t t = 0; t < seq; ++t) {
      const std::int64_t next = s.uniform() < kLikely ? likely_[std::size_t(tok)]
                                                      : unlikely_[std::size_t(tok)];
      ids[i * seq + t] = std::int32_t(tok);
      targets[i * seq + t] = std::int32_t(next);
      tok = next;
    }
  }
}

double MarkovTask::entropy_floor() const noexcept {
  if (vocab_ < 2) return 0.0;
  return -(kLikely * std::log(kLikely) + (1 - kLikely) * std::log(1 - kLikely));
}

}  // namespace kshard_train
