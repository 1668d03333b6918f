#pragma once
// Element-wise kernels with a launch shape that streams at memory speed.
//
//   kshard::compat::for_each_index("kshard::add", n, KOKKOS_LAMBDA(std::int64_t i) {
//     out(i) = a(i) + b(i);
//   });
//   kshard::compat::for_each_row("kshard::bias", rows, cols,
//                                KOKKOS_LAMBDA(std::int64_t r, std::int64_t c) { ... });
//
// Why: on the H200, Kokkos 3.4's CUDA RangePolicy launches 64-thread blocks
// with one element per thread (its block-size deduction predates sm_90), so
// an element-wise kernel is bound by the block scheduler, not by memory:
// ncu measured a 50M-element f32 fill at 474 us (0.42 TB/s) and a bias add
// over [4096, 8192] bf16 at 200 us (0.7 TB/s of the 4 TB/s a copy reaches).
// On CUDA these helpers launch 256-thread teams that each cover a contiguous
// chunk (coalesced, a few elements per thread); elsewhere they are plain
// RangePolicy / row loops, so host kernels keep their shape.
#include <cstdint>

#include <Kokkos_Core.hpp>

namespace kshard::compat {

#if defined(KOKKOS_ENABLE_CUDA)
inline constexpr int kTeamThreads = 256;
inline constexpr int kElementsPerThread = 8;
#endif

/// One team per row, for row-wise reductions (LayerNorm, softmax,
/// cross-entropy). On CUDA kTeamThreads threads: Kokkos 3.4's AUTO picks
/// 64-thread teams on sm_90, which ncu measured at a fraction of the memory
/// bandwidth (cross-entropy over [4096, 32000] bf16 logits: 1.4 ms; LayerNorm
/// rows of 2048: 63 us). Elsewhere AUTO.
inline Kokkos::TeamPolicy<> row_team_policy(std::int64_t rows) {
#if defined(KOKKOS_ENABLE_CUDA)
  return Kokkos::TeamPolicy<>(static_cast<int>(rows), kTeamThreads);
#else
  return Kokkos::TeamPolicy<>(static_cast<int>(rows), Kokkos::AUTO);
#endif
}

/// A reduction over the team's threads (f(j, acc) for j in [0, n) into
/// `result`, a value or a Kokkos reducer), then a team barrier: every row
/// kernel's team reductions go through here. Kokkos 3.4's CUDA team
/// reduction hands its result through shared memory that the next team
/// reduction writes again, so two back-to-back reductions race without a
/// barrier between them (compute-sanitizer racecheck on the H200, LayerNorm).
template <class Team, class F, class R>
KOKKOS_INLINE_FUNCTION void team_reduce(const Team& team, std::int64_t n, const F& f, R&& result) {
  Kokkos::parallel_reduce(Kokkos::TeamThreadRange(team, n), f, static_cast<R&&>(result));
  team.team_barrier();
}

/// f(i) for i in [0, n), on the default execution space.
template <class F>
void for_each_index(const char* label, std::int64_t n, const F& f) {
  if (n <= 0) return;
#if defined(KOKKOS_ENABLE_CUDA)
  using Member = Kokkos::TeamPolicy<>::member_type;
  constexpr std::int64_t per_team = std::int64_t(kTeamThreads) * kElementsPerThread;
  const std::int64_t league = (n + per_team - 1) / per_team;
  Kokkos::parallel_for(
      label, Kokkos::TeamPolicy<>(static_cast<int>(league), kTeamThreads),
      KOKKOS_LAMBDA(const Member& t) {
        const std::int64_t base = std::int64_t(t.league_rank()) * per_team;
        const std::int64_t end = base + per_team < n ? base + per_team : n;
        // Threads stride by the team size: consecutive threads touch
        // consecutive elements on every iteration (coalesced).
        for (std::int64_t i = base + t.team_rank(); i < end; i += kTeamThreads) f(i);
      });
#else
  Kokkos::parallel_for(label, Kokkos::RangePolicy<>(0, n), f);
#endif
}

/// f(r, c) for every element of a row-major [rows, cols] matrix, one team
/// per row on CUDA (no division or modulo per element).
template <class F>
void for_each_row(const char* label, std::int64_t rows, std::int64_t cols, const F& f) {
  if (rows <= 0 || cols <= 0) return;
#if defined(KOKKOS_ENABLE_CUDA)
  using Member = Kokkos::TeamPolicy<>::member_type;
  Kokkos::parallel_for(
      label, Kokkos::TeamPolicy<>(static_cast<int>(rows), kTeamThreads),
      KOKKOS_LAMBDA(const Member& t) {
        const std::int64_t r = t.league_rank();
        for (std::int64_t c = t.team_rank(); c < cols; c += kTeamThreads) f(r, c);
      });
#else
  Kokkos::parallel_for(
      label, Kokkos::RangePolicy<>(0, rows), KOKKOS_LAMBDA(std::int64_t r) {
        for (std::int64_t c = 0; c < cols; ++c) f(r, c);
      });
#endif
}

}  // namespace kshard::compat
