#pragma once
// fp8 tensor-core GEMM with per-tensor scales: the three products of an fp8
// Linear (forward, dgrad, wgrad) in one "TN" form, both operands stored with
// the reduction dimension contiguous (what Hopper's fp8 tensor cores read):
//
//   C[m, n] = scale_a * scale_b * (A[m, k] . B[n, k]^T)  (+ bias[n])  + beta * C
//
//   forward  y [rows, out] = x [rows, in]   . W [out, in]^T
//   dgrad    dx[rows, in]  = dy[rows, out]  . (W^T)[in, out]^T
//   wgrad    dW[out, in]  += (dy^T)[out, rows] . (x^T)[in, rows]^T   (C f32, beta 1)
//
// A and B are row-major, packed, E4M3 or E5M2 (not both E5M2), each with f32
// dequantization scales in device memory: one per tensor (fp8_tensor.hpp's
// Fp8Scale), or one per 1x128 block along k or per 128x128 tile
// (fp8_blockwise.hpp's layouts; E4M3 only, k a multiple of 128, not both
// 128x128, no FAST_ACCUM: cuBLASLt's VEC128_32F / BLK128x128_32F on sm_90);
// products accumulate in f32; C is bf16 or f32. Epilogues for bf16 C: the bias
// (bf16 [n]) and bias + GELU (tanh), which also writes the pre-activation
// (what a Linear's forward_gelu needs); where a backend has no fused epilogue
// the same result is made by separate kernels.
//
// CUDA: one cuBLASLt matmul (sm_89 and newer; FAST_ACCUM as chosen: TE runs
// the forward with it and the backward GEMMs without). Host: an emulation with
// the device's operands and rounding points (fp8 values and power-of-two scales
// exact in f32, an f32 GEMM, the scales applied to the f32 sum, C rounded once),
// so host tests cover the fp8 numerics. Only the summation order differs.
//
// Shapes: fp8_gemm_supported(m, n, k) (multiples of 16, cuBLASLt's fp8 rule,
// kept on the host too so both backends take the same path); elsewhere the
// caller computes in bf16. Bad sizes throw kshard::Error before anything runs.
#include <cstdint>
#include <string>

#include "kshard/kernels/fp8_tensor.hpp"
#include "kshard/numeric/types.hpp"

namespace kshard {

/// How an operand's dequantization scales cover it.
enum class Fp8ScaleMode {
  tensor,       ///< one scale
  block_1x128,  ///< one per 128 consecutive elements along k
  block_128x128 ///< one per 128 x 128 tile
};

struct Fp8Operand {
  const void* data = nullptr;         ///< row-major [rows, k], packed
  Fp8Format format = Fp8Format::e4m3;
  const float* scale_inv = nullptr;   ///< device: the dequantization multiplier(s)
  Fp8ScaleMode scaling = Fp8ScaleMode::tensor;
};

enum class Fp8Epilogue { none, bias, bias_gelu };

struct Fp8GemmOptions {
  float beta = 0.0f;                   ///< C = product + beta * C (f32 C only)
  Fp8Epilogue epilogue = Fp8Epilogue::none;
  const bfloat16_t* bias = nullptr;    ///< [n], for bias / bias_gelu
  bfloat16_t* pre = nullptr;           ///< [m, n] pre-activation, for bias_gelu
  bool fast_accum = false;             ///< cuBLASLt FAST_ACCUM (forward GEMMs)
};

bool fp8_gemm_supported(std::int64_t m, std::int64_t n, std::int64_t k) noexcept;

/// True when this build's fp8 GEMMs run on tensor cores the device has
/// (CUDA: compute capability 8.9 or newer; with `blocks`, the block-scaled
/// ones: 9.0, where cuBLASLt has VEC128_32F / BLK128x128_32F); the host
/// emulation is always available. `why` gets the device name and capability
/// when false.
bool fp8_gemm_available(std::string* why = nullptr, bool blocks = false);

void fp8_gemm_tn(std::int64_t m, std::int64_t n, std::int64_t k, const Fp8Operand& a,
                 const Fp8Operand& b, bfloat16_t* c, const Fp8GemmOptions& opt = {});
void fp8_gemm_tn(std::int64_t m, std::int64_t n, std::int64_t k, const Fp8Operand& a,
                 const Fp8Operand& b, float* c, const Fp8GemmOptions& opt = {});

namespace detail {
// Backends (host/fp8_gemm_host.cpp, cuda/fp8_gemm_cublaslt.cpp), called with
// validated arguments. Return false when the backend has no kernel for the
// epilogue asked for (the front end then runs it as separate kernels).
bool fp8_gemm_backend(std::int64_t m, std::int64_t n, std::int64_t k, const Fp8Operand& a,
                      const Fp8Operand& b, bfloat16_t* c, const Fp8GemmOptions& opt);
bool fp8_gemm_backend(std::int64_t m, std::int64_t n, std::int64_t k, const Fp8Operand& a,
                      const Fp8Operand& b, float* c, const Fp8GemmOptions& opt);
bool fp8_gemm_backend_available(std::string* why, bool blocks);
}  // namespace detail

}  // namespace kshard
