#pragma once
// cuDNN's fused attention (cuDNN 9 SDPA through the header-only cuDNN
// frontend) as one implementation of flash_attention_forward/backward for the
// 16-bit types on CUDA. Private to the engine; flash_attention_cuda.cpp
// decides when it runs.
//
// Why: on the H200 the SDPA engines of cuDNN 9 are Hopper kernels (wgmma,
// TMA) that kshard's own mma.sync kernel (sm_80 instructions) does not match;
// the kernel stays as the fallback for shapes or cuDNN versions cuDNN
// declines, and as the reference the tests compare against.
//
// Same layouts and results as flash_attention.hpp: q, k, v are read in place
// from the packed qkv (strides, no copies), ctx and dqkv are written in place,
// lse is cuDNN's "Stats" (natural-log log-sum-exp of the scaled masked scores
// per query row, f32), so either backward can follow either forward. The
// backward is cuDNN's deterministic algorithm (dP through a workspace, no
// atomics): the same inputs give bitwise the same gradients.
//
// Graphs are built once per (dtype, batch, seq, d, heads) and cached with a
// device workspace that only grows ("kshard.cache:" label: long-lived, not a
// leak); after the first step nothing is built or allocated. Everything is
// released in Kokkos::finalize.
#include "kshard/engine/flash_attention.hpp"

namespace kshard::detail {

/// Whether cuDNN runs forward (backward == false) or backward for these
/// arguments: T 16-bit, head dim a multiple of 8 up to 128, aligned pointers,
/// and the graph built (the first call per shape builds it; a shape cuDNN
/// declines is remembered and answered false without trying again).
template <class T>
bool cudnn_attention_serves(const FlashArgs<T>& a, bool backward);

/// Run the cached graph (cudnn_attention_serves must have said true) on the
/// Kokkos default stream.
template <class T>
void cudnn_attention_forward(const FlashArgs<T>& a);
template <class T>
void cudnn_attention_backward(const FlashArgs<T>& a);

/// Why the last shape cuDNN declined was declined (empty when none was).
const char* cudnn_attention_last_decline() noexcept;

}  // namespace kshard::detail
