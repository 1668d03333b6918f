#include "kshard/dtype.hpp"

#include <algorithm>
#include <cctype>
#include <utility>

#include "kshard/error.hpp"

namespace kshard {

const char* dtype_name(DType t) noexcept {
  switch (t) {
    case DType::f32: return "f32";
    case DType::f64: return "f64";
    case DType::i32: return "i32";
    case DType::i64: return "i64";
    case DType::u8: return "u8";
    case DType::bf16: return "bf16";
    case DType::f16: return "f16";
    case DType::e4m3: return "e4m3";
    case DType::e5m2: return "e5m2";
  }
  return "?";
}

std::size_t dtype_size(DType t) noexcept {
  switch (t) {
    case DType::f64:
    case DType::i64: return 8;
    case DType::f32:
    case DType::i32: return 4;
    case DType::bf16:
    case DType::f16: return 2;
    case DType::u8:
    case DType::e4m3:
    case DType::e5m2: return 1;
  }
  return 0;
}

bool dtype_reducible(DType t) noexcept { return t != DType::e4m3 && t != DType::e5m2; }

DType parse_dtype(const std::string& name) {
  std::string n = name;
  std::transform(n.begin(), n.end(), n.begin(), [](unsigned char c) { return std::tolower(c); });
  static const std::pair<const char*, DType> table[] = {
      {"f32", DType::f32},     {"fp32", DType::f32},       {"float32", DType::f32},
      {"f64", DType::f64},     {"fp64", DType::f64},       {"float64", DType::f64},
      {"i32", DType::i32},     {"int32", DType::i32},      {"i64", DType::i64},
      {"int64", DType::i64},   {"u8", DType::u8},          {"uint8", DType::u8},
      {"bf16", DType::bf16},   {"bfloat16", DType::bf16},  {"f16", DType::f16},
      {"fp16", DType::f16},    {"float16", DType::f16},    {"e4m3", DType::e4m3},
      {"fp8_e4m3", DType::e4m3}, {"float8_e4m3fn", DType::e4m3}, {"e5m2", DType::e5m2},
      {"fp8_e5m2", DType::e5m2}, {"float8_e5m2", DType::e5m2}};
  for (const auto& [key, t] : table)
    if (n == key) return t;
  throw Error("unknown dtype '" + name + "'",
              "one of f32, f64, i32, i64, u8, bf16, f16, e4m3, e5m2");
}

}  // namespace kshard
