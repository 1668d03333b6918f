#pragma once
// kshard's exact-f32 fused causal attention kernels for CUDA (SIMT FP32 FMA,
// no TF32): flash_attention_f32_cuda.cpp. Called by the CUDA backend
// (flash_attention_cuda.cpp) for T = float where flash_f32_serves says so.
// The includer provides cudaStream_t (<cuda_runtime.h>, or the host
// emulation's shim in tests/layers/flash_cuda_emulation/).
#include "kshard/kernels/flash_attention.hpp"

namespace kshard::detail {

/// Whether the f32 kernels serve these arguments: head dim 64 or 128,
/// 16-byte aligned pointers, at most 65535 tiles of 64 rows, and the
/// kernels' shared memory within the current GPU's per-block limit.
bool flash_f32_serves(const FlashArgs<float>& a);

/// Forward (ctx, lse) and backward (delta, then dqkv) on `stream`, not fenced.
void flash_f32_forward(const FlashArgs<float>& a, cudaStream_t stream);
void flash_f32_backward(const FlashArgs<float>& a, cudaStream_t stream);

}  // namespace kshard::detail
