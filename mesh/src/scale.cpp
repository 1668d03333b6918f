#include "scale.hpp"

#include <Kokkos_Core.hpp>

#include "kshard/compat/kokkos.hpp"
#include "kshard/error.hpp"
#include "kshard/numeric/convert.hpp"

namespace kshard::detail {
namespace {

template <class T>
struct Divide {
  T* p;
  int d;
  KOKKOS_INLINE_FUNCTION void operator()(const std::size_t i) const {
    if constexpr (std::is_same_v<T, bfloat16_t> || std::is_same_v<T, float16_t>)
      p[i] = from_float<T>(to_float(p[i]) / float(d));
    else
      p[i] = T(p[i] / T(d));
  }
};

template <class T, class Exec>
void run(void* data, std::size_t count, int divisor) {
  Kokkos::parallel_for("kshard::divide_in_place", Kokkos::RangePolicy<Exec, std::size_t>(0, count),
                       Divide<T>{static_cast<T*>(data), divisor});
  Kokkos::fence();
}

template <class Exec>
void dispatch(void* data, std::size_t count, DType dtype, int divisor) {
  switch (dtype) {
    case DType::f32: return run<float, Exec>(data, count, divisor);
    case DType::f64: return run<double, Exec>(data, count, divisor);
    case DType::i32: return run<std::int32_t, Exec>(data, count, divisor);
    case DType::i64: return run<std::int64_t, Exec>(data, count, divisor);
    case DType::u8: return run<std::uint8_t, Exec>(data, count, divisor);
    case DType::bf16: return run<bfloat16_t, Exec>(data, count, divisor);
    case DType::f16: return run<float16_t, Exec>(data, count, divisor);
    default:
      throw Error(std::string("average of ") + dtype_name(dtype), "a reducible dtype");
  }
}

}  // namespace

void divide_in_place(void* data, std::size_t count, DType dtype, int divisor, MemKind mem) {
  if (count == 0 || divisor == 1) return;
  if (mem == MemKind::host)
    dispatch<Kokkos::DefaultHostExecutionSpace>(data, count, dtype, divisor);
  else
    dispatch<Kokkos::DefaultExecutionSpace>(data, count, dtype, divisor);
}

}  // namespace kshard::detail
