// Host backend of fp8_gemm.hpp: an emulation of the device's fp8 GEMM with
// the same operands and rounding points. fp8 values and power-of-two scales
// are exact in f32, so the f32 GEMM of the decoded operands (block scales
// applied in the decode) sums the same products the tensor cores do; the scales multiply the f32 sum, the epilogue
// (bias, GELU) runs on the f32 value, and C is rounded once, as cuBLASLt's
// epilogue does. Only the order of the f32 summation differs from the device.
#include <Kokkos_Core.hpp>

#include "kshard/compat/for_each.hpp"
#include "kshard/kernels/fp8_blockwise.hpp"
#include "kshard/kernels/fp8_gemm.hpp"
#include "kshard/kernels/gemm.hpp"
#include "kshard/numeric/convert.hpp"
#include "../pointwise.hpp"

namespace kshard::detail {
namespace {

// The operand's values as f32: per tensor the fp8 values alone (the scale
// multiplies the f32 sum, as cuBLASLt applies it); block-scaled ones times
// their block's scale (exact: both are powers of two times fp8 values), so
// the sum is the same as the tensor cores' blockwise one up to its order.
template <class Fp8>
void decode_into(const Fp8Operand& x, std::int64_t rows, std::int64_t k, Kokkos::View<float*> out,
                 const char* label) {
  const auto* q = static_cast<const Fp8*>(x.data);
  const float* s = x.scale_inv;
  const Fp8ScaleMode mode = x.scaling;
  const std::int64_t ld = fp8_block_scale_ld(k);
  compat::for_each_row(label, rows, k, KOKKOS_LAMBDA(std::int64_t r, std::int64_t c) {
    const std::int64_t i = r * k + c;
    float scale = 1.0f;
    if (mode == Fp8ScaleMode::block_1x128)
      scale = s[(c / kFp8Block) * rows + r];
    else if (mode == Fp8ScaleMode::block_128x128)
      scale = s[(r / kFp8Block) * ld + c / kFp8Block];
    out(i) = to_float(q[i]) * scale;
  });
}

Kokkos::View<float*> decode(const Fp8Operand& x, std::int64_t rows, std::int64_t k,
                            const char* label) {
  Kokkos::View<float*> out(Kokkos::view_alloc(std::string(label), Kokkos::WithoutInitializing),
                           std::size_t(rows * k));
  if (x.format == Fp8Format::e4m3)
    decode_into<float8_e4m3_t>(x, rows, k, out, label);
  else
    decode_into<float8_e5m2_t>(x, rows, k, out, label);
  return out;
}

template <class TC>
void emulate(std::int64_t m, std::int64_t n, std::int64_t k, const Fp8Operand& a,
             const Fp8Operand& b, TC* c, const Fp8GemmOptions& opt) {
  auto fa = decode(a, m, k, "kshard::fp8_gemm_host::a");
  auto fb = decode(b, n, k, "kshard::fp8_gemm_host::b");
  Kokkos::View<float*> acc(Kokkos::view_alloc(std::string("kshard::fp8_gemm_host::acc"),
                                              Kokkos::WithoutInitializing),
                           std::size_t(m * n));
  gemm<float, float>(Trans::N, Trans::T, m, n, k, 1.0f, fa, fb, 0.0f, acc);
  const float scale = (a.scaling == Fp8ScaleMode::tensor ? *a.scale_inv : 1.0f) *
                      (b.scaling == Fp8ScaleMode::tensor ? *b.scale_inv : 1.0f);
  const Fp8GemmOptions o = opt;
  compat::for_each_row("kshard::fp8_gemm_host::epilogue", m, n,
                       KOKKOS_LAMBDA(std::int64_t r, std::int64_t col) {
                         const std::int64_t i = r * n + col;
                         float v = acc(i) * scale;
                         if constexpr (std::is_same_v<TC, float>) {
                           c[i] = o.beta == 0.0f ? v : v + o.beta * c[i];
                         } else {
                           if (o.epilogue != Fp8Epilogue::none) v += to_float(o.bias[col]);
                           if (o.epilogue == Fp8Epilogue::bias_gelu) {
                             o.pre[i] = from_float<bfloat16_t>(v);
                             v = pointwise::gelu(v);
                           }
                           c[i] = from_float<bfloat16_t>(v);
                         }
                       });
  Kokkos::fence();
}

}  // namespace

bool fp8_gemm_backend(std::int64_t m, std::int64_t n, std::int64_t k, const Fp8Operand& a,
                      const Fp8Operand& b, bfloat16_t* c, const Fp8GemmOptions& opt) {
  emulate(m, n, k, a, b, c, opt);
  return true;
}
bool fp8_gemm_backend(std::int64_t m, std::int64_t n, std::int64_t k, const Fp8Operand& a,
                      const Fp8Operand& b, float* c, const Fp8GemmOptions& opt) {
  emulate(m, n, k, a, b, c, opt);
  return true;
}
bool fp8_gemm_backend_available(std::string*, bool) { return true; }

}  // namespace kshard::detail
