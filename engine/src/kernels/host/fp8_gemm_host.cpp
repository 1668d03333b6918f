// Host backend of fp8_gemm.hpp: an emulation of the device's fp8 GEMM with
// the same operands and rounding points. fp8 values and power-of-two scales
// are exact in f32, so the f32 GEMM of the decoded operands sums the same
// products the tensor cores do; the scales multiply the f32 sum, the epilogue
// (bias, GELU) runs on the f32 value, and C is rounded once, as cuBLASLt's
// epilogue does. Only the order of the f32 summation differs from the device.
#include <Kokkos_Core.hpp>

#include "kshard/compat/for_each.hpp"
#include "kshard/engine/kernels/fp8_gemm.hpp"
#include "kshard/engine/kernels/gemm.hpp"
#include "kshard/numeric/convert.hpp"
#include "../pointwise.hpp"

namespace kshard::detail {
namespace {

Kokkos::View<float*> decode(const Fp8Operand& x, std::int64_t n, const char* label) {
  Kokkos::View<float*> out(Kokkos::view_alloc(std::string(label), Kokkos::WithoutInitializing),
                           std::size_t(n));
  if (x.format == Fp8Format::e4m3) {
    const auto* q = static_cast<const float8_e4m3_t*>(x.data);
    compat::for_each_index(label, n, KOKKOS_LAMBDA(std::int64_t i) { out(i) = to_float(q[i]); });
  } else {
    const auto* q = static_cast<const float8_e5m2_t*>(x.data);
    compat::for_each_index(label, n, KOKKOS_LAMBDA(std::int64_t i) { out(i) = to_float(q[i]); });
  }
  return out;
}

template <class TC>
void emulate(std::int64_t m, std::int64_t n, std::int64_t k, const Fp8Operand& a,
             const Fp8Operand& b, TC* c, const Fp8GemmOptions& opt) {
  auto fa = decode(a, m * k, "kshard::fp8_gemm_host::a");
  auto fb = decode(b, n * k, "kshard::fp8_gemm_host::b");
  Kokkos::View<float*> acc(Kokkos::view_alloc(std::string("kshard::fp8_gemm_host::acc"),
                                              Kokkos::WithoutInitializing),
                           std::size_t(m * n));
  gemm<float, float>(Trans::N, Trans::T, m, n, k, 1.0f, fa, fb, 0.0f, acc);
  const float scale = *a.scale_inv * *b.scale_inv;
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
bool fp8_gemm_backend_available(std::string*) { return true; }

}  // namespace kshard::detail
