#pragma once
// Fused causal multi-head attention (FlashAttention-2 style): the same
// function as kshard::detail::causal_attention_forward/backward (nn/attention.hpp)
// without ever storing the [batch, heads, seq, seq] scores or probabilities.
//
// Layouts (as in CausalSelfAttention):
//   qkv  [batch*seq, 3d] row-major: columns [0,d) q, [d,2d) k, [2d,3d) v;
//        head h uses columns [h*hd, (h+1)*hd) of each, hd = d / heads
//   ctx  [batch*seq, d]: head h in columns [h*hd, (h+1)*hd)
//   lse  [batch*heads*seq] (index (b*heads + h)*seq + i): log-sum-exp of the
//        scaled masked scores of query row i, log sum_{j<=i} exp(q_i.k_j / sqrt(hd))
//
// The forward pass streams key tiles through an online softmax and keeps only
// lse per query row (O(B*H*T) saved state); the backward pass recomputes the
// probabilities from lse. Backward is deterministic (no atomics): one pass per
// key tile writes dK and dV, a second pass per query tile writes dQ, so the
// same inputs give bitwise the same gradients on every run.
//
// T is float, double, bfloat16_t or float16_t. Scores, softmax statistics and
// every dot product accumulate in accum_t<T> (f32 for the 16-bit types);
// results are rounded to T once (round-to-nearest-even).
//
//   using A = kshard::accum_t<T>;
//   Kokkos::View<A*> lse("lse", kshard::flash_attention_rows(batch, seq, heads));
//   Kokkos::View<A*> delta("delta", kshard::flash_attention_rows(batch, seq, heads));
//   kshard::flash_attention_forward<T>(qkv, ctx, lse, batch, seq, d, heads);
//   ...
//   kshard::flash_attention_backward<T>(qkv, ctx, dctx, lse, dqkv, batch, seq, d, heads,
//                                       delta);
//
// Backends: CUDA builds run bfloat16_t/float16_t through cuDNN's fused
// attention when built with the cuDNN frontend (head dims multiple of 8 up to
// 128; kernels/src/cuda/flash_attention_cudnn.cpp), else with head dims
// 64 and 128 on kshard's tensor-core kernel (mma.sync, kernels/src/cuda/),
// float with head dims 64 and 128 on kshard's exact-f32 SIMT kernel (FP32
// FMA, no TF32; kernels/src/cuda/flash_attention_f32_cuda.cpp), and
// everything else on the portable Kokkos kernel (blocked, one team per
// (batch, head, tile)); host builds run query blocks of 64 rows through the
// BLAS (kernels/src/host/).
// Kernels run on the default execution space instance (on CUDA its stream)
// and are not fenced: order with Kokkos as usual.
#include <cstdint>

#include <Kokkos_Core.hpp>

#include "kshard/numeric/compute.hpp"

namespace kshard {

/// Rows of the per-query-row state (lse, delta): batch * heads * seq.
inline std::int64_t flash_attention_rows(std::int64_t batch, std::int64_t seq,
                                         std::int64_t heads) {
  return batch * heads * seq;
}

/// ctx (written: every element) and lse (written: the first batch*heads*seq
/// elements) from qkv. Throws kshard::Error before anything runs when a size
/// is not positive, d is not a multiple of heads, or a View is too small.
template <class T>
void flash_attention_forward(Kokkos::View<const T*> qkv, Kokkos::View<T*> ctx,
                             Kokkos::View<accum_t<T>*> lse, std::int64_t batch, std::int64_t seq,
                             std::int64_t d, std::int64_t heads);

/// dqkv (written: every element of all of the q, k and v parts) from dctx,
/// given the forward's qkv, ctx and lse. delta is a workspace of at least
/// flash_attention_rows(batch, seq, heads) elements (overwritten with
/// rowsum(dctx * ctx) per head; the caller owns it so that no call allocates).
template <class T>
void flash_attention_backward(Kokkos::View<const T*> qkv, Kokkos::View<const T*> ctx,
                              Kokkos::View<const T*> dctx, Kokkos::View<const accum_t<T>*> lse,
                              Kokkos::View<T*> dqkv, std::int64_t batch, std::int64_t seq,
                              std::int64_t d, std::int64_t heads,
                              Kokkos::View<accum_t<T>*> delta);

namespace detail {

/// Validated arguments of one call (pointers into default memory space).
template <class T>
struct FlashArgs {
  const T* qkv = nullptr;
  const T* ctx = nullptr;   // backward
  const T* dctx = nullptr;  // backward
  T* out = nullptr;         // forward: ctx; backward: dqkv
  accum_t<T>* lse = nullptr;        // forward: written
  const accum_t<T>* lse_in = nullptr;  // backward: read
  accum_t<T>* delta = nullptr;      // backward workspace
  std::int64_t batch = 0, seq = 0, d = 0, heads = 0;
  std::int64_t head_dim() const { return d / heads; }
};

// Backend entry points: kernels/src/host/ (blocked GEMM) or kernels/src/cuda/
// (tensor cores for the 16-bit types at head dims 64/128, else portable).
template <class T>
void flash_attention_forward_backend(const FlashArgs<T>& a);
template <class T>
void flash_attention_backward_backend(const FlashArgs<T>& a);

// The portable Kokkos kernels (kernels/src/flash_attention.cpp), callable on
// every build so that the tests check them wherever the backend differs.
template <class T>
void flash_attention_forward_portable(const FlashArgs<T>& a);
template <class T>
void flash_attention_backward_portable(const FlashArgs<T>& a);

/// Which implementation the backend runs for these arguments: "cuDNN",
/// "tensor cores", "f32 kernel", "portable kernel" (CUDA builds) or "host
/// blocked GEMM" (host builds).
template <class T>
const char* flash_attention_path(const FlashArgs<T>& a);

/// Whether a CUDA build may hand 16-bit attention to the vendor library
/// (cuDNN's fused attention, when built with it) before kshard's own
/// tensor-core kernel. Default true; KSHARD_CUDNN_ATTENTION=0 in the
/// environment makes it false. Tests switch it to check both paths; host
/// builds ignore it.
void set_vendor_attention_enabled(bool enabled) noexcept;
bool vendor_attention_enabled() noexcept;

}  // namespace detail

}  // namespace kshard
