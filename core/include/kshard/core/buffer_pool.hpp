#pragma once
// A caching pool of device-memory blocks (memory of the default execution
// space), so a steady-state training step allocates nothing: unsharded
// parameters, unsharded gradients, reduce-scatter buffers and backward
// workspaces are acquired for a phase and given back, and the next step gets
// the same blocks again (PyTorch's caching allocator does this for FSDP2).
//
//   kshard::memory::Block b = kshard::memory::acquire(bytes, "layers.3.full");
//   auto v = b.view<float>(n);          // unmanaged View into the block
//   ...                                 // kernels / collectives on v
//   b.reset();                          // (or ~Block) back to the pool
//
// Ordering: a block given back may be handed out again at once while kernels
// that use it are still queued. That is safe because every user orders its
// work on the Kokkos default execution space instance (one stream); work on
// another stream must be ordered against it before the block is given back.
//
// Accounting: blocks are allocated as "kshard.cache:pool" Views (the memory
// tracker counts them as cache), and while handed out count as live under
// the acquirer's label, so the harness's leak check flags a block never given
// back and peaks count what is in use. release_cached() frees the free blocks.
// Blocks are reused by size class (requests rounded up to 512 B); the pool
// never splits or merges blocks, so it suits a training step whose requests
// repeat exactly. Thread-safe.
#include <cstddef>
#include <cstdint>

#include <Kokkos_Core.hpp>

namespace kshard::memory {

class Block {
 public:
  Block() = default;
  Block(const Block&) = delete;
  Block& operator=(const Block&) = delete;
  Block(Block&& o) noexcept { *this = std::move(o); }
  Block& operator=(Block&& o) noexcept;
  ~Block() { reset(); }

  std::uint8_t* data() const noexcept { return data_; }
  std::size_t size() const noexcept { return size_; }  ///< bytes asked for
  explicit operator bool() const noexcept { return data_ != nullptr; }
  /// Gives the block back to the pool (no-op when empty).
  void reset() noexcept;

  /// n elements of T starting offset_bytes into the block (bounds checked).
  template <class T>
  Kokkos::View<T*, Kokkos::MemoryTraits<Kokkos::Unmanaged>> view(std::size_t n,
                                                                  std::size_t offset_bytes = 0) const {
    check_range(n * sizeof(T), offset_bytes);
    return Kokkos::View<T*, Kokkos::MemoryTraits<Kokkos::Unmanaged>>(
        reinterpret_cast<T*>(data_ + offset_bytes), n);
  }

 private:
  friend Block acquire(std::size_t, const char*);
  friend Block borrow(void*, std::size_t) noexcept;
  void check_range(std::size_t bytes, std::size_t offset) const;
  std::uint8_t* data_ = nullptr;
  std::size_t size_ = 0;
  std::size_t class_bytes_ = 0;  // 0 for a borrowed block
};

/// A block of at least `bytes` (contents undefined); `label` names it in the
/// memory tracker while it is in use. bytes == 0 gives an empty Block.
Block acquire(std::size_t bytes, const char* label);

/// A Block over `bytes` at `data`, memory that something else owns and keeps
/// alive for as long as the Block is used (a persistent buffer standing in
/// where a pool block is expected, e.g. a shard that already is the whole
/// unsharded buffer); reset() only forgets it. Not counted by the pool or
/// the memory tracker (its owner is).
Block borrow(void* data, std::size_t bytes) noexcept;

struct PoolStats {
  std::size_t cached_bytes = 0;  ///< free blocks held
  std::size_t in_use_bytes = 0;  ///< blocks handed out
  std::uint64_t allocations = 0; ///< device allocations the pool has made
  std::uint64_t reuses = 0;      ///< acquires served from the cache
};
PoolStats pool_stats() noexcept;
/// Frees every free block (blocks in use stay valid).
void release_cached();

}  // namespace kshard::memory
