#pragma once
// KvCache: the key/value cache of incremental decoding (FsdpModel::decode),
// for `batch` sequences of at most `capacity` tokens each.
//
//   kshard::KvCache cache(/*batch=*/1, /*capacity=*/1024);
//   auto z = model.decode(cache, prompt_ids, {1, prompt_len, 1});  // prefill: [1, vocab]
//   ... pick a token, then for each next one:
//   z = model.decode(cache, next_id, {1, 1, 1});                    // one row per sequence
//
// It holds every attention layer's keys and values (nn/decode_step.hpp:
// AttentionKv, in the model's compute dtype, kv_heads heads) and how many
// tokens per sequence are cached (length()). The storage is made by the first
// decode() (the model knows the layers and the dtype), sized for `capacity`
// at once, so decoding allocates nothing per token; clear() forgets the
// tokens and keeps the memory (a new prompt, or a window that moved). A cache
// belongs to one model; the ranks of a sharded model each keep their own
// (identical) cache: the parameters are sharded, the cache is not.
#include <cstddef>
#include <cstdint>
#include <memory>

namespace kshard {

namespace detail {
/// The per-layer storage in the model's compute type (FsdpModel's core).
struct KvStorage {
  virtual ~KvStorage() = default;
  virtual std::size_t bytes() const = 0;
};
}  // namespace detail

class KvCache {
 public:
  /// kshard::Error unless batch > 0 and capacity > 0.
  KvCache(std::int64_t batch, std::int64_t capacity);

  std::int64_t batch() const noexcept { return batch_; }
  std::int64_t capacity() const noexcept { return capacity_; }
  /// Tokens per sequence cached so far (the next token's position).
  std::int64_t length() const noexcept { return length_; }
  /// Forgets the cached tokens (length 0); the memory stays for reuse.
  void clear() noexcept { length_ = 0; }
  /// Device memory the keys and values take (0 before the first decode).
  std::size_t bytes() const { return storage_ ? storage_->bytes() : 0; }

  // For FsdpModel::decode: the typed storage it makes, and the length after a step.
  detail::KvStorage* storage() noexcept { return storage_.get(); }
  void set_storage(std::unique_ptr<detail::KvStorage> s) { storage_ = std::move(s); }
  void advance(std::int64_t tokens);

 private:
  std::int64_t batch_, capacity_, length_ = 0;
  std::unique_ptr<detail::KvStorage> storage_;
};

}  // namespace kshard
