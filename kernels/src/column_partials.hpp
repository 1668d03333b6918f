#pragma once
// add_column_partials: the fixed-order second stage of the column sums that
// kernels fuse into a pass they make anyway (fp8_tensor.cpp's bias gradient
// in the dy cast, the norms' gain gradients in their CUDA row kernels): each
// tile or block of rows writes its column sums to `partials`, then this adds
// them up in an order that does not depend on the backend's thread count, so
// a step stays bitwise repeatable. Private to the kernels library.
#include <cstdint>

#include <Kokkos_Core.hpp>

namespace kshard::detail {

inline Kokkos::TeamPolicy<> column_partials_teams(std::int64_t league) {
#if defined(KOKKOS_ENABLE_CUDA)
  return Kokkos::TeamPolicy<>(static_cast<int>(league), 256);
#else
  return Kokkos::TeamPolicy<>(static_cast<int>(league), Kokkos::AUTO);
#endif
}

/// dbias[c] += sum over t of partials[t * cols + c] in a fixed order (=
/// with assign): the second stage of a fused column sum (an fp8 cast's bias
/// gradient, a norm's gain gradient: per-tile or per-block column sums
/// first, so the result does not depend on the thread count). A team per 32
/// columns: 8 threads a column, each summing every eighth tile row, then the
/// 8 sums in order. (compat::for_each_index gives each thread 8 columns, which
/// left a 2048-column gradient to one block: 46 us a call on the H100.)
/// `label` names the kernel in profiles.
inline void add_column_partials(Kokkos::View<const float*> partials, std::int64_t tiles_r,
                                std::int64_t cols, Kokkos::View<float*> dbias,
                                bool assign = false,
                                const char* label = "kshard::fp8_dbias_partials") {
  constexpr int kCols = 32, kGroups = 8;
  using Member = Kokkos::TeamPolicy<>::member_type;
  using Scratch = Kokkos::View<float*, Kokkos::DefaultExecutionSpace::scratch_memory_space,
                               Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
  if (cols <= 0) return;
  Kokkos::parallel_for(
      label, column_partials_teams((cols + kCols - 1) / kCols)
          .set_scratch_size(0, Kokkos::PerTeam(Scratch::shmem_size(kCols * kGroups))),
      KOKKOS_LAMBDA(const Member& team) {
        Scratch part(team.team_scratch(0), kCols * kGroups);
        const std::int64_t c0 = std::int64_t(team.league_rank()) * kCols;
        Kokkos::parallel_for(Kokkos::TeamThreadRange(team, kCols * kGroups), [&](const int i) {
          const int cl = i % kCols, g = i / kCols;
          float sum = 0.0f;
          if (c0 + cl < cols)
            for (std::int64_t t = g; t < tiles_r; t += kGroups) sum += partials(t * cols + c0 + cl);
          part(i) = sum;
        });
        team.team_barrier();
        Kokkos::parallel_for(Kokkos::TeamThreadRange(team, kCols), [&](const int cl) {
          if (c0 + cl >= cols) return;
          float sum = 0.0f;
          for (int g = 0; g < kGroups; ++g) sum += part(g * kCols + cl);
          dbias(c0 + cl) = assign ? sum : dbias(c0 + cl) + sum;
        });
      });
}

}  // namespace kshard::detail
