#include "kshard/engine/cast.hpp"

#include <string>

#include "kshard/error.hpp"
#include "kshard/numeric/convert.hpp"

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

using Policy = Kokkos::RangePolicy<Kokkos::DefaultExecutionSpace, std::size_t>;

}  // namespace

template <class T>
void cast_from_f32(Kokkos::View<const float*> src, Kokkos::View<T*> dst) {
  check_same(src.extent(0), dst.extent(0), "cast_from_f32");
  Kokkos::parallel_for("kshard::cast_from_f32", Policy(0, src.extent(0)), FromF32<T>{src, dst});
}

template <class T>
void cast_to_f32(Kokkos::View<const T*> src, Kokkos::View<float*> dst, bool accumulate) {
  check_same(src.extent(0), dst.extent(0), "cast_to_f32");
  Kokkos::parallel_for("kshard::cast_to_f32", Policy(0, src.extent(0)),
                       ToF32<T>{src, dst, accumulate});
}

void scale_in_place(Kokkos::View<float*> v, float s) {
  Kokkos::parallel_for("kshard::scale_in_place", Policy(0, v.extent(0)), Scale{v, s});
}

template void cast_from_f32<float>(Kokkos::View<const float*>, Kokkos::View<float*>);
template void cast_from_f32<bfloat16_t>(Kokkos::View<const float*>, Kokkos::View<bfloat16_t*>);
template void cast_from_f32<float16_t>(Kokkos::View<const float*>, Kokkos::View<float16_t*>);
template void cast_to_f32<float>(Kokkos::View<const float*>, Kokkos::View<float*>, bool);
template void cast_to_f32<bfloat16_t>(Kokkos::View<const bfloat16_t*>, Kokkos::View<float*>, bool);
template void cast_to_f32<float16_t>(Kokkos::View<const float16_t*>, Kokkos::View<float*>, bool);

}  // namespace kshard
