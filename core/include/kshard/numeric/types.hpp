#pragma once
// Storage types for the low-precision formats kshard moves and stores.
// They are plain bit containers (trivially copyable, the size of the format)
// so they can live in Kokkos Views, cross MPI/NCCL as raw bytes and be
// reinterpreted by vendor libraries. Conversions with round-to-nearest-even
// live in kshard/numeric/convert.hpp.
#include <cstdint>

namespace kshard {

struct bfloat16_t {
  std::uint16_t bits;
};
struct float16_t {
  std::uint16_t bits;
};
/// OCP FP8 E4M3 ("fn": no infinities, one NaN pattern per sign, max 448).
struct float8_e4m3_t {
  std::uint8_t bits;
};
/// OCP FP8 E5M2 (IEEE-like: infinities and NaNs, max 57344).
struct float8_e5m2_t {
  std::uint8_t bits;
};

static_assert(sizeof(bfloat16_t) == 2 && sizeof(float16_t) == 2, "16-bit storage types");
static_assert(sizeof(float8_e4m3_t) == 1 && sizeof(float8_e5m2_t) == 1, "8-bit storage types");

}  // namespace kshard
