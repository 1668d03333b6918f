#pragma once
// cuDNN's fused attention (cuDNN 9 SDPA through the header-only cuDNN
// frontend) as one implementation of flash_attention_forward/backward for the
// 16-bit types on CUDA. Private to the engine; flash_attention_cuda.cpp
// decides when it runs and owns the workspace (a Kokkos View, so the memory
// tracker sees it).
//
// Why: on the H200 the SDPA engines of cuDNN 9 are Hopper kernels (wgmma,
// TMA) that kshard's own mma.sync kernel (sm_80 instructions) does not match;
// the kernel stays as the fallback for shapes or cuDNN versions cuDNN
// declines, and as the reference the tests compare against.
//
// This header and its .cpp include no Kokkos: the .cpp has no device code and
// is compiled by the host compiler alone (nvcc's front end rejected the
// structured bindings the frontend's API invites; the host compiler also
// warns about what nvcc let pass, such as a missing return that cost a device
// run here).
//
// Same layouts and results as flash_attention.hpp: q, k, v are read in place
// from the packed qkv (strides, no copies), ctx and dqkv are written in place,
// lse is cuDNN's "Stats" (natural-log log-sum-exp of the scaled masked scores
// per query row, f32), so either backward can follow either forward. The
// backward is cuDNN's deterministic algorithm (dP through a workspace, no
// atomics): the same inputs give bitwise the same gradients.
// Graphs are built once per (dtype, batch, seq, d, heads, direction) and
// cached; after the first step nothing is built.
#include <cuda_runtime_api.h>

#include <cstdint>

namespace kshard::detail {

struct CudnnAttentionArgs {
  bool f16 = false;  // float16_t, else bfloat16_t
  std::int64_t batch = 0, seq = 0, d = 0, heads = 0;
  const void* qkv = nullptr;
  const void* ctx = nullptr;   // backward
  const void* dctx = nullptr;  // backward
  void* out = nullptr;         // forward: ctx; backward: dqkv
  float* lse = nullptr;        // forward: written
  const float* lse_in = nullptr;  // backward: read
};

/// Whether cuDNN runs forward (backward == false) or backward for these
/// arguments (head dim a multiple of 8 up to 128, 16-byte-aligned pointers,
/// the graph built: the first call per shape builds it; a declined shape is
/// remembered and answered false without trying again). *workspace_bytes gets
/// what the graph needs.
bool cudnn_attention_serves(const CudnnAttentionArgs& a, bool backward,
                            std::int64_t* workspace_bytes);

/// Runs the cached graph (cudnn_attention_serves said true) on `stream` with
/// a workspace of at least the bytes it reported. Throws kshard::Error.
void cudnn_attention_run(const CudnnAttentionArgs& a, bool backward, cudaStream_t stream,
                         void* workspace);

/// Destroys the graphs and the handle (Kokkos::finalize, CUDA still alive).
void cudnn_attention_release();

}  // namespace kshard::detail
