// kshard/dtype.hpp: names, sizes and parsing of the runtime element-type tag.
#include <boost/test/unit_test.hpp>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "kshard/dtype.hpp"
#include "kshard/error.hpp"

namespace {
const std::vector<std::pair<kshard::DType, std::size_t>> all_dtypes{
    {kshard::DType::f32, 4},  {kshard::DType::f64, 8},  {kshard::DType::i32, 4},
    {kshard::DType::i64, 8},  {kshard::DType::u8, 1},   {kshard::DType::bf16, 2},
    {kshard::DType::f16, 2},  {kshard::DType::e4m3, 1}, {kshard::DType::e5m2, 1}};
}  // namespace

BOOST_AUTO_TEST_SUITE(numeric_dtype)

BOOST_AUTO_TEST_CASE(name_and_size_of_every_dtype) {
  const std::vector<std::string> names{"f32", "f64", "i32", "i64", "u8",
                                       "bf16", "f16", "e4m3", "e5m2"};
  for (std::size_t i = 0; i < all_dtypes.size(); ++i) {
    const auto [t, size] = all_dtypes[i];
    BOOST_CHECK(kshard::dtype_name(t) == names[i]);
    BOOST_CHECK(kshard::dtype_size(t) == size);
    BOOST_CHECK((kshard::parse_dtype(kshard::dtype_name(t)) == t));  // name round-trips
  }
}

BOOST_AUTO_TEST_CASE(sizes_match_the_storage_types) {
  BOOST_CHECK(kshard::dtype_size(kshard::dtype_of<float>::value) == sizeof(float));
  BOOST_CHECK(kshard::dtype_size(kshard::dtype_of<double>::value) == sizeof(double));
  BOOST_CHECK(kshard::dtype_size(kshard::dtype_of<std::int32_t>::value) == sizeof(std::int32_t));
  BOOST_CHECK(kshard::dtype_size(kshard::dtype_of<std::int64_t>::value) == sizeof(std::int64_t));
  BOOST_CHECK(kshard::dtype_size(kshard::dtype_of<std::uint8_t>::value) == sizeof(std::uint8_t));
  BOOST_CHECK(kshard::dtype_size(kshard::dtype_of<kshard::bfloat16_t>::value) ==
             sizeof(kshard::bfloat16_t));
  BOOST_CHECK(kshard::dtype_size(kshard::dtype_of<kshard::float16_t>::value) ==
             sizeof(kshard::float16_t));
  BOOST_CHECK(kshard::dtype_size(kshard::dtype_of<kshard::float8_e4m3_t>::value) ==
             sizeof(kshard::float8_e4m3_t));
  BOOST_CHECK(kshard::dtype_size(kshard::dtype_of<kshard::float8_e5m2_t>::value) ==
             sizeof(kshard::float8_e5m2_t));
  static_assert(kshard::has_dtype<kshard::float8_e4m3_t>::value, "fp8 has a dtype");
  static_assert(!kshard::has_dtype<char>::value, "char has none");
  static_assert(!kshard::has_dtype<unsigned>::value, "unsigned has none");
}

BOOST_AUTO_TEST_CASE(parse_accepts_aliases_in_any_case) {
  using kshard::DType;
  const std::vector<std::pair<const char*, DType>> aliases{
      {"fp32", DType::f32},         {"float32", DType::f32},      {"FLOAT32", DType::f32},
      {"fp64", DType::f64},         {"float64", DType::f64},      {"int32", DType::i32},
      {"int64", DType::i64},        {"uint8", DType::u8},         {"bfloat16", DType::bf16},
      {"BF16", DType::bf16},        {"fp16", DType::f16},         {"float16", DType::f16},
      {"Float16", DType::f16},      {"fp8_e4m3", DType::e4m3},    {"float8_e4m3fn", DType::e4m3},
      {"E4M3", DType::e4m3},        {"fp8_e5m2", DType::e5m2},    {"float8_e5m2", DType::e5m2}};
  for (const auto& [name, t] : aliases) BOOST_CHECK_MESSAGE(kshard::parse_dtype(name) == t, name);
}

BOOST_AUTO_TEST_CASE(parse_rejects_unknown_names) {
  for (const char* bad : {"", "f8", "float", "int", " f32", "f32 ", "e4m3fnuz", "bf16x", "fp 16"}) {
    try {
      kshard::parse_dtype(bad);
      BOOST_ERROR("parse_dtype accepted '" << bad << "'");
    } catch (const kshard::Error& e) {
      BOOST_CHECK(e.problem().find(std::string("'") + bad + "'") != std::string::npos);
      BOOST_CHECK(e.expected().find("bf16") != std::string::npos);
      BOOST_CHECK(std::string(e.what()).find("expected") != std::string::npos);
    }
  }
}

BOOST_AUTO_TEST_CASE(fp8_is_storage_only_for_reductions) {
  for (const auto& [t, size] : all_dtypes) {
    const bool fp8 = t == kshard::DType::e4m3 || t == kshard::DType::e5m2;
    BOOST_CHECK_MESSAGE(kshard::dtype_reducible(t) == !fp8, kshard::dtype_name(t));
  }
}

BOOST_AUTO_TEST_SUITE_END()
