// Exact-f32 fused causal attention for CUDA: plain FP32 FMA on the CUDA cores
// (no TF32, no 3xTF32), the FlashAttention-2 algorithm of the portable kernel
// (kernels/src/flash_attention.cpp) with SIMT register tiling. Head
// dims 64 and 128; everything else stays on the portable kernel.
//
// Every product is a 64 x 64 (or 64 x HD) tile from operands in shared memory,
// 256 threads per block. A thread owns R rows of a product's result and
// columns of the form 16 j + cg (mm_nt) or 64 v + 4 cg + j (mm_nn), cg = tid % 16:
//   mm_nt (C = A B^T, reduction index contiguous in both, e.g. S = Q K^T):
//     per 4 reduction steps R + 4 float4 loads feed 16 R FMAs; a half-warp
//     reads 16 rows of B at one column, which padding (rows of HD + 4 floats)
//     or a swizzle (mm_nt_sw) spreads over the banks: 2 wavefronts;
//   mm_nn (C += A B, B row-major [k][n], e.g. O += P V): a half-warp reads
//     256 contiguous bytes of B per step.
// A's rows are shared by the 16 threads of a half-warp (broadcast).
// The forward: R = 4 over all 256 threads (rows 4 rg + i, rg = tid / 16), so
// a row's online-softmax statistics live in one half-warp (shuffles) and the
// rescale of O is thread-local.
// The backward (where the time goes: 7 products to the forward's 2): the
// block is two 128-thread groups (warps 0-3, 4-7) each on its own product
// side by side, with R = 8 (rows rg + 8 i, rg = tid % 128 / 16): 8 x 4 tiles
// for the 64 x 64 products and 8 x 8 (hd 128) for dV, dK: 1.3x and 1.5x the
// FMAs per shared load of the 4 x 4 and 4 x 8 tiles before, which left the products bound by shared
// memory. The groups' neighbouring rows (rg, rg + 1 in one warp) sit in
// different banks.
//
// Kernels (grid = (batch*heads, 64-row tiles); every tile and chunk is 64 rows):
//   forward  block = query tile, longest causal rows first; key tiles 0..qb
//            (only the diagonal one masked) through an online softmax; P goes
//            through shared memory (over the K tile, which S no longer needs)
//            to become the A operand of O += P V.
//   delta    delta = rowsum(dO * O) per (token, head).
//   dK, dV   block = key tile (tile 0, which every query sees, first); query
//            chunks from the diagonal on. Group 0: S^T = K Q^T -> P^T (shared),
//            then dV += P^T dO; group 1: dP^T = V dO^T, then (after P^T is
//            there) dS^T = P^T (dP^T - delta) (shared), then dK += dS^T Q.
//   dQ       block = query tile, longest first; key chunks 0..qb. Group 0:
//            S -> P (shared); group 1: dP, then dS = P (dP - delta) in place;
//            then dQ += dS K (hd 128: each group half the columns, R = 8; hd
//            64: all threads, R = 4).
// Loads: the forward's and the tiles a backward block keeps (dK/dV: K, V;
// dQ: Q, dO) are loaded synchronously (float4, zero past seq). The backward streams its
// chunks (dK/dV: Q, dO; dQ: K, V) with cp.async; at hd 128 (one block per
// SM: nothing else covers the loads) into two buffers, chunk n + 1 arriving
// while chunk n is worked on. To fit dK/dV's two Q and two dO buffers (226
// KiB of the 227 an H100/H200 block may have), those and P^T / dS^T are
// swizzled instead of padded (load_tile_async, mm_nt_sw, pt_index, mm_nn_sw).
// hd 64 keeps one buffer and fits two blocks per SM, which cover each
// other's loads.
// Determinism: no atomics; each output element is written by one thread, and
// every sum runs in a fixed order (the reduction index in order, as the
// portable kernel), so results are bitwise reproducible.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>

#include "flash_attention_f32_cuda.hpp"
#include "kshard/error.hpp"
#include "cp_async.hpp"
#include "launch.hpp"

namespace kshard::detail {
namespace {

constexpr int kThreads = 256;
constexpr int kTile = 64;  // rows of every tile and chunk
constexpr int kPad = 4;    // floats of padding per shared-memory row (keeps float4 alignment)
constexpr float kLog2e = 1.4426950408889634f;

extern __shared__ __align__(16) unsigned char flash_smem[];

struct FwdParams {
  const float* qkv;
  float* ctx;
  float* lse;
  std::int64_t seq, d, heads;
  float scale, scale_log2;
};

struct BwdParams {
  const float* qkv;
  const float* ctx;
  const float* dout;
  const float* lse;
  float* delta;
  float* dqkv;
  std::int64_t seq, d, heads;
  float scale, scale_log2;
};

using namespace ptx;  // cp.async wrappers (cp_async.hpp)

// --- tiles and products -----------------------------------------------------

/// c + a.x b.x + a.y b.y + a.z b.z + a.w b.w, one FMA after the other in
/// that order (the fixed order every product keeps, for determinism).
__device__ __forceinline__ float dot4_acc(float4 a, float4 b, float c) {
  c = fmaf(a.x, b.x, c);
  c = fmaf(a.y, b.y, c);
  c = fmaf(a.z, b.z, c);
  return fmaf(a.w, b.w, c);
}

__device__ __forceinline__ float4 ld4(const float* p) {
  return *reinterpret_cast<const float4*>(p);
}
__device__ __forceinline__ void st4(float* p, float4 v) { *reinterpret_cast<float4*>(p) = v; }
__device__ __forceinline__ float elem(const float4& v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

/// kTile x HD floats from global rows of stride ld into shared rows of stride
/// HD + kPad; rows >= valid are zero (nothing past the sequence is read).
template <int HD>
__device__ __forceinline__ void load_tile(float* dst, const float* src, std::int64_t ld,
                                          std::int64_t valid, int tid) {
  constexpr int kVecs = HD / 4;
#pragma unroll
  for (int c = tid; c < kTile * kVecs; c += kThreads) {
    const int r = c / kVecs, col = (c % kVecs) * 4;
    const float4 v = r < valid ? ld4(src + r * ld + col) : make_float4(0.f, 0.f, 0.f, 0.f);
    st4(dst + r * (HD + kPad) + col, v);
  }
}

/// load_tile through cp.async (the caller commits and waits). SW: rows of
/// exactly HD floats, 16-byte column c4 of row r stored at column c4 ^ (r & 7)
/// (see mm_nt_sw); else rows of HD + kPad floats.
template <int HD, bool SW>
__device__ __forceinline__ void load_tile_async(float* dst, const float* src, std::int64_t ld,
                                                std::int64_t valid, int tid) {
  constexpr int kVecs = HD / 4, LD = SW ? HD : HD + kPad;
#pragma unroll
  for (int c = tid; c < kTile * kVecs; c += kThreads) {
    const int r = c / kVecs, c4 = c % kVecs;
    const bool ok = r < valid;
    cp_async16(dst + r * LD + 4 * (SW ? c4 ^ (r & 7) : c4), src + (ok ? r * ld + 4 * c4 : 0), ok);
  }
}

/// acc[i][j] = sum_{k < K} A[row(i)][k] B[16 j + cg][k] (A, B row-major in
/// shared memory, strides lda, ldb), row(i) = R rg + i for R = 4 (a
/// 256-thread product) and rg + 8 i for R = 8 (a 128-thread group): the two
/// row groups of a warp then read neighbouring rows, which the padding puts
/// in different banks (rows 8 apart would share them).
template <int R>
__device__ __forceinline__ int row_of(int rg, int i) {
  return R == 4 ? 4 * rg + i : rg + 8 * i;
}

template <int K, int R = 4>
__device__ __forceinline__ void mm_nt(float (&acc)[R][4], const float* A, int lda, const float* B,
                                      int ldb, int rg, int cg) {
  A += row_of<R>(rg, 0) * lda;
  B += cg * ldb;
#pragma unroll
  for (int i = 0; i < R; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) acc[i][j] = 0.f;
#pragma unroll(R == 4 ? 8 : 4)
  for (int k = 0; k < K; k += 4) {
    float4 a[R], b[4];
#pragma unroll
    for (int i = 0; i < R; ++i) a[i] = ld4(A + (row_of<R>(0, i)) * lda + k);
#pragma unroll
    for (int j = 0; j < 4; ++j) b[j] = ld4(B + 16 * j * ldb + k);
#pragma unroll
    for (int i = 0; i < R; ++i)
#pragma unroll
      for (int j = 0; j < 4; ++j) acc[i][j] = dot4_acc(a[i], b[j], acc[i][j]);
  }
}

/// acc[i][4 v + j] += sum_{k < K} A[row(i)][k] B[k][64 v + 4 cg + j] (A, B
/// row-major in shared memory; row(i) as in mm_nt).
template <int K, int NV, int R = 4>
__device__ __forceinline__ void mm_nn(float (&acc)[R][4 * NV], const float* A, int lda,
                                      const float* B, int ldb, int rg, int cg) {
  A += row_of<R>(rg, 0) * lda;
  B += 4 * cg;
#pragma unroll 4
  for (int k = 0; k < K; k += 4) {
    float4 a[R];
#pragma unroll
    for (int i = 0; i < R; ++i) a[i] = ld4(A + row_of<R>(0, i) * lda + k);
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      float4 b[NV];
#pragma unroll
      for (int v = 0; v < NV; ++v) b[v] = ld4(B + (k + kk) * ldb + 64 * v);
#pragma unroll
      for (int i = 0; i < R; ++i) {
        const float x = elem(a[i], kk);
#pragma unroll
        for (int v = 0; v < NV; ++v) {
          acc[i][4 * v] = fmaf(x, b[v].x, acc[i][4 * v]);
          acc[i][4 * v + 1] = fmaf(x, b[v].y, acc[i][4 * v + 1]);
          acc[i][4 * v + 2] = fmaf(x, b[v].z, acc[i][4 * v + 2]);
          acc[i][4 * v + 3] = fmaf(x, b[v].w, acc[i][4 * v + 3]);
        }
      }
    }
  }
}

/// mm_nt<K, 8> with B in the swizzled layout of load_tile_async<K, true>.
/// B's rows 16 j + cg all have r & 7 = cg & 7, so eight offsets x[u] (u =
/// column c4 & 7) serve all four of them; logical columns are still summed
/// in order, so the result is that of mm_nt bit for bit. Sixteen rows at one
/// logical column land in 8 different 16-byte bank groups: 2 wavefronts, as
/// the padding gives, without the padding's shared memory.
template <int K>
__device__ __forceinline__ void mm_nt_sw(float (&acc)[8][4], const float* A, int lda,
                                         const float* B, int rg, int cg) {
  A += rg * lda;
  B += cg * K;
  int x[8];
#pragma unroll
  for (int u = 0; u < 8; ++u) x[u] = 4 * ((u ^ cg) & 7);
#pragma unroll
  for (int i = 0; i < 8; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) acc[i][j] = 0.f;
#pragma unroll 2
  for (int k8 = 0; k8 < K; k8 += 32) {
#pragma unroll
    for (int u = 0; u < 8; ++u) {
      float4 a[8], b[4];
#pragma unroll
      for (int i = 0; i < 8; ++i) a[i] = ld4(A + 8 * i * lda + k8 + 4 * u);
#pragma unroll
      for (int j = 0; j < 4; ++j) b[j] = ld4(B + 16 * j * K + k8 + x[u]);
#pragma unroll
      for (int i = 0; i < 8; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] = dot4_acc(a[i], b[j], acc[i][j]);
    }
  }
}

/// Index of (r, c) in a [64][64] P^T / dS^T tile without padding: odd rows
/// have their 16-float quarters swapped pairwise (c ^ 16), so the two
/// neighbouring rows a warp's halves touch at once use different banks.
__device__ __forceinline__ int pt_index(int r, int c) { return r * kTile + (c ^ ((r & 1) << 4)); }

/// acc[i][4 v + j] += sum_{k < 64} A[rg + 8 i][k] B[k][64 v + 4 cg + j] with A
/// a [64][64] tile laid out by pt_index and B [64][HD] swizzled as in
/// load_tile_async<HD, true>; sums in the order of mm_nn.
template <int NV>
__device__ __forceinline__ void mm_nn_sw(float (&acc)[8][4 * NV], const float* A, const float* B,
                                         int rg, int cg) {
  constexpr int HD = 64 * NV;
  // Rows rg + 8 i share the parity of rg: column k is at k + f for k & 16 == 0
  // and at k - f otherwise.
  const int f = 16 * (rg & 1);
  const float* ap = A + rg * kTile + f;
  const float* am = A + rg * kTile - f;
  B += 4 * (cg & 8);
  int x[8];
#pragma unroll
  for (int u = 0; u < 8; ++u) x[u] = 4 * ((u ^ cg) & 7);
#pragma unroll 2
  for (int k8 = 0; k8 < kTile; k8 += 8) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int k = k8 + 4 * h;
      const float* a0 = (k & 16) ? am : ap;
      float4 a[8];
#pragma unroll
      for (int i = 0; i < 8; ++i) a[i] = ld4(a0 + 8 * i * kTile + k);
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {
        float4 b[NV];
#pragma unroll
        for (int v = 0; v < NV; ++v) b[v] = ld4(B + (k + kk) * HD + 64 * v + x[4 * h + kk]);
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          const float xa = elem(a[i], kk);
#pragma unroll
          for (int v = 0; v < NV; ++v) {
            acc[i][4 * v] = fmaf(xa, b[v].x, acc[i][4 * v]);
            acc[i][4 * v + 1] = fmaf(xa, b[v].y, acc[i][4 * v + 1]);
            acc[i][4 * v + 2] = fmaf(xa, b[v].z, acc[i][4 * v + 2]);
            acc[i][4 * v + 3] = fmaf(xa, b[v].w, acc[i][4 * v + 3]);
          }
        }
      }
    }
  }
}

/// Row i of a thread's mm_nn accumulator times mul, to global row `out`.
template <int NV, int R>
__device__ __forceinline__ void store_row(float* out, const float (&acc)[R][4 * NV], int i,
                                          float mul, int cg) {
#pragma unroll
  for (int v = 0; v < NV; ++v)
    st4(out + 64 * v + 4 * cg, make_float4(acc[i][4 * v] * mul, acc[i][4 * v + 1] * mul,
                                           acc[i][4 * v + 2] * mul, acc[i][4 * v + 3] * mul));
}

/// Sum / max over the 16 lanes of a half-warp (the threads sharing a row).
__device__ __forceinline__ float half_warp_max(float x) {
#pragma unroll
  for (int m = 1; m < 16; m <<= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, m));
  return x;
}
__device__ __forceinline__ float half_warp_sum(float x) {
#pragma unroll
  for (int m = 1; m < 16; m <<= 1) x += __shfl_xor_sync(0xffffffffu, x, m);
  return x;
}

// Shared-memory row strides: [.][HD] operand tiles and [64][64] P / dS tiles.
template <int HD>
struct Ld {
  static constexpr int op = HD + kPad, p = kTile + kPad;
};

// --- forward ----------------------------------------------------------------

template <int HD>
__global__ void __launch_bounds__(kThreads, 2) flash_f32_forward_kernel(const FwdParams p) {
  constexpr int LD = Ld<HD>::op, LDP = Ld<HD>::p, NV = HD / 64;
  auto* sq = reinterpret_cast<float*>(flash_smem);
  float* sk = sq + kTile * LD;  // K tile; then P [kTile][LDP] (kTile * LDP <= kTile * LD)
  float* sv = sk + kTile * LD;
  float* sp = sk;
  const int tid = threadIdx.x, rg = tid / 16, cg = tid % 16;
  const std::int64_t bh = blockIdx.x, b = bh / p.heads, h = bh % p.heads, ld = 3 * p.d;
  const int qb = static_cast<int>(gridDim.y - 1 - blockIdx.y);  // longest rows first
  const std::int64_t q0 = std::int64_t(qb) * kTile;
  const float* head = p.qkv + b * p.seq * ld + h * HD;

  load_tile<HD>(sq, head + q0 * ld, ld, p.seq - q0, tid);
  float o[4][4 * NV];
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int c = 0; c < 4 * NV; ++c) o[i][c] = 0.f;
  float m[4], l[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    m[i] = -INFINITY;
    l[i] = 0.f;
  }

  // Key tiles 0..qb; tile qb is the diagonal one (aligned with the query
  // tile), the only one needing the mask. Every row sees key 0 of tile 0, so
  // the running max is finite from the first tile on.
  for (int kb = 0; kb <= qb; ++kb) {
    const std::int64_t k0 = std::int64_t(kb) * kTile;
    __syncthreads();  // the previous tile's O += P V is done with sp and sv
    load_tile<HD>(sk, head + k0 * ld + p.d, ld, p.seq - k0, tid);
    load_tile<HD>(sv, head + k0 * ld + 2 * p.d, ld, p.seq - k0, tid);
    __syncthreads();

    float s[4][4];
    mm_nt<HD>(s, sq, LD, sk, LD, rg, cg);
    if (kb == qb) {
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j)
          if (16 * j + cg > 4 * rg + i) s[i][j] = -INFINITY;
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      float mx = m[i];
#pragma unroll
      for (int j = 0; j < 4; ++j) mx = fmaxf(mx, s[i][j]);
      mx = half_warp_max(mx);  // the same value in all 16 lanes of the row
      const float base = mx * p.scale_log2;
      const float alpha = exp2f(m[i] * p.scale_log2 - base);  // 0 when m[i] = -inf
      m[i] = mx;
      float sum = 0.f;  // this lane's part; the row's sum is taken at the end
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        s[i][j] = exp2f(s[i][j] * p.scale_log2 - base);
        sum += s[i][j];
      }
      l[i] = l[i] * alpha + sum;
#pragma unroll
      for (int c = 0; c < 4 * NV; ++c) o[i][c] *= alpha;
    }
    __syncthreads();  // every thread is done reading the K tile
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int j = 0; j < 4; ++j) sp[(4 * rg + i) * LDP + 16 * j + cg] = s[i][j];
    __syncthreads();
    mm_nn<kTile, NV>(o, sp, LDP, sv, LD, rg, cg);
  }

#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float sum = half_warp_sum(l[i]);
    const std::int64_t row = q0 + 4 * rg + i;
    if (row < p.seq) {
      store_row<NV>(p.ctx + (b * p.seq + row) * p.d + h * HD, o, i, 1.f / sum, cg);
      if (cg == 0) p.lse[bh * p.seq + row] = m[i] * p.scale + logf(sum);
    }
  }
}

// --- backward ---------------------------------------------------------------

// delta[(b*heads + h)*seq + i] = sum_c dO * O; threads walk (token, head) so
// that neighbours read neighbouring memory.
template <int HD>
__global__ void flash_f32_delta_kernel(const BwdParams p, std::int64_t n) {
  const std::int64_t r = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (r >= n) return;
  const std::int64_t token = r / p.heads, h = r % p.heads;
  const std::int64_t b = token / p.seq, i = token % p.seq;
  const std::int64_t off = token * p.d + h * HD;
  float s = 0.f;
#pragma unroll 8
  for (int c = 0; c < HD; c += 4) {
    const float4 x = ld4(p.ctx + off + c), y = ld4(p.dout + off + c);
    s = fmaf(x.x, y.x, s);
    s = fmaf(x.y, y.y, s);
    s = fmaf(x.z, y.z, s);
    s = fmaf(x.w, y.w, s);
  }
  p.delta[(b * p.heads + h) * p.seq + i] = s;
}

// The backward's 64 x 64 x HD products run as two 128-thread groups
// (warps 0-3 and 4-7) side by side, each on its own product with a thread
// owning 8 rows (R = 8) instead of 4: twice the FMAs per shared-memory load.
constexpr int kGroup = kThreads / 2;

// Buffers of the streamed operands (dK/dV: Q, dO; dQ: K, V). hd 128 runs one
// block per SM, so chunk n + 1 is fetched (cp.async) while chunk n is worked
// on; hd 64 fits two blocks per SM, which cover each other's loads.
// (Two buffers at hd 64 were measured slower, 0.59 vs 0.53 ms on an H200:
// they cost the second block per SM.)
template <int HD>
constexpr int kStages = HD == 128 ? 2 : 1;

// Blocks per SM the backward kernels' shared memory allows: two with one
// buffer at hd 64, else one.
template <int HD>
constexpr int bwd_blocks() {
  return kStages<HD> == 1 && HD == 64 ? 2 : 1;
}

template <int HD>
__global__ void __launch_bounds__(kThreads, bwd_blocks<HD>()) flash_f32_dkdv_kernel(
    const BwdParams p) {
  constexpr int LD = Ld<HD>::op, NV = HD / 64, S = kStages<HD>;
  auto* sk = reinterpret_cast<float*>(flash_smem);
  float* sv = sk + kTile * LD;
  float* sq0 = sv + kTile * LD;        // S buffers of Q, then S of dO (swizzled, [64][HD])
  float* sdo0 = sq0 + S * kTile * HD;
  float* spt = sdo0 + S * kTile * HD;  // P^T [key][query] (pt_index)
  float* sdst = spt + kTile * kTile;   // dS^T [key][query] (pt_index)
  const int tid = threadIdx.x, grp = tid / kGroup, rg = tid % kGroup / 16, cg = tid % 16;
  const std::int64_t bh = blockIdx.x, b = bh / p.heads, h = bh % p.heads, ld = 3 * p.d;
  const std::int64_t k0 = std::int64_t(blockIdx.y) * kTile;  // key tile 0 (most work) first
  const float* head = p.qkv + b * p.seq * ld + h * HD;
  const float* dhead = p.dout + b * p.seq * p.d + h * HD;
  // Group 0: S^T = K Q^T -> P^T, then dV += P^T dO. Group 1: dP^T = V dO^T
  // -> dS^T = P^T (dP^T - delta), then dK += dS^T Q. Both groups run the
  // same code on different operands; each accumulates one of dV, dK. The
  // queries' statistics come with them: lse (group 0), delta (group 1).
  const float* a1 = grp == 0 ? sk : sv;
  const float* stat = (grp == 0 ? p.lse : p.delta) + bh * p.seq;
  const float stat_mul = grp == 0 ? kLog2e : 1.f;

  // Queries before k0 see none of these keys: chunks qc = k0 + 64 n.
  const int chunks = static_cast<int>((p.seq - k0 + kTile - 1) / kTile);
  auto fetch = [&](int n) {  // chunk n's Q and dO into buffer n % S
    const std::int64_t qc = k0 + std::int64_t(n) * kTile;
    load_tile_async<HD, true>(sq0 + (n % S) * kTile * HD, head + qc * ld, ld, p.seq - qc, tid);
    load_tile_async<HD, true>(sdo0 + (n % S) * kTile * HD, dhead + qc * p.d, p.d, p.seq - qc, tid);
  };
  load_tile<HD>(sk, head + k0 * ld + p.d, ld, p.seq - k0, tid);
  load_tile<HD>(sv, head + k0 * ld + 2 * p.d, ld, p.seq - k0, tid);
  if (S == 2) {
    fetch(0);
    cp_async_commit();
  }
  float acc[8][4 * NV];  // group 0: dV, group 1: dK (keys rg + 8 i)
#pragma unroll
  for (int i = 0; i < 8; ++i)
#pragma unroll
    for (int c = 0; c < 4 * NV; ++c) acc[i][c] = 0.f;

  for (int n = 0; n < chunks; ++n) {
    const std::int64_t qc = k0 + std::int64_t(n) * kTile;
    float cv[4];  // the statistic of this thread's queries 16 j + cg
#pragma unroll
    for (int j = 0; j < 4; ++j)
      cv[j] = qc + 16 * j + cg < p.seq ? stat[qc + 16 * j + cg] * stat_mul : 0.f;
    // Everyone is done with chunk n - 1: its buffers (S == 1), buffer
    // (n + 1) % 2 (S == 2), P^T and dS^T are free.
    __syncthreads();
    if (S == 2) {
      if (n + 1 < chunks) fetch(n + 1);
      cp_async_commit();  // possibly empty: keeps one group per chunk
      cp_async_wait<1>();  // chunk n's group is complete
    } else {
      fetch(n);
      cp_async_commit();
      cp_async_wait<0>();
    }
    __syncthreads();
    const float* sq = sq0 + (n % S) * kTile * HD;
    const float* sdo = sdo0 + (n % S) * kTile * HD;

    // Masked where the key comes after the query (the diagonal chunk) or the
    // query is padding (the last chunk).
    const bool edge = n == 0 || qc + kTile > p.seq;
    float t[8][4];  // S^T or dP^T: keys rg + 8 i, queries 16 j + cg
    mm_nt_sw<HD>(t, a1, LD, grp == 0 ? sq : sdo, rg, cg);
    if (grp == 0) {
#pragma unroll
      for (int i = 0; i < 8; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const int r = rg + 8 * i, col = 16 * j + cg;
          float pv = exp2f(t[i][j] * p.scale_log2 - cv[j]);
          if (edge && (k0 + r > qc + col || qc + col >= p.seq)) pv = 0.f;
          spt[pt_index(r, col)] = pv;
        }
    }
    __syncthreads();
    if (grp == 1) {
#pragma unroll
      for (int i = 0; i < 8; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const int idx = pt_index(rg + 8 * i, 16 * j + cg);
          sdst[idx] = spt[idx] * (t[i][j] - cv[j]);
        }
    }
    __syncthreads();
    // dV += P^T dO, dK += dS^T Q (the scale is applied once at the end).
    mm_nn_sw<NV>(acc, grp == 0 ? spt : sdst, grp == 0 ? sdo : sq, rg, cg);
  }

#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const std::int64_t key = k0 + rg + 8 * i;
    if (key >= p.seq) continue;
    float* row = p.dqkv + (b * p.seq + key) * ld + h * HD;
    if (grp == 0)
      store_row<NV>(row + 2 * p.d, acc, i, 1.f, cg);
    else
      store_row<NV>(row + p.d, acc, i, p.scale, cg);
  }
}

template <int HD>
__global__ void __launch_bounds__(kThreads, bwd_blocks<HD>()) flash_f32_dq_kernel(
    const BwdParams p) {
  constexpr int LD = Ld<HD>::op, LDP = Ld<HD>::p, S = kStages<HD>;
  auto* sq = reinterpret_cast<float*>(flash_smem);
  float* sdo = sq + kTile * LD;
  float* sk0 = sdo + kTile * LD;     // S buffers of K, then S of V
  float* sv0 = sk0 + S * kTile * LD;
  float* sds = sv0 + S * kTile * LD;  // P, then dS [query][key]
  const int tid = threadIdx.x, grp = tid / kGroup, rg = tid % kGroup / 16, cg = tid % 16;
  const std::int64_t bh = blockIdx.x, b = bh / p.heads, h = bh % p.heads, ld = 3 * p.d;
  const int qb = static_cast<int>(gridDim.y - 1 - blockIdx.y);  // longest rows first
  const std::int64_t q0 = std::int64_t(qb) * kTile;
  const float* head = p.qkv + b * p.seq * ld + h * HD;
  // Group 0: S = Q K^T -> P; group 1: dP = dO V^T -> dS = P (dP - delta).
  // Then dQ += dS K over all 256 threads (4 rows each).
  const float* a1 = grp == 0 ? sq : sdo;
  auto fetch = [&](int n) {  // key chunk n's K and V into buffer n % S
    const std::int64_t kc = std::int64_t(n) * kTile;
    load_tile_async<HD, false>(sk0 + (n % S) * kTile * LD, head + kc * ld + p.d, ld, p.seq - kc, tid);
    load_tile_async<HD, false>(sv0 + (n % S) * kTile * LD, head + kc * ld + 2 * p.d, ld, p.seq - kc,
                               tid);
  };

  load_tile<HD>(sq, head + q0 * ld, ld, p.seq - q0, tid);
  load_tile<HD>(sdo, p.dout + (b * p.seq + q0) * p.d + h * HD, p.d, p.seq - q0, tid);
  if (S == 2) {
    fetch(0);
    cp_async_commit();
  }
  float rowv[8];  // group 0: lse * log2e, group 1: delta of its rows (padding rows: 0)
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const std::int64_t row = q0 + rg + 8 * i;
    rowv[i] = row >= p.seq ? 0.f
              : grp == 0   ? p.lse[bh * p.seq + row] * kLog2e
                           : p.delta[bh * p.seq + row];
  }
  // dQ += dS K: at hd 128 group g owns columns 64 g .. 64 g + 63 with 8 rows
  // per thread (as the groups' other products); at hd 64, 4 rows per thread
  // over all 256 threads.
  constexpr int DR = HD == 128 ? 8 : 4;
  float dq[DR][4];
#pragma unroll
  for (int i = 0; i < DR; ++i)
#pragma unroll
    for (int c = 0; c < 4; ++c) dq[i][c] = 0.f;

  for (int n = 0; n <= qb; ++n) {
    // Everyone is done with chunk n - 1 (its buffers, sds).
    __syncthreads();
    if (S == 2) {
      if (n < qb) fetch(n + 1);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      fetch(n);
      cp_async_commit();
      cp_async_wait<0>();
    }
    __syncthreads();
    const float* sk = sk0 + (n % S) * kTile * LD;
    const float* sv = sv0 + (n % S) * kTile * LD;

    const bool diagonal = n == qb;
    float t[8][4];  // S or dP: queries rg + 8 i, keys 16 j + cg
    mm_nt<HD, 8>(t, a1, LD, grp == 0 ? sk : sv, LD, rg, cg);
    if (grp == 0) {
#pragma unroll
      for (int i = 0; i < 8; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const int r = rg + 8 * i;
          const float pv = exp2f(t[i][j] * p.scale_log2 - rowv[i]);
          sds[r * LDP + 16 * j + cg] = diagonal && 16 * j + cg > r ? 0.f : pv;
        }
    }
    __syncthreads();
    if (grp == 1) {
#pragma unroll
      for (int i = 0; i < 8; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const int idx = (rg + 8 * i) * LDP + 16 * j + cg;
          sds[idx] = sds[idx] * (t[i][j] - rowv[i]);
        }
    }
    __syncthreads();
    if constexpr (DR == 8)
      mm_nn<kTile, 1, 8>(dq, sds, LDP, sk + 64 * grp, LD, rg, cg);
    else
      mm_nn<kTile, 1, 4>(dq, sds, LDP, sk, LD, tid / 16, cg);
  }

#pragma unroll
  for (int i = 0; i < DR; ++i) {
    const std::int64_t row = q0 + (DR == 8 ? rg + 8 * i : 4 * (tid / 16) + i);
    if (row < p.seq)
      store_row<1>(p.dqkv + (b * p.seq + row) * ld + h * HD + (DR == 8 ? 64 * grp : 0), dq, i,
                   p.scale, cg);
  }
}

// --- launch -----------------------------------------------------------------

using cuda_launch::check_launch;

// Every tile kernel: kThreads threads and dynamic shared memory.
template <class Kernel, class Params>
void launch_tiles(Kernel kernel, const char* name, dim3 grid, std::size_t smem,
                  cudaStream_t stream, const Params& params) {
  cuda_launch::launch_with_smem(kernel, name, grid, kThreads, smem, stream, params);
}

bool aligned16(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; }

dim3 tile_grid(const FlashArgs<float>& a) {
  return dim3(static_cast<unsigned>(a.batch * a.heads),
              static_cast<unsigned>((a.seq + kTile - 1) / kTile));
}

// Dynamic shared memory of each kernel (bytes).
template <int HD>
struct Smem {
  static constexpr int LD = Ld<HD>::op, LDP = Ld<HD>::p;
  // Forward: Q, K (then P), V tiles.
  static constexpr std::size_t fwd = 3 * kTile * LD * sizeof(float);
  // dK/dV: K, V tiles (padded), S Q and S dO buffers (swizzled), P^T, dS^T.
  static constexpr std::size_t dkdv =
      (2 * kTile * LD + 2 * kStages<HD> * kTile * HD + 2 * kTile * kTile) * sizeof(float);
  // dQ: Q, dO tiles, S K and S V buffers, dS (all padded).
  static constexpr std::size_t dq =
      (2 * kTile * LD + 2 * kStages<HD> * kTile * LD + kTile * LDP) * sizeof(float);
  static constexpr std::size_t most = fwd > dkdv ? (fwd > dq ? fwd : dq) : (dkdv > dq ? dkdv : dq);
};
// What the comments (and the choice of one block per SM at hd 128, two at 64)
// assume: hd 128 within an H100/H200 block's 227 KiB, hd 64 two blocks to an SM.
static_assert(Smem<128>::most <= 227 * 1024, "hd 128 exceeds an H100's shared memory per block");
static_assert(2 * (Smem<64>::most + 1024) <= 228 * 1024,
              "hd 64 no longer fits two blocks per SM");

template <int HD>
void forward(const FlashArgs<float>& a, cudaStream_t stream) {
  FwdParams p{a.qkv, a.out, a.lse, a.seq, a.d, a.heads, 1.f / std::sqrt(float(HD)), 0.f};
  p.scale_log2 = p.scale * kLog2e;
  const std::size_t smem = Smem<HD>::fwd;
  launch_tiles(flash_f32_forward_kernel<HD>, "kshard flash_f32_forward_kernel", tile_grid(a),
               smem, stream, p);
}

template <int HD>
void backward(const FlashArgs<float>& a, cudaStream_t stream) {
  BwdParams p{a.qkv, a.ctx, a.dctx, a.lse_in, a.delta, a.out,
              a.seq, a.d,   a.heads, 1.f / std::sqrt(float(HD)), 0.f};
  p.scale_log2 = p.scale * kLog2e;
  const std::int64_t n = a.batch * a.seq * a.heads;
  const std::int64_t blocks = (n + 255) / 256;
  if (blocks > std::numeric_limits<int>::max())
    throw Error("flash_attention_backward: " + std::to_string(n) + " rows",
                "batch*seq*heads below 2^39");
  flash_f32_delta_kernel<HD><<<static_cast<unsigned>(blocks), 256, 0, stream>>>(p, n);
  check_launch("kshard flash_f32_delta_kernel");
  launch_tiles(flash_f32_dkdv_kernel<HD>, "kshard flash_f32_dkdv_kernel", tile_grid(a),
               Smem<HD>::dkdv, stream, p);
  launch_tiles(flash_f32_dq_kernel<HD>, "kshard flash_f32_dq_kernel", tile_grid(a), Smem<HD>::dq,
               stream, p);
}

}  // namespace

bool flash_f32_serves(const FlashArgs<float>& a) {
  const std::int64_t hd = a.head_dim();
  if (hd != 64 && hd != 128) return false;
  // The kernels' shared memory must fit the current GPU's per-block opt-in
  // limit (hd 128's dK/dV kernel takes 226 KiB: an H100/H200 has 227, an
  // A100 163; hd 64 takes at most 98 KiB): else the portable kernel serves,
  // rather than a failed launch.
  int device = 0, optin = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) !=
          cudaSuccess) {
    cudaGetLastError();  // clear it: nothing was launched
    return false;
  }
  if ((hd == 64 ? Smem<64>::most : Smem<128>::most) > static_cast<std::size_t>(optin)) return false;
  // float4 loads and stores: every row start must be 16-byte aligned, which
  // d % 4 == 0 (true for these hd) and aligned bases give.
  for (const void* ptr : {static_cast<const void*>(a.qkv), static_cast<const void*>(a.ctx),
                          static_cast<const void*>(a.dctx), static_cast<const void*>(a.out)})
    if (ptr != nullptr && !aligned16(ptr)) return false;
  const std::int64_t tiles = (a.seq + kTile - 1) / kTile;
  return tiles <= 65535 && a.batch * a.heads <= std::numeric_limits<int>::max();
}

void flash_f32_forward(const FlashArgs<float>& a, cudaStream_t stream) {
  if (a.head_dim() == 64)
    forward<64>(a, stream);
  else
    forward<128>(a, stream);
}

void flash_f32_backward(const FlashArgs<float>& a, cudaStream_t stream) {
  if (a.head_dim() == 64)
    backward<64>(a, stream);
  else
    backward<128>(a, stream);
}

}  // namespace kshard::detail
