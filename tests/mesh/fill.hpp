#pragma once
// Closed-form test data for the collective suites: element i of rank r is
// f(r, i) = (i % 7) + 2 r, small integers that every dtype (bf16 and u8
// included) represents exactly, and whose sums, averages, maxima and minima
// over the ranks are exact too:
//   sum = P (i % 7) + P (P - 1),  avg = (i % 7) + (P - 1),
//   max = (i % 7) + 2 (P - 1),    min = i % 7.
#include <Kokkos_Core.hpp>

#include <cstdint>
#include <type_traits>

#include "kshard/mesh/communicator.hpp"
#include "kshard/numeric/convert.hpp"

namespace kshard::test {

template <class T>
KOKKOS_INLINE_FUNCTION T make_value(double v) {
  if constexpr (std::is_same_v<T, bfloat16_t> || std::is_same_v<T, float16_t>)
    return from_float<T>(float(v));
  else
    return T(v);
}

template <class T>
inline double as_double(T v) {
  if constexpr (std::is_same_v<T, bfloat16_t> || std::is_same_v<T, float16_t>)
    return double(to_float(v));
  else
    return double(v);
}

KOKKOS_INLINE_FUNCTION double f(int rank, std::int64_t i) { return double(i % 7) + 2.0 * rank; }

inline double reduced(ReduceOp op, int P, std::int64_t i) {
  const double base = double(i % 7);
  switch (op) {
    case ReduceOp::sum: return P * base + double(P) * (P - 1);
    case ReduceOp::avg: return base + (P - 1);
    case ReduceOp::max: return base + 2.0 * (P - 1);
    case ReduceOp::min: return base;
  }
  return 0;
}

template <class T>
struct FillFunctor {
  Kokkos::View<T*> v;
  int rank;
  std::int64_t offset;
  KOKKOS_INLINE_FUNCTION void operator()(const std::int64_t i) const {
    v(i) = make_value<T>(f(rank, offset + i));
  }
};

/// v[i] = f(rank, offset + i), on the view's execution space.
template <class T>
void fill(const Kokkos::View<T*>& v, int rank, std::int64_t offset = 0) {
  Kokkos::parallel_for("kshard::test::fill",
                       Kokkos::RangePolicy<Kokkos::DefaultExecutionSpace, std::int64_t>(0, v.extent(0)),
                       FillFunctor<T>{v, rank, offset});
  Kokkos::fence();
}

template <class T>
struct ConstFunctor {
  Kokkos::View<T*> v;
  double value;
  KOKKOS_INLINE_FUNCTION void operator()(const std::int64_t i) const { v(i) = make_value<T>(value); }
};

template <class T>
void fill_constant(const Kokkos::View<T*>& v, double value) {
  Kokkos::parallel_for("kshard::test::fill_constant",
                       Kokkos::RangePolicy<Kokkos::DefaultExecutionSpace, std::int64_t>(0, v.extent(0)),
                       ConstFunctor<T>{v, value});
  Kokkos::fence();
}

}  // namespace kshard::test
