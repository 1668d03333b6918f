#pragma once
// Process-wide accounting of Kokkos allocations (through Kokkos' tool
// callbacks, so every View counts, whoever made it): live and peak bytes per
// memory space. The test harness uses it to catch leaks; training reports
// peak memory per rank with it.
//
//   kshard::memory::install();                 // once, after Kokkos is up
//   kshard::memory::reset_peak();
//   ... train ...
//   auto s = kshard::memory::stats();          // s.peak_bytes, s.live_bytes
//
// Allocations whose label starts with "kshard.cache:" (communicator staging
// buffers, the buffer pool's blocks) or "Kokkos::" (Kokkos' internal scratch)
// are long-lived caches and are counted separately. Among them,
// "kshard.cache:workspace:" marks a library workspace (cuBLAS / cuBLASLt): made
// once and kept, so not a leak, but memory a training step needs; reports of
// a step's peak add workspace_bytes (as PyTorch's max_memory_allocated
// includes its cuBLAS workspace). A pool block handed out
// counts as live under its user's label while in use (note_acquire /
// note_release), so leaks and peaks see pooled memory like any View.
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace kshard::memory {

struct Stats {
  std::int64_t live_bytes = 0;    // excluding caches
  std::int64_t live_allocs = 0;   // excluding caches
  std::int64_t peak_bytes = 0;    // of live_bytes, since the last reset_peak()
  std::int64_t cache_bytes = 0;   // live "kshard.cache:" allocations
  std::int64_t workspace_bytes = 0;  // of which "kshard.cache:workspace:" ones
};

/// Installs the Kokkos callbacks (idempotent). Session does this.
void install();
bool installed() noexcept;
Stats stats() noexcept;
void reset_peak() noexcept;
/// A cached block handed out / given back (buffer_pool.hpp calls these).
void note_acquire(const char* label, const void* ptr, std::uint64_t size);
void note_release(const void* ptr, std::uint64_t size);
/// Number of allocations made so far (a clock for live_labels_since).
std::uint64_t allocation_count() noexcept;
/// "'label' 4000 B, ..." of live non-cache allocations made after allocation `since`.
std::string live_labels_since(std::uint64_t since, std::size_t max_items);
/// What was live at the last peak (since reset_peak()), by label with every
/// run of digits folded to '*' ("layers.*.full": all units together), largest
/// first: the answer to "what makes the peak". KSHARD_MEMORY_REPORT=1 makes
/// Session print it on each rank at exit.
std::vector<std::pair<std::string, std::int64_t>> peak_breakdown();
/// peak_breakdown() as text, one "  <bytes MiB>  <label>" line per entry,
/// then the library workspaces (outside peak_bytes) on a line of their own.
std::string peak_report(std::size_t max_items = 24);

}  // namespace kshard::memory
