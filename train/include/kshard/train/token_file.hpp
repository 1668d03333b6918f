#pragma once
// TokenFile: a flat file of little-endian token ids, uint16 (the default, as
// nanoGPT's train.bin / val.bin) or uint32 — the training data of a Trainer
// and the data of its evaluation.
//
//   kshard::TokenFile data = kshard::TokenFile::open(mesh.world(), "train.bin",
//                                                    kshard::TokenDType::u16, vocab, seq + 1);
//   trainer.step(data);                            // random windows (below)
//   kshard::EvalResult e = trainer.evaluate(val, /*batches=*/20);   // contiguous windows
//
// Training sequence g (see TokenSource) is the window of seq + 1 tokens at
// offset splitmix64(seed, g) mod (N - seq), N the file's token count: inputs
// its first seq tokens, targets its last seq. The offsets are a pure function
// of (seed, g), so every world size draws the same global batch and a
// resumed run continues the same stream. Evaluation window j is the tokens
// [j * seq, j * seq + seq] (consecutive windows overlapping by one token).
//
// Only the windows asked for are read (pread), never the whole file: a rank
// holds one micro-batch of tokens. Every id read is checked against the
// vocabulary. Errors (missing or unreadable file, a size that is not a
// multiple of the dtype, fewer tokens than needed, an id >= vocab) are
// kshard::Error naming the file; open() makes them an error on every rank.
#include <cstdint>
#include <string>

#include "kshard/mesh/communicator.hpp"
#include "kshard/train/token_source.hpp"

namespace kshard {

enum class TokenDType : std::uint8_t { u16 = 2, u32 = 4 };

class TokenFile final : public TokenSource {
 public:
  /// Opens and checks the file on this rank alone (no communication).
  /// min_tokens: the fewest tokens the caller needs (seq + 1 for training).
  TokenFile(std::string path, TokenDType dtype, std::int64_t vocab, std::int64_t min_tokens = 1);
  /// The same on every rank of `comm`, collectively: a problem on any rank
  /// (a file only some ranks see, or of another size) is a kshard::Error on
  /// every rank.
  static TokenFile open(const Communicator& comm, const std::string& path, TokenDType dtype,
                        std::int64_t vocab, std::int64_t min_tokens = 1);
  ~TokenFile() override;
  TokenFile(TokenFile&& other) noexcept;
  TokenFile& operator=(TokenFile&& other) noexcept;
  TokenFile(const TokenFile&) = delete;
  TokenFile& operator=(const TokenFile&) = delete;

  const std::string& path() const noexcept { return path_; }
  TokenDType dtype() const noexcept { return dtype_; }
  std::int64_t vocab() const noexcept { return vocab_; }
  std::int64_t num_tokens() const noexcept { return tokens_; }

  /// Tokens [first, first + n) as int32, each checked < vocab.
  void read(std::int64_t first, std::int64_t n, std::int32_t* out) const;
  /// Start of training sequence g's window (needs num_tokens() >= seq + 1).
  std::int64_t window_offset(std::uint64_t seed, std::int64_t g, std::int64_t seq) const;
  void fill(std::uint64_t seed, std::int64_t first, std::int64_t count, std::int64_t seq,
            std::int32_t* ids, std::int32_t* targets) const override;
  /// Evaluation windows first .. first + count - 1 (window j: tokens
  /// [j * seq, j * seq + seq]).
  void fill_eval(std::int64_t first, std::int64_t count, std::int64_t seq, std::int32_t* ids,
                 std::int32_t* targets) const;
  std::string describe() const override;

  /// "uint16" | "uint32" -> dtype; anything else: kshard::Error.
  static TokenDType parse_dtype(const std::string& name);
  static const char* dtype_name(TokenDType dtype) noexcept;

 private:
  std::string path_;
  TokenDType dtype_;
  std::int64_t vocab_;
  std::int64_t tokens_ = 0;
  int fd_ = -1;
};

}  // namespace kshard
