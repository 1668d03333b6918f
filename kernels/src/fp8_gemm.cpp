#include "kshard/kernels/fp8_gemm.hpp"

#include <string>

#include <Kokkos_Core.hpp>

#include "kshard/compat/for_each.hpp"
#include "kshard/kernels/fp8_blockwise.hpp"
#include "kshard/error.hpp"
#include "kshard/numeric/convert.hpp"
#include "pointwise.hpp"

namespace kshard {
namespace {

std::string shape(std::int64_t m, std::int64_t n, std::int64_t k) {
  return "m=" + std::to_string(m) + ", n=" + std::to_string(n) + ", k=" + std::to_string(k);
}

template <class TC>
void check(std::int64_t m, std::int64_t n, std::int64_t k, const Fp8Operand& a,
           const Fp8Operand& b, const TC* c, const Fp8GemmOptions& opt) {
  constexpr bool f32 = std::is_same_v<TC, float>;
  const std::string who = std::string("fp8_gemm_tn (") + (f32 ? "f32" : "bf16") + " C, " +
                          shape(m, n, k) + ")";
  if (!fp8_gemm_supported(m, n, k))
    throw Error(who, "m, n, k positive multiples of 16 (fp8_gemm_supported)");
  if (!a.data || !b.data || !a.scale_inv || !b.scale_inv || !c)
    throw Error(who + " with a null operand, scale or output", "every pointer set");
  if (a.format == Fp8Format::e5m2 && b.format == Fp8Format::e5m2)
    throw Error(who + " with two E5M2 operands", "at least one E4M3 operand (fp8 tensor cores)");
  const bool blocks = a.scaling != Fp8ScaleMode::tensor || b.scaling != Fp8ScaleMode::tensor;
  if (blocks) {
    // cuBLASLt's block-scaled fp8 (sm_90): both operands block-scaled, E4M3,
    // not both 128x128, k whole blocks, exact accumulation.
    const bool both = a.scaling != Fp8ScaleMode::tensor && b.scaling != Fp8ScaleMode::tensor;
    if (!both || a.format != Fp8Format::e4m3 || b.format != Fp8Format::e4m3 ||
        (a.scaling == Fp8ScaleMode::block_128x128 && b.scaling == Fp8ScaleMode::block_128x128) ||
        k % kFp8Block != 0 || opt.fast_accum)
      throw Error(who + " with block scales (A " + std::to_string(int(a.scaling)) + ", B " +
                      std::to_string(int(b.scaling)) + ")" + (opt.fast_accum ? " and FAST_ACCUM" : ""),
                  "both operands E4M3 and block-scaled (1x128 x 1x128, 1x128 x 128x128 or "
                  "128x128 x 1x128), k a multiple of 128, fast_accum off");
  }
  if (opt.epilogue != Fp8Epilogue::none && (f32 || !opt.bias))
    throw Error(who + " with a bias epilogue" + (f32 ? " on an f32 output" : " and no bias"),
                "bias epilogues with a bf16 output and a bias pointer");
  if (opt.epilogue == Fp8Epilogue::bias_gelu && !opt.pre)
    throw Error(who + " with bias+GELU and no pre-activation output", "opt.pre set");
  if (!f32 && opt.beta != 0.0f)
    throw Error(who + " with beta " + std::to_string(opt.beta) + " on a bf16 output",
                "beta 0 (accumulating products go to an f32 output)");
}

// The epilogue as separate passes, where the backend has no fused one:
// c holds the product rounded to bf16.
void epilogue_passes(std::int64_t m, std::int64_t n, bfloat16_t* c, const Fp8GemmOptions& opt) {
  const bfloat16_t* bias = opt.bias;
  bfloat16_t* pre = opt.pre;
  const bool gelu = opt.epilogue == Fp8Epilogue::bias_gelu;
  compat::for_each_row("kshard::fp8_gemm_epilogue", m, n,
                       KOKKOS_LAMBDA(std::int64_t r, std::int64_t col) {
                         const std::int64_t i = r * n + col;
                         const float v = to_float(c[i]) + to_float(bias[col]);
                         if (gelu) {
                           pre[i] = from_float<bfloat16_t>(v);
                           c[i] = from_float<bfloat16_t>(detail::pointwise::gelu(v));
                         } else {
                           c[i] = from_float<bfloat16_t>(v);
                         }
                       });
}

}  // namespace

bool fp8_gemm_supported(std::int64_t m, std::int64_t n, std::int64_t k) noexcept {
  return m > 0 && n > 0 && k > 0 && m % 16 == 0 && n % 16 == 0 && k % 16 == 0;
}

bool fp8_gemm_available(std::string* why, bool blocks) {
  return detail::fp8_gemm_backend_available(why, blocks);
}

void fp8_gemm_tn(std::int64_t m, std::int64_t n, std::int64_t k, const Fp8Operand& a,
                 const Fp8Operand& b, bfloat16_t* c, const Fp8GemmOptions& opt) {
  check(m, n, k, a, b, c, opt);
  if (detail::fp8_gemm_backend(m, n, k, a, b, c, opt)) return;
  Fp8GemmOptions plain = opt;
  plain.epilogue = Fp8Epilogue::none;
  if (!detail::fp8_gemm_backend(m, n, k, a, b, c, plain))
    throw Error("fp8_gemm_tn (" + shape(m, n, k) + "): the backend has no kernel",
                "a cuBLASLt fp8 algorithm for a supported shape");
  epilogue_passes(m, n, c, opt);
}

void fp8_gemm_tn(std::int64_t m, std::int64_t n, std::int64_t k, const Fp8Operand& a,
                 const Fp8Operand& b, float* c, const Fp8GemmOptions& opt) {
  check(m, n, k, a, b, c, opt);
  if (!detail::fp8_gemm_backend(m, n, k, a, b, c, opt))
    throw Error("fp8_gemm_tn (f32 C, " + shape(m, n, k) + "): the backend has no kernel",
                "a cuBLASLt fp8 algorithm for a supported shape");
}

}  // namespace kshard
