#pragma once
// DType: the runtime tag of an element type, so collectives, checkpoints and
// recipes can check and describe buffers without templates.
#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>

#include "kshard/numeric/types.hpp"

namespace kshard {

enum class DType : std::uint8_t { f32, f64, i32, i64, u8, bf16, f16, e4m3, e5m2 };

const char* dtype_name(DType t) noexcept;
std::size_t dtype_size(DType t) noexcept;
/// Parses "f32", "float32", "bf16", ... ; throws kshard::Error on anything else.
DType parse_dtype(const std::string& name);
/// Floating types that reductions understand (fp8 is storage-only for them).
bool dtype_reducible(DType t) noexcept;

template <class T>
struct dtype_of;  // undefined: a compile error names the unsupported type

#define KSHARD_DTYPE_OF(T, TAG) \
  template <>                   \
  struct dtype_of<T> : std::integral_constant<DType, DType::TAG> {};
KSHARD_DTYPE_OF(float, f32)
KSHARD_DTYPE_OF(double, f64)
KSHARD_DTYPE_OF(std::int32_t, i32)
KSHARD_DTYPE_OF(std::int64_t, i64)
KSHARD_DTYPE_OF(std::uint8_t, u8)
KSHARD_DTYPE_OF(bfloat16_t, bf16)
KSHARD_DTYPE_OF(float16_t, f16)
KSHARD_DTYPE_OF(float8_e4m3_t, e4m3)
KSHARD_DTYPE_OF(float8_e5m2_t, e5m2)
#undef KSHARD_DTYPE_OF

template <class T, class = void>
struct has_dtype : std::false_type {};
template <class T>
struct has_dtype<T, std::void_t<decltype(dtype_of<T>::value)>> : std::true_type {};

}  // namespace kshard
