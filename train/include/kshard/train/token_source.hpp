#pragma once
// TokenSource: where a Trainer's training sequences come from.
//
// A source is a pure function from (seed, global sequence number) to one
// sequence of `seq` input token ids and the `seq` tokens that follow them
// (the targets). The Trainer numbers the sequences of the whole job: at each
// step it takes the next accum x world x batch of them and rank r's
// micro-batch m is sequences
//   position + (m * world + r) * batch ... + batch - 1,
// so a step covers the same global batch however it is split over ranks and
// micro-batches, and a resumed run (same position) continues the same stream.
//
//   class MyData : public kshard::TokenSource {
//     void fill(std::uint64_t seed, std::int64_t first, std::int64_t count, std::int64_t seq,
//               std::int32_t* ids, std::int32_t* targets) const override { ... }
//     std::string describe() const override { return "my data"; }
//   };
//
// fill() runs on the host, into host buffers; it may throw kshard::Error for
// bad data (the Trainer then makes it an error on every rank, naming
// describe(), before any collective of the step could hang).
#include <cstdint>
#include <string>

namespace kshard {

class TokenSource {
 public:
  virtual ~TokenSource() = default;
  /// Sequences first .. first + count - 1: ids[i * seq + t] and
  /// targets[i * seq + t] (the token after ids[i * seq + t]).
  virtual void fill(std::uint64_t seed, std::int64_t first, std::int64_t count, std::int64_t seq,
                    std::int32_t* ids, std::int32_t* targets) const = 0;
  /// For messages: "token file data/train.bin (uint16, 1000000 tokens)".
  virtual std::string describe() const = 0;
};

}  // namespace kshard
