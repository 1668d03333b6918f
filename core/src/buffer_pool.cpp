#include "kshard/core/buffer_pool.hpp"

#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "kshard/error.hpp"
#include "kshard/core/memory_tracker.hpp"

namespace kshard::memory {
namespace {

using BlockView = Kokkos::View<std::uint8_t*>;

struct Pool {
  std::mutex mu;
  std::multimap<std::size_t, BlockView> free;     // size class -> free blocks
  std::map<const std::uint8_t*, BlockView> used;  // data -> its View (keeps it alive)
  PoolStats stats;
  bool hook = false;
};
Pool& pool() {
  static Pool* p = new Pool;  // never destroyed: Blocks may outlive static destructors
  return *p;
}

std::size_t size_class(std::size_t bytes) { return (bytes + 511) / 512 * 512; }

}  // namespace

Block& Block::operator=(Block&& o) noexcept {
  if (this != &o) {
    reset();
    data_ = o.data_;
    size_ = o.size_;
    class_bytes_ = o.class_bytes_;
    o.data_ = nullptr;
    o.size_ = o.class_bytes_ = 0;
  }
  return *this;
}

void Block::check_range(std::size_t bytes, std::size_t offset) const {
  if (offset + bytes > size_)
    throw Error("pool block view of " + std::to_string(bytes) + " B at offset " +
                    std::to_string(offset) + " in a block of " + std::to_string(size_) + " B",
                "a view inside the block");
}

void Block::reset() noexcept {
  if (!data_) return;
  if (class_bytes_ == 0) {  // borrowed: nothing of the pool's
    data_ = nullptr;
    size_ = 0;
    return;
  }
  Pool& p = pool();
  note_release(data_, size_);
  {
    std::lock_guard<std::mutex> lock(p.mu);
    auto it = p.used.find(data_);
    if (it != p.used.end()) {
      p.free.emplace(class_bytes_, it->second);
      p.used.erase(it);
      p.stats.in_use_bytes -= class_bytes_;
      p.stats.cached_bytes += class_bytes_;
    }
  }
  data_ = nullptr;
  size_ = class_bytes_ = 0;
}

Block acquire(std::size_t bytes, const char* label) {
  Block b;
  if (bytes == 0) return b;
  const std::size_t cls = size_class(bytes);
  Pool& p = pool();
  BlockView v;
  {
    std::lock_guard<std::mutex> lock(p.mu);
    if (!p.hook) {
      // Free every block while Kokkos (and the device) is still up; a Block
      // still held past finalize finds nothing to give back.
      Kokkos::push_finalize_hook([] {
        release_cached();
        Pool& q = pool();
        std::lock_guard<std::mutex> l(q.mu);
        q.used.clear();
        q.stats.in_use_bytes = 0;
        q.hook = false;
      });
      p.hook = true;
    }
    auto it = p.free.find(cls);
    if (it != p.free.end()) {
      v = it->second;
      p.free.erase(it);
      p.stats.cached_bytes -= cls;
      ++p.stats.reuses;
    }
  }
  if (!v.data()) {
    v = BlockView(Kokkos::view_alloc(std::string("kshard.cache:pool"), Kokkos::WithoutInitializing),
                  cls);
    std::lock_guard<std::mutex> lock(p.mu);
    ++p.stats.allocations;
  }
  {
    std::lock_guard<std::mutex> lock(p.mu);
    p.used.emplace(v.data(), v);
    p.stats.in_use_bytes += cls;
  }
  b.data_ = v.data();
  b.size_ = bytes;
  b.class_bytes_ = cls;
  note_acquire(label, b.data_, bytes);
  return b;
}

Block borrow(void* data, std::size_t bytes) noexcept {
  Block b;
  if (!data || bytes == 0) return b;
  b.data_ = static_cast<std::uint8_t*>(data);
  b.size_ = bytes;
  return b;
}

PoolStats pool_stats() noexcept {
  Pool& p = pool();
  std::lock_guard<std::mutex> lock(p.mu);
  return p.stats;
}

void release_cached() {
  Pool& p = pool();
  std::multimap<std::size_t, BlockView> dead;
  {
    std::lock_guard<std::mutex> lock(p.mu);
    dead.swap(p.free);
    p.stats.cached_bytes = 0;
  }
  // Another kernel may still read a block given back: finish queued work first.
  if (!dead.empty() && Kokkos::is_initialized()) Kokkos::fence();
  dead.clear();
}

}  // namespace kshard::memory
