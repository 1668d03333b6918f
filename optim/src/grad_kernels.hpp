#pragma once
// Kernels shared by grad_clip.cpp and fused_adam.cpp (not installed).
// Functors, not lambdas: they must compile under nvcc as well.
//
// Two shapes of each kernel: one element per index on devices (coalesced),
// and on host execution spaces one block of kHostBlock elements per index,
// written so that one core vectorises them (see fused_adam.cpp for the
// update, SumSquaresNonfiniteHost for the statistics).
#include <cmath>
#include "kshard/compat/for_each.hpp"
#include "kshard/core/buffer_pool.hpp"
#include "kshard/compat/kokkos.hpp"
#include <cstdint>
#include <cstdlib>
#include <utility>
#include <type_traits>

#include <Kokkos_Core.hpp>

#if defined(__SSE2__) && !defined(__CUDACC__)
#include <emmintrin.h>
#endif

namespace kshard::detail {

using ExecSpace = Kokkos::DefaultExecutionSpace;
using MemSpace = ExecSpace::memory_space;
using Range = Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<std::int64_t>>;

inline constexpr int kHostBlock = 512;

/// KSHARD_OPTIM_PORTABLE_KERNELS=1 runs the device-shaped kernels on a host
/// build too, so that host CI covers their indexing (wide loads, tails,
/// alignment fallback). Read once.
inline bool portable_kernels() {
  static const bool on = [] {
    const char* e = std::getenv("KSHARD_OPTIM_PORTABLE_KERNELS");
    return e != nullptr && *e != '\0' && *e != '0';
  }();
  return on;
}

inline std::int64_t host_blocks(std::int64_t n) { return (n + kHostBlock - 1) / kHostBlock; }

/// inf or NaN, from the bits: immune to -ffast-math assumptions.
KOKKOS_INLINE_FUNCTION bool is_nonfinite(float x) {
  std::uint32_t u;
  __builtin_memcpy(&u, &x, sizeof u);
  return (u & 0x7F800000u) == 0x7F800000u;
}

/// Sum of squares of x[0..len) in double with eight explicit accumulators,
/// a pattern GCC vectorises without -ffast-math (each accumulator is its own
/// lane, so vectorising does not reorder a single addition). Host only.
#define KSHARD_OPTIM_SUM_SQUARES_BODY                                               \
  {                                                                                  \
    double s0 = 0, s1 = 0, s2 = 0, s3 = 0, s4 = 0, s5 = 0, s6 = 0, s7 = 0;          \
    int j = 0;                                                                       \
    for (; j + 8 <= len; j += 8) {                                                   \
      s0 += double(x[j]) * double(x[j]);                                             \
      s1 += double(x[j + 1]) * double(x[j + 1]);                                     \
      s2 += double(x[j + 2]) * double(x[j + 2]);                                     \
      s3 += double(x[j + 3]) * double(x[j + 3]);                                     \
      s4 += double(x[j + 4]) * double(x[j + 4]);                                     \
      s5 += double(x[j + 5]) * double(x[j + 5]);                                     \
      s6 += double(x[j + 6]) * double(x[j + 6]);                                     \
      s7 += double(x[j + 7]) * double(x[j + 7]);                                     \
    }                                                                                \
    for (; j < len; ++j) s0 += double(x[j]) * double(x[j]);                          \
    return ((s0 + s1) + (s2 + s3)) + ((s4 + s5) + (s6 + s7));                        \
  }
inline double host_sum_squares_base(const float* __restrict x, int len)
    KSHARD_OPTIM_SUM_SQUARES_BODY
#if defined(__GNUC__) && defined(__x86_64__) && !defined(__CUDACC__)
// The float->double conversions bound this loop on one core with SSE2's
// two lanes; where the CPU has AVX2 the same source runs four wide (same
// additions, same result: ~25% faster measured).
__attribute__((target("avx2"))) inline double host_sum_squares_avx2(const float* __restrict x,
                                                                    int len)
    KSHARD_OPTIM_SUM_SQUARES_BODY
inline double host_sum_squares(const float* x, int len) {
  static const bool avx2 = __builtin_cpu_supports("avx2");
  return avx2 ? host_sum_squares_avx2(x, len) : host_sum_squares_base(x, len);
}
#else
inline double host_sum_squares(const float* x, int len) { return host_sum_squares_base(x, len); }
#endif
#undef KSHARD_OPTIM_SUM_SQUARES_BODY

/// The host shape of the statistics, one block per index. The non-finite
/// count is taken only for a block whose sum is not finite: a sum of squares
/// of kHostBlock finite floats cannot overflow a double
/// (512 x (3.4e38)^2 ~ 6e79), so that happens exactly when the block holds
/// an inf or NaN — rarely, and then the count is still exact.
struct SumSquaresNonfiniteHost {
  using value_type = double[];
  unsigned value_count = 2;
  const float* g;
  std::int64_t n;

  void operator()(const std::int64_t b, value_type acc) const {
    const std::int64_t begin = b * kHostBlock;
    const int len = int(n - begin < kHostBlock ? n - begin : kHostBlock);
    const float* x = g + begin;
    const double s = host_sum_squares(x, len);
    double bad = 0;
    if (!std::isfinite(s))
      for (int j = 0; j < len; ++j) bad += is_nonfinite(x[j]) ? 1.0 : 0.0;
    acc[0] += s;
    acc[1] += bad;
  }
  void init(value_type acc) const {
    acc[0] = 0;
    acc[1] = 0;
  }
  void join(KSHARD_JOIN_VOLATILE value_type dst,
                                   const KSHARD_JOIN_VOLATILE value_type src) const {
    dst[0] += src[0];
    dst[1] += src[1];
  }
};

/// True for execution spaces that run on the host (blocked kernels).
template <class Exec>
inline constexpr bool is_host_exec_v =
    std::is_same_v<typename Exec::memory_space, Kokkos::HostSpace>;

/// The device shape of the statistics. A Kokkos range reduction runs on a
/// small grid in Kokkos 3.4 (at most block-size blocks: a fraction of an
/// H200, ~1 TB/s measured), so the work is a parallel_for over `slots`
/// virtual threads, about as many as the device holds resident: slot t walks
/// units t, t + slots, ... (W floats each, one 16-byte load when W = 4;
/// neighbouring slots read neighbouring units), four units per iteration for
/// bytes in flight, and sets (first View of a batch) or adds its own pair of
/// doubles in `out`. One small reduction over the slots ends the batch.
template <int W>
struct SlotSumSquares {
  struct alignas(4 * W) Chunk {
    float x[W];
  };
  const float* g;
  std::int64_t n, units, slots;
  double* out;
  bool accumulate;

  KOKKOS_INLINE_FUNCTION void add(const Chunk& c, double& s, double& bad) const {
    for (int e = 0; e < W; ++e) {
      s += double(c.x[e]) * double(c.x[e]);
      bad += is_nonfinite(c.x[e]) ? 1.0 : 0.0;
    }
  }
  KOKKOS_INLINE_FUNCTION void operator()(const std::int64_t t) const {
    const Chunk* c = reinterpret_cast<const Chunk*>(g);
    double s = 0, bad = 0;
    std::int64_t u = t;
    for (; u + 3 * slots < units; u += 4 * slots) {
      const Chunk c0 = c[u], c1 = c[u + slots], c2 = c[u + 2 * slots], c3 = c[u + 3 * slots];
      add(c0, s, bad);
      add(c1, s, bad);
      add(c2, s, bad);
      add(c3, s, bad);
    }
    for (; u < units; u += slots) add(c[u], s, bad);
    const std::int64_t tail = n - W * units;  // < W <= slots
    if (t < tail) {
      const float x = g[W * units + t];
      s += double(x) * double(x);
      bad += is_nonfinite(x) ? 1.0 : 0.0;
    }
    if (accumulate) {
      out[2 * t] += s;
      out[2 * t + 1] += bad;
    } else {
      out[2 * t] = s;
      out[2 * t + 1] = bad;
    }
  }
};

/// Sums the slots' pairs in one team: [0] sum of squares, [1] non-finite
/// count. Team reductions only, in a fixed order (Kokkos 3.4's RangePolicy
/// array reduction on CUDA goes through a warp-synchronous shared-memory
/// block scan that compute-sanitizer's racecheck reports).
struct SlotTotal {
  const double* in;
  std::int64_t slots;
  double* out;  // [2]
  template <class Member>
  KOKKOS_INLINE_FUNCTION void operator()(const Member& team) const {
    double s = 0, bad = 0;
    compat::team_reduce(
        team, slots, [&](std::int64_t t, double& acc) { acc += in[2 * t]; }, s);
    compat::team_reduce(
        team, slots, [&](std::int64_t t, double& acc) { acc += in[2 * t + 1]; }, bad);
    Kokkos::single(Kokkos::PerTeam(team), [&]() {
      out[0] = s;
      out[1] = bad;
    });
  }
};

/// Number of slots for the device statistics: the resident threads of the
/// default execution space (an H200: 132 x 2048), at least 4.
inline std::int64_t stat_slots() {
  std::int64_t c = std::int64_t(ExecSpace::concurrency());
  if (c > (std::int64_t(1) << 20)) c = std::int64_t(1) << 20;
  return c < 4 ? 4 : c;
}

/// Whether this build/run uses the device statistics (and needs slots).
inline bool device_stats() {
  if constexpr (is_host_exec_v<ExecSpace>) return portable_kernels();
  return true;
}

/// Sum of squares (double) and non-finite count of a batch of gradient
/// Views: one kernel per non-empty View, then finish(). On devices nothing
/// waits until finish(); `slots` (2 x stat_slots() doubles) is the scratch.
class GradStatsBatch {
 public:
  explicit GradStatsBatch(Kokkos::View<double*, MemSpace> slots) : slots_(std::move(slots)) {}

  template <class Exec = ExecSpace>
  void add(const Kokkos::View<const float*, MemSpace>& grad) {
    using Policy = Kokkos::RangePolicy<Exec, Kokkos::IndexType<std::int64_t>>;
    const auto n = std::int64_t(grad.size());
    if (n == 0) return;
    if constexpr (is_host_exec_v<Exec>) {
      if (!portable_kernels()) {
        double r[2] = {0, 0};
        Kokkos::View<double*, Kokkos::HostSpace, Kokkos::MemoryUnmanaged> out(r, 2);
        Kokkos::parallel_reduce("kshard.optim.grad_sum_squares", Policy(0, host_blocks(n)),
                                SumSquaresNonfiniteHost{2, grad.data(), n}, out);
        host_[0] += r[0];
        host_[1] += r[1];
        return;
      }
    }
    const std::int64_t slots = std::int64_t(slots_.size() / 2);
    const bool wide = reinterpret_cast<std::uintptr_t>(grad.data()) % 16 == 0;
    if (wide)
      Kokkos::parallel_for("kshard.optim.grad_sum_squares", Policy(0, slots),
                           SlotSumSquares<4>{grad.data(), n, n / 4, slots, slots_.data(), started_});
    else
      Kokkos::parallel_for("kshard.optim.grad_sum_squares", Policy(0, slots),
                           SlotSumSquares<1>{grad.data(), n, n, slots, slots_.data(), started_});
    started_ = true;
  }

  /// {sum of squares, non-finite count} of everything added; waits.
  template <class Exec = ExecSpace>
  void finish(double (&result)[2]) {
    result[0] = host_[0];
    result[1] = host_[1];
    if (!started_) return;
    double r[2] = {0, 0};
    const memory::Block total = memory::acquire(2 * sizeof(double), "kshard.optim.grad_total");
    Kokkos::parallel_for("kshard.optim.grad_stats_total", Kokkos::TeamPolicy<Exec>(1, Kokkos::AUTO),
                         SlotTotal{slots_.data(), std::int64_t(slots_.size() / 2),
                                   total.view<double>(2).data()});
    Kokkos::deep_copy(Kokkos::View<double*, Kokkos::HostSpace, Kokkos::MemoryUnmanaged>(r, 2),
                      total.view<double>(2));  // waits for the kernels
    result[0] += r[0];
    result[1] += r[1];
  }

 private:
  Kokkos::View<double*, MemSpace> slots_;
  bool started_ = false;
  double host_[2] = {0, 0};
};

struct ScaleInPlace {
  Kokkos::View<float*, MemSpace> g;
  float s;
  KOKKOS_INLINE_FUNCTION void operator()(const std::int64_t i) const { g(i) *= s; }
};

}  // namespace kshard::detail
