#pragma once
// Element-wise casts between f32 and the 16-bit storage types on flat Views of
// the default memory space, one kernel each. The sharded group uses them for
// the all-gather copy-in (f32 master -> bf16/f16), the upcast after it, and
// for the gradient reduce dtype.
//
//   kshard::cast_from_f32(master, bf16_shard);        // RNE
//   kshard::cast_to_f32(bf16_full, full, /*accumulate=*/false);
#include <cstdint>

#include <Kokkos_Core.hpp>

#include "kshard/kernels/grad_write.hpp"
#include "kshard/numeric/types.hpp"

namespace kshard {

/// dst[i] = T(src[i]) with round-to-nearest-even; T = float, bfloat16_t, float16_t.
template <class T>
void cast_from_f32(Kokkos::View<const float*> src, Kokkos::View<T*> dst);
/// dst[i] = float(src[i]) (accumulate: dst[i] += float(src[i])).
template <class T>
void cast_to_f32(Kokkos::View<const T*> src, Kokkos::View<float*> dst, bool accumulate = false);
/// What accumulate_with_stats() saw in the values it wrote.
struct GradShardStats {
  double sum_squares = 0;      // of the values after accumulation
  std::int64_t nonfinite = 0;  // how many of them are inf/NaN
};
// How accumulate_with_stats writes dst (kernels/grad_write.hpp): dst += src,
// dst = src (the shard was zero: one read less), or not at all (src ignored:
// statistics of dst only).
/// dst[i] += float(src[i]) (or per `mode`), and in the same pass the
/// statistics of the new dst: the optimizer's norm and inf/NaN check without
/// another read. They are written to stats (2 elements: sum of squares, count
/// of inf/NaN) on the device, in stream order: nothing waits for the kernel.
template <class T>
void accumulate_with_stats(Kokkos::View<const T*> src, Kokkos::View<float*> dst,
                           Kokkos::View<double*> stats, GradWrite mode = GradWrite::add);
/// v[i] *= s.
void scale_in_place(Kokkos::View<float*> v, float s);
/// v[i] = value, at memory speed on every backend (Kokkos 3.4's deep_copy
/// fill is block-scheduler bound on sm_90: see kshard/compat/for_each.hpp).
template <class T>
void fill(Kokkos::View<T*> v, T value);

}  // namespace kshard
