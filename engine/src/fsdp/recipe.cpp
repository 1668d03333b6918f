#include "kshard/engine/fsdp/recipe.hpp"

#include "kshard/error.hpp"

namespace kshard {

Recipe Recipe::parse(const std::string& name, bool fp8_init) {
  Recipe r;
  r.name = name;
  if (name == "fp32") {
  } else if (name == "bf16") {
    r.gather_dtype = DType::bf16;
    r.compute_dtype = DType::bf16;
  } else if (name == "fp16") {
    r.gather_dtype = DType::f16;
    r.compute_dtype = DType::f16;
    r.reduce_dtype = DType::f16;
    r.loss_scaling = true;
  } else if (name == "fp8") {
    r.gather_dtype = DType::e4m3;
    r.compute_dtype = DType::bf16;
  } else if (name == "fp8-current") {
    r.gather_dtype = DType::bf16;
    r.compute_dtype = DType::bf16;
    r.fp8_compute.scaling = Fp8Scaling::current;
  } else if (name == "fp8-delayed") {
    r.gather_dtype = DType::bf16;
    r.compute_dtype = DType::bf16;
    r.fp8_compute.scaling = Fp8Scaling::delayed;
  } else if (name == "fp8-block") {
    r.gather_dtype = DType::bf16;
    r.compute_dtype = DType::bf16;
    r.fp8_compute.scaling = Fp8Scaling::block;
  } else {
    throw Error("unknown recipe '" + name + "'",
                "one of fp32, bf16, fp16, fp8, fp8-current, fp8-delayed, fp8-block");
  }
  if (fp8_init && !r.is_fp8())
    throw Error("fp8_init with recipe '" + name + "'", "fp8_init only with the fp8 recipe");
  r.fp8_init = fp8_init;
  return r;
}

std::string Recipe::describe() const { return fp8_init ? name + "+fp8_init" : name; }

}  // namespace kshard
