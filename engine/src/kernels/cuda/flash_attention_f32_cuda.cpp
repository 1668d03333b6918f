// Exact-f32 fused causal attention for CUDA: plain FP32 FMA on the CUDA cores
// (no TF32, no 3xTF32), the FlashAttention-2 algorithm of the portable kernel
// (engine/src/kernels/flash_attention.cpp) with SIMT register tiling. Head
// dims 64 and 128; everything else stays on the portable kernel.
//
// Every product is a 64 x 64 (or 64 x HD) tile from operands in shared memory,
// 256 threads, thread (rg, cg) = (tid / 16, tid % 16) owning rows 4 rg .. 4 rg + 3
// of the result and either
//   mm_nt (C = A B^T, reduction index contiguous in both, e.g. S = Q K^T):
//     columns 16 j + cg, j < 4; per 4 reduction steps 8 float4 loads feed 64 FMAs;
//     strided columns make the 16 B rows a half-warp reads start 4 banks apart
//     (rows of HD + 4 floats), so they are read in 2 wavefronts;
//   mm_nn (C += A B, B row-major [k][n], e.g. O += P V):
//     columns 64 v + 4 cg + j; a half-warp reads 256 contiguous bytes of B.
// A's rows are shared by the 16 threads of a half-warp (broadcast).
// Each thread holds the rows it owns in every product of a kernel, so the
// online-softmax statistics of a row live in the 16 lanes of one half-warp and
// are combined with shuffles; the rescale of O is thread-local.
//
// Kernels (grid = (batch*heads, 64-row tiles); every tile and chunk is 64 rows):
//   forward  block = query tile, longest causal rows first; key tiles 0..qb
//            (only the diagonal one masked) through an online softmax; P goes
//            through shared memory (over the K tile, which S no longer needs)
//            to become the A operand of O += P V.
//   delta    delta = rowsum(dO * O) per (token, head).
//   dK, dV   block = key tile (tile 0, which every query sees, first); query
//            chunks from the diagonal on: S^T = K Q^T and dP^T = V dO^T in the
//            key-major layout, P^T and dS^T = P^T (dP^T - delta) to shared
//            memory, dV += P^T dO, dK += dS^T Q.
//   dQ       block = query tile, longest first; key chunks 0..qb: S, dP, dS to
//            shared memory, dQ += dS K.
// Operands are loaded synchronously (float4 global loads, zero past seq): one
// 64-row chunk costs a few hundred cycles against tens of thousands of FMA
// cycles of products, and two blocks per SM (where shared memory allows)
// cover the loads of each other.
// Determinism: no atomics; each output element is written by one thread, and
// every sum runs in a fixed order, so results are bitwise reproducible.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>

#include "flash_attention_f32_cuda.hpp"
#include "kshard/error.hpp"
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
      for (int j = 0; j < 4; ++j) {
        float c = acc[i][j];
        c = fmaf(a[i].x, b[j].x, c);
        c = fmaf(a[i].y, b[j].y, c);
        c = fmaf(a[i].z, b[j].z, c);
        acc[i][j] = fmaf(a[i].w, b[j].w, c);
      }
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

// Blocks per SM the backward kernels' shared memory allows (hd 128: one).
template <int HD>
constexpr int bwd_blocks() {
  return HD == 64 ? 2 : 1;
}

// The backward's 64 x 64 x HD products run as two 128-thread groups
// (warps 0-3 and 4-7) side by side, each on its own product with a thread
// owning 8 rows (R = 8) instead of 4: twice the FMAs per shared-memory load.
constexpr int kGroup = kThreads / 2;

template <int HD>
__global__ void __launch_bounds__(kThreads, bwd_blocks<HD>()) flash_f32_dkdv_kernel(
    const BwdParams p) {
  constexpr int LD = Ld<HD>::op, LDP = Ld<HD>::p, NV = HD / 64;
  auto* sk = reinterpret_cast<float*>(flash_smem);
  float* sv = sk + kTile * LD;
  float* sq = sv + kTile * LD;
  float* sdo = sq + kTile * LD;
  float* spt = sdo + kTile * LD;   // P^T [key][query]
  float* sdst = spt + kTile * LDP;  // dS^T [key][query]
  float* sl = sdst + kTile * LDP;   // lse * log2e of the chunk's queries
  float* sdl = sl + kTile;          // delta of the chunk's queries
  const int tid = threadIdx.x, grp = tid / kGroup, rg = tid % kGroup / 16, cg = tid % 16;
  const std::int64_t bh = blockIdx.x, b = bh / p.heads, h = bh % p.heads, ld = 3 * p.d;
  const std::int64_t k0 = std::int64_t(blockIdx.y) * kTile;  // key tile 0 (most work) first
  const float* head = p.qkv + b * p.seq * ld + h * HD;
  const float* dhead = p.dout + b * p.seq * p.d + h * HD;
  const float* lse = p.lse + bh * p.seq;
  const float* del = p.delta + bh * p.seq;
  // Group 0: S^T = K Q^T -> P^T, then dV += P^T dO. Group 1: dP^T = V dO^T
  // -> dS^T = P^T (dP^T - delta), then dK += dS^T Q. Both groups run the
  // same code on different operands; each accumulates one of dV, dK.
  const float* a1 = grp == 0 ? sk : sv;
  const float* b1 = grp == 0 ? sq : sdo;
  const float* a2 = grp == 0 ? spt : sdst;
  const float* b2 = grp == 0 ? sdo : sq;

  load_tile<HD>(sk, head + k0 * ld + p.d, ld, p.seq - k0, tid);
  load_tile<HD>(sv, head + k0 * ld + 2 * p.d, ld, p.seq - k0, tid);
  float acc[8][4 * NV];  // group 0: dV, group 1: dK (keys row_of<8>(rg, i))
#pragma unroll
  for (int i = 0; i < 8; ++i)
#pragma unroll
    for (int c = 0; c < 4 * NV; ++c) acc[i][c] = 0.f;

  // Queries before k0 see none of these keys.
  for (std::int64_t qc = k0; qc < p.seq; qc += kTile) {
    __syncthreads();  // the previous chunk's products are done with its tiles
    load_tile<HD>(sq, head + qc * ld, ld, p.seq - qc, tid);
    load_tile<HD>(sdo, dhead + qc * p.d, p.d, p.seq - qc, tid);
    if (tid < kTile) {
      const bool valid = qc + tid < p.seq;
      sl[tid] = valid ? lse[qc + tid] * kLog2e : 0.f;
      sdl[tid] = valid ? del[qc + tid] : 0.f;
    }
    __syncthreads();

    // Masked where the key comes after the query (the diagonal chunk) or the
    // query is padding (the last chunk).
    const bool edge = qc == k0 || qc + kTile > p.seq;
    float t[8][4];  // S^T or dP^T: keys row_of<8>(rg, i), queries 16 j + cg
    mm_nt<HD, 8>(t, a1, LD, b1, LD, rg, cg);
    if (grp == 0) {
#pragma unroll
      for (int i = 0; i < 8; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const int r = row_of<8>(rg, i), col = 16 * j + cg;
          float pv = exp2f(t[i][j] * p.scale_log2 - sl[col]);
          if (edge && (k0 + r > qc + col || qc + col >= p.seq)) pv = 0.f;
          spt[r * LDP + col] = pv;
        }
    }
    __syncthreads();
    if (grp == 1) {
#pragma unroll
      for (int i = 0; i < 8; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const int idx = row_of<8>(rg, i) * LDP + 16 * j + cg;
          sdst[idx] = spt[idx] * (t[i][j] - sdl[16 * j + cg]);
        }
    }
    __syncthreads();
    // dV += P^T dO, dK += dS^T Q (the scale is applied once at the end).
    mm_nn<kTile, NV, 8>(acc, a2, LDP, b2, LD, rg, cg);
  }

#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const std::int64_t key = k0 + row_of<8>(rg, i);
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
  constexpr int LD = Ld<HD>::op, LDP = Ld<HD>::p, NV = HD / 64;
  auto* sq = reinterpret_cast<float*>(flash_smem);
  float* sdo = sq + kTile * LD;
  float* sk = sdo + kTile * LD;
  float* sv = sk + kTile * LD;
  float* sds = sv + kTile * LD;  // P, then dS [query][key]
  const int tid = threadIdx.x, grp = tid / kGroup, rg = tid % kGroup / 16, cg = tid % 16;
  const std::int64_t bh = blockIdx.x, b = bh / p.heads, h = bh % p.heads, ld = 3 * p.d;
  const int qb = static_cast<int>(gridDim.y - 1 - blockIdx.y);  // longest rows first
  const std::int64_t q0 = std::int64_t(qb) * kTile;
  const float* head = p.qkv + b * p.seq * ld + h * HD;
  // Group 0: S = Q K^T -> P; group 1: dP = dO V^T -> dS = P (dP - delta).
  // Then dQ += dS K over all 256 threads (4 rows each).
  const float* a1 = grp == 0 ? sq : sdo;
  const float* b1 = grp == 0 ? sk : sv;

  load_tile<HD>(sq, head + q0 * ld, ld, p.seq - q0, tid);
  load_tile<HD>(sdo, p.dout + (b * p.seq + q0) * p.d + h * HD, p.d, p.seq - q0, tid);
  float rowv[8];  // group 0: lse * log2e, group 1: delta of its rows (padding rows: 0)
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const std::int64_t row = q0 + row_of<8>(rg, i);
    rowv[i] = row >= p.seq             ? 0.f
              : grp == 0 ? p.lse[bh * p.seq + row] * kLog2e
                         : p.delta[bh * p.seq + row];
  }
  float dq[4][4 * NV];
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int c = 0; c < 4 * NV; ++c) dq[i][c] = 0.f;

  for (std::int64_t kc = 0; kc <= q0; kc += kTile) {
    __syncthreads();  // the previous chunk's dQ += dS K is done with sk and sds
    load_tile<HD>(sk, head + kc * ld + p.d, ld, p.seq - kc, tid);
    load_tile<HD>(sv, head + kc * ld + 2 * p.d, ld, p.seq - kc, tid);
    __syncthreads();

    const bool diagonal = kc == q0;
    float t[8][4];  // S or dP: queries row_of<8>(rg, i), keys 16 j + cg
    mm_nt<HD, 8>(t, a1, LD, b1, LD, rg, cg);
    if (grp == 0) {
#pragma unroll
      for (int i = 0; i < 8; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const int r = row_of<8>(rg, i);
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
          const int idx = row_of<8>(rg, i) * LDP + 16 * j + cg;
          sds[idx] = sds[idx] * (t[i][j] - rowv[i]);
        }
    }
    __syncthreads();
    mm_nn<kTile, NV>(dq, sds, LDP, sk, LD, tid / 16, cg);  // dQ += dS K
  }

#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const std::int64_t row = q0 + 4 * (tid / 16) + i;
    if (row < p.seq) store_row<NV>(p.dqkv + (b * p.seq + row) * ld + h * HD, dq, i, p.scale, cg);
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
  // dK/dV: K, V, Q, dO tiles + P^T, dS^T + lse, delta of the chunk.
  static constexpr std::size_t dkdv =
      (4 * kTile * LD + 2 * kTile * LDP + 2 * kTile) * sizeof(float);
  // dQ: Q, dO, K, V tiles + dS.
  static constexpr std::size_t dq = (4 * kTile * LD + kTile * LDP) * sizeof(float);
  static constexpr std::size_t most = fwd > dkdv ? (fwd > dq ? fwd : dq) : (dkdv > dq ? dkdv : dq);
};

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
  // limit (hd 128's dK/dV kernel takes 167 KiB: an H100/H200 has 227, an
  // A100 163): else the portable kernel serves, rather than a failed launch.
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
