#include "wire_format.hpp"

#include "kshard/error.hpp"

namespace kshard::detail {

WireFormat make_wire_format(const ShardContext& c, bool keep_low_precision_shard) {
  const Recipe& r = c.recipe;
  WireFormat w;
  switch (r.gather_dtype) {
    case DType::f32:
      w.gather = make_f32_gather();
      break;
    case DType::bf16:
    case DType::f16:
      w.gather = make_16bit_gather(c, keep_low_precision_shard);
      break;
    case DType::e4m3:
      w.gather = make_fp8_gather(c);
      break;
    default:
      throw Error("recipe '" + r.name + "' gathers " + dtype_name(r.gather_dtype),
                  "f32, bf16, f16 or e4m3");
  }
  switch (r.reduce_dtype) {
    case DType::f32:
      w.reduce = make_f32_reduce();
      break;
    case DType::bf16:
    case DType::f16:
      w.reduce = make_16bit_reduce(r.reduce_dtype);
      break;
    default:
      throw Error("reduce dtype " + std::string(dtype_name(r.reduce_dtype)), "f32, bf16 or f16");
  }
  return w;
}

}  // namespace kshard::detail
