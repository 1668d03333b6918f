#include "kshard/kernels/cast.hpp"
#include "kshard/compat/for_each.hpp"
#include "kshard/compat/kokkos.hpp"

#include <string>

#include "kshard/error.hpp"
#include "kshard/numeric/convert.hpp"
#include "kshard/kernels/elementwise_stream.hpp"
#include "pointwise.hpp"

namespace kshard {
namespace {

void check_same(std::size_t a, std::size_t b, const char* who) {
  if (a != b)
    throw Error(std::string(who) + ": source has " + std::to_string(a) + " elements, destination " +
                    std::to_string(b),
                "Views of equal size");
}

template <class T>
struct FromF32 {
  Kokkos::View<const float*> s;
  Kokkos::View<T*> d;
  KOKKOS_INLINE_FUNCTION void operator()(const std::size_t i) const { d(i) = from_float<T>(s(i)); }
};
template <class T>
struct ToF32 {
  Kokkos::View<const T*> s;
  Kokkos::View<float*> d;
  bool acc;
  KOKKOS_INLINE_FUNCTION void operator()(const std::size_t i) const {
    const float v = to_float(s(i));
    d(i) = acc ? d(i) + v : v;
  }
};
struct Scale {
  Kokkos::View<float*> v;
  float s;
  KOKKOS_INLINE_FUNCTION void operator()(const std::size_t i) const { v(i) *= s; }
};

// dst += src with (sum of squares, non-finite count) of the result, as one
// array reduction.
template <class T, class I>
KOKKOS_INLINE_FUNCTION float grad_write_value(GradWrite mode, const Kokkos::View<float*>& d,
                                              const Kokkos::View<const T*>& s, I i) {
  switch (mode) {
    case GradWrite::add: return d(i) + to_float(s(i));
    case GradWrite::assign: return to_float(s(i));
    default: return d(i);
  }
}

template <class T>
struct AccumulateStats {
  using value_type = double[];
  using size_type = std::size_t;
  unsigned value_count = 2;
  Kokkos::View<const T*> s;
  Kokkos::View<float*> d;
  GradWrite mode = GradWrite::add;
  KOKKOS_INLINE_FUNCTION void operator()(const std::size_t i, value_type acc) const {
    const float v = grad_write_value(mode, d, s, i);
    if (mode != GradWrite::none) d(i) = v;
    detail::pointwise::tally(v, acc[0], acc[1]);
  }
  KOKKOS_INLINE_FUNCTION void init(value_type acc) const { acc[0] = acc[1] = 0.0; }
  KOKKOS_INLINE_FUNCTION void join(KSHARD_JOIN_VOLATILE value_type dst,
                                   const KSHARD_JOIN_VOLATILE value_type src) const {
    dst[0] += src[0];
    dst[1] += src[1];
  }
#if !KSHARD_KOKKOS_AT_LEAST(4, 0)  // 3.4 calls both forms; in 4.x the one above is this one
  KOKKOS_INLINE_FUNCTION void join(value_type dst, const value_type src) const {
    dst[0] += src[0];
    dst[1] += src[1];
  }
#endif
};

using Policy = Kokkos::RangePolicy<Kokkos::DefaultExecutionSpace, std::size_t>;

}  // namespace

template <class T>
void cast_from_f32(Kokkos::View<const float*> src, Kokkos::View<T*> dst) {
  check_same(src.extent(0), dst.extent(0), "cast_from_f32");
  if (detail::cast_from_f32_stream<T>(src.data(), dst.data(), std::int64_t(src.extent(0)))) return;
  compat::for_each_index("kshard::cast_from_f32", std::int64_t(src.extent(0)),
                         FromF32<T>{src, dst});
}

template <class T>
void cast_to_f32(Kokkos::View<const T*> src, Kokkos::View<float*> dst, bool accumulate) {
  check_same(src.extent(0), dst.extent(0), "cast_to_f32");
  compat::for_each_index("kshard::cast_to_f32", std::int64_t(src.extent(0)),
                         ToF32<T>{src, dst, accumulate});
}

template <class T>
void accumulate_with_stats(Kokkos::View<const T*> src, Kokkos::View<float*> dst,
                           Kokkos::View<double*> stats, GradWrite mode) {
  if (mode != GradWrite::none) check_same(src.extent(0), dst.extent(0), "accumulate_with_stats");
  if (stats.extent(0) < 2)
    throw Error("accumulate_with_stats: stats has " + std::to_string(stats.extent(0)) +
                    " elements",
                "2 (sum of squares, inf/NaN count)");
  if (dst.extent(0) == 0) {
    fill<double>(stats, 0.0);
    return;
  }
  // The backend's kernel keeps the totals on the device, so the reduction
  // pipeline never waits for the host (elementwise_stream.hpp).
  if (detail::accumulate_with_stats_stream<T>(src.data(), dst.data(), stats.data(),
                                              std::int64_t(dst.extent(0)), mode))
    return;
  // Host backends run the reduction synchronously anyway.
  double out[2] = {0.0, 0.0};
  Kokkos::parallel_reduce("kshard::accumulate_with_stats", Policy(0, dst.extent(0)),
                          AccumulateStats<T>{2u, src, dst, mode}, out);
  auto h = Kokkos::create_mirror_view(stats);
  h(0) = out[0];
  h(1) = out[1];
  Kokkos::deep_copy(stats, h);
}

void scale_in_place(Kokkos::View<float*> v, float s) {
  compat::for_each_index("kshard::scale_in_place", std::int64_t(v.extent(0)), Scale{v, s});
}

template <class T>
void fill(Kokkos::View<T*> v, T value) {
  compat::for_each_index("kshard::fill", std::int64_t(v.extent(0)),
                         KOKKOS_LAMBDA(std::int64_t i) { v(i) = value; });
}

template void fill<float>(Kokkos::View<float*>, float);
template void fill<double>(Kokkos::View<double*>, double);
template void fill<bfloat16_t>(Kokkos::View<bfloat16_t*>, bfloat16_t);
template void fill<float16_t>(Kokkos::View<float16_t*>, float16_t);
template void cast_from_f32<float>(Kokkos::View<const float*>, Kokkos::View<float*>);
template void cast_from_f32<bfloat16_t>(Kokkos::View<const float*>, Kokkos::View<bfloat16_t*>);
template void cast_from_f32<float16_t>(Kokkos::View<const float*>, Kokkos::View<float16_t*>);
template void cast_to_f32<float>(Kokkos::View<const float*>, Kokkos::View<float*>, bool);
template void cast_to_f32<bfloat16_t>(Kokkos::View<const bfloat16_t*>, Kokkos::View<float*>, bool);
template void cast_to_f32<float16_t>(Kokkos::View<const float16_t*>, Kokkos::View<float*>, bool);
template void accumulate_with_stats<float>(Kokkos::View<const float*>, Kokkos::View<float*>,
                                          Kokkos::View<double*>, GradWrite);
template void accumulate_with_stats<bfloat16_t>(Kokkos::View<const bfloat16_t*>,
                                               Kokkos::View<float*>, Kokkos::View<double*>,
                                               GradWrite);
template void accumulate_with_stats<float16_t>(Kokkos::View<const float16_t*>,
                                              Kokkos::View<float*>, Kokkos::View<double*>,
                                              GradWrite);

}  // namespace kshard
