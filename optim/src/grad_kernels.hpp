#pragma once
// Kernels shared by grad_clip.cpp and fused_adam.cpp (not installed).
// Functors, not lambdas: they must compile under nvcc as well.
//
// Two shapes of each kernel: one element per index on devices (coalesced),
// and on host execution spaces one block of kHostBlock elements per index,
// written as plain loops that the compiler vectorises (several independent
// accumulators for the reductions; see host_sqrt for the square root).
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <type_traits>

#include <Kokkos_Core.hpp>

#if defined(__SSE2__) && !defined(__CUDACC__)
#include <emmintrin.h>
#endif

namespace kshard::optim_detail {

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

/// x[j] = sqrt(x[j]), correctly rounded. Without -fno-math-errno (which this
/// library does not impose on its users' flags) GCC keeps a libm call per
/// element for errno and will not vectorise std::sqrt, so on x86 the square
/// roots of a block are taken with SQRTPS (IEEE, same result).
inline void host_sqrt(float* x, int n) {
  int j = 0;
#if defined(__SSE2__) && !defined(__CUDACC__)
  for (; j + 4 <= n; j += 4) _mm_storeu_ps(x + j, _mm_sqrt_ps(_mm_loadu_ps(x + j)));
#endif
  for (; j < n; ++j) x[j] = std::sqrt(x[j]);
}

/// [0]: sum of squares in double, [1]: number of inf/NaN elements.
struct SumSquaresNonfinite {
  using value_type = double[];
  unsigned value_count = 2;
  Kokkos::View<const float*, MemSpace> g;

  explicit SumSquaresNonfinite(Kokkos::View<const float*, MemSpace> grad) : g(grad) {}

  KOKKOS_INLINE_FUNCTION void operator()(const std::int64_t i, value_type acc) const {
    const float x = g(i);
    acc[0] += double(x) * double(x);
    acc[1] += is_nonfinite(x) ? 1.0 : 0.0;
  }
  KOKKOS_INLINE_FUNCTION void init(value_type acc) const {
    acc[0] = 0;
    acc[1] = 0;
  }
  KOKKOS_INLINE_FUNCTION void join(volatile value_type dst, const volatile value_type src) const {
    dst[0] += src[0];
    dst[1] += src[1];
  }
};

/// The same reduction, one block per index, eight independent lanes.
struct SumSquaresNonfiniteHost {
  using value_type = double[];
  unsigned value_count = 2;
  const float* g;
  std::int64_t n;

  void operator()(const std::int64_t b, value_type acc) const {
    const std::int64_t begin = b * kHostBlock;
    const int len = int(n - begin < kHostBlock ? n - begin : kHostBlock);
    const float* __restrict x = g + begin;
    double s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    std::int32_t c[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int j = 0;
    for (; j + 8 <= len; j += 8)
      for (int k = 0; k < 8; ++k) {
        const double d = x[j + k];
        s[k] += d * d;
        c[k] += is_nonfinite(x[j + k]) ? 1 : 0;
      }
    for (; j < len; ++j) {
      const double d = x[j];
      s[0] += d * d;
      c[0] += is_nonfinite(x[j]) ? 1 : 0;
    }
    acc[0] += ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
    acc[1] += double(((c[0] + c[1]) + (c[2] + c[3])) + ((c[4] + c[5]) + (c[6] + c[7])));
  }
  void init(value_type acc) const {
    acc[0] = 0;
    acc[1] = 0;
  }
  void join(volatile value_type dst, const volatile value_type src) const {
    dst[0] += src[0];
    dst[1] += src[1];
  }
};

/// True for execution spaces that run on the host (blocked kernels).
template <class Exec>
inline constexpr bool is_host_exec_v =
    std::is_same_v<typename Exec::memory_space, Kokkos::HostSpace>;

/// Launches the reduction of `grad` into result[0..1] (memory of the default
/// space: no host synchronisation on devices). grad.size() > 0. A template
/// so that the branch not taken is never instantiated (host-only functors
/// must not meet a device policy under nvcc).
template <class Exec = ExecSpace>
void launch_sum_squares(const Kokkos::View<const float*, MemSpace>& grad, double* result) {
  using Policy = Kokkos::RangePolicy<Exec, Kokkos::IndexType<std::int64_t>>;
  Kokkos::View<double*, MemSpace, Kokkos::MemoryUnmanaged> out(result, 2);
  const auto n = std::int64_t(grad.size());
  if constexpr (is_host_exec_v<Exec>) {
    if (!portable_kernels()) {
      Kokkos::parallel_reduce("kshard.optim.grad_sum_squares", Policy(0, host_blocks(n)),
                              SumSquaresNonfiniteHost{2, grad.data(), n}, out);
      return;
    }
  }
  Kokkos::parallel_reduce("kshard.optim.grad_sum_squares", Policy(0, n),
                          SumSquaresNonfinite(grad), out);
}

struct ScaleInPlace {
  Kokkos::View<float*, MemSpace> g;
  float s;
  KOKKOS_INLINE_FUNCTION void operator()(const std::int64_t i) const { g(i) *= s; }
};

}  // namespace kshard::optim_detail
