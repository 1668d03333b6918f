// CUDA fused-attention backend: cuDNN's fused attention for bfloat16_t /
// float16_t where the build has it and it serves the shape
// (flash_attention_cudnn.cpp); else kshard's own tensor-core kernels below
// (mma.sync m16n8k16, f32 accumulate) at head dims 64 and 128; float at head
// dims 64 and 128 goes to kshard's exact-f32 SIMT kernels
// (flash_attention_f32_cuda.cpp); every other case goes to the portable
// Kokkos kernel.
//
// Kernels (all 4 warps, 128 threads; each warp owns 16 rows of its tile):
//   forward  block = (batch*head, query tile of 64). Q stays in registers;
//            64-key tiles of K and V stream through shared memory, double
//            buffered with cp.async so the next tile loads during this one's
//            products. S = Q K^T and the online softmax stay in registers;
//            P is rounded to 16 bits to feed O += P V (as FlashAttention does).
//   delta    delta = rowsum(dO * O) per (token, head).
//   dK, dV   block = (batch*head, key tile of 64): query chunks (64 rows at
//            hd 64, 32 at hd 128 so that the dK/dV accumulators plus S^T and
//            dP^T fit in registers) stream through shared memory; computes
//            S^T = K Q^T and dP^T = V dO^T directly in the key-major layout
//            that dV += P^T dO and dK += dS^T Q need as their A operand.
//   dQ       block = (batch*head, query tile of 64): key chunks (64 / 32)
//            stream through; dQ += dS K.
// Causal work is triangular: query tiles run longest first, key tile 0
// (which sees every query) first, so the tail of the grid is short blocks.
// Determinism: no atomics; each output element is written by one thread.
//
// Shared-memory rows are hd + 8 elements: consecutive rows start 16 bytes (4
// banks) apart, so the 8 row addresses of each ldmatrix phase fall in
// distinct banks (unpadded 128- or 256-byte rows would all hit the same 4).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <type_traits>

#include "kshard/kernels/flash_attention.hpp"
#include "flash_attention_f32_cuda.hpp"
#include "kshard/core/buffer_pool.hpp"
#include "cp_async.hpp"
#include "launch.hpp"
#include "kshard/error.hpp"
#if defined(KSHARD_HAVE_CUDNN)
#include "flash_attention_cudnn.hpp"
#endif

namespace kshard::detail {
namespace {

constexpr int kThreads = 128;
constexpr int kPad = 8;
constexpr float kLog2e = 1.4426950408889634f;

extern __shared__ __align__(16) unsigned char flash_smem[];

using namespace ptx;  // cp.async wrappers (cp_async.hpp)

// --- PTX wrappers -----------------------------------------------------------

__device__ __forceinline__ void ldsm_x4(std::uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}
__device__ __forceinline__ void ldsm_x4_trans(std::uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}

// Per storage type: the MMA (D += A B, f32 accumulators), packing two floats
// into one 32-bit A/B register (first element in the low half, RNE) and
// widening one element.
#define KSHARD_MMA_16816(TYPE)                                                          \
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32." TYPE "." TYPE                  \
               ".f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n" \
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])                         \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1))

template <class T>
struct Tc {
  static_assert(is_low_precision_v<T>, "tensor-core path: bfloat16_t or float16_t");
  static constexpr bool bf16 = std::is_same_v<T, bfloat16_t>;

  __device__ __forceinline__ static void mma(float (&d)[4], const std::uint32_t (&a)[4],
                                             std::uint32_t b0, std::uint32_t b1) {
    if constexpr (bf16)
      KSHARD_MMA_16816("bf16");
    else
      KSHARD_MMA_16816("f16");
  }
  __device__ __forceinline__ static std::uint32_t pack(float lo, float hi) {
    std::uint32_t u;
    if constexpr (bf16) {
      const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
      __builtin_memcpy(&u, &v, sizeof u);
    } else {
      const __half2 v = __floats2half2_rn(lo, hi);
      __builtin_memcpy(&u, &v, sizeof u);
    }
    return u;
  }
  __device__ __forceinline__ static float widen(std::uint16_t x) {
    if constexpr (bf16)
      return __uint_as_float(static_cast<unsigned>(x) << 16);
    else
      return __half2float(__ushort_as_half(x));
  }
};
#undef KSHARD_MMA_16816

// --- fragment helpers -------------------------------------------------------
// Row/column of lane `l` in the mma.m16n8k16 fragments: g = l / 4, t = l % 4.
// Accumulator c[0..1] = (row g, cols 2t, 2t+1), c[2..3] = (row g + 8, same).

/// A fragment (16 x 16 at (row0, k0)) of a row-major [m][k] smem tile.
__device__ __forceinline__ void load_a(std::uint32_t (&a)[4], const std::uint16_t* s, int ld,
                                       int row0, int k0, int lane) {
  ldsm_x4(a, s + (row0 + (lane & 15)) * ld + k0 + (lane >> 4) * 8);
}
/// B fragments of two n-tiles (n0..n0+15, k0..k0+15) of an [n][k] smem tile
/// (e.g. K[key][hd] for S = Q K^T): b[0..1] n-tile n0, b[2..3] n-tile n0 + 8.
__device__ __forceinline__ void load_b_nk(std::uint32_t (&b)[4], const std::uint16_t* s, int ld,
                                          int n0, int k0, int lane) {
  ldsm_x4(b, s + (n0 + (lane & 7) + ((lane >> 4) << 3)) * ld + k0 + ((lane >> 3) & 1) * 8);
}
/// Same from a [k][n] smem tile (e.g. V[key][hd] for O = P V), transposing.
__device__ __forceinline__ void load_b_kn(std::uint32_t (&b)[4], const std::uint16_t* s, int ld,
                                          int k0, int n0, int lane) {
  ldsm_x4_trans(b, s + (k0 + (lane & 7) + ((lane >> 3) & 1) * 8) * ld + n0 + (lane >> 4) * 8);
}
/// A fragment for k-chunk kk from accumulators c[2kk], c[2kk+1] (16 x 16).
template <class T>
__device__ __forceinline__ void acc_to_a(std::uint32_t (&a)[4], const float (&c0)[4],
                                         const float (&c1)[4]) {
  a[0] = Tc<T>::pack(c0[0], c0[1]);
  a[1] = Tc<T>::pack(c0[2], c0[3]);
  a[2] = Tc<T>::pack(c1[0], c1[1]);
  a[3] = Tc<T>::pack(c1[2], c1[3]);
}

/// ROWS x HD elements from global rows of stride ld (elements) into smem
/// rows of stride HD + kPad; rows >= valid are zero-filled.
template <int ROWS, int HD>
__device__ __forceinline__ void load_tile(std::uint16_t* dst, const std::uint16_t* src,
                                          std::int64_t ld, std::int64_t valid, int tid) {
  constexpr int kChunks = HD / 8;  // 16-byte chunks per row
#pragma unroll
  for (int c = tid; c < ROWS * kChunks; c += kThreads) {
    const int r = c / kChunks, col = (c % kChunks) * 8;
    const bool ok = r < valid;
    cp_async16(dst + r * (HD + kPad) + col, ok ? src + r * ld + col : src, ok);
  }
}

/// n floats from global into smem, zero past `valid`.
__device__ __forceinline__ void load_vec(float* dst, const float* src, int n, std::int64_t valid,
                                         int tid) {
  for (int i = tid; i < n; i += kThreads) cp_async4(dst + i, i < valid ? src + i : src, i < valid);
}

/// Rows [k0, k0 + ROWS) of one head's K and V (head: its q columns of token 0).
template <int ROWS, int HD>
__device__ __forceinline__ void load_kv(std::uint16_t* sk, std::uint16_t* sv,
                                        const std::uint16_t* head, std::int64_t k0,
                                        std::int64_t d, std::int64_t seq, int tid) {
  load_tile<ROWS, HD>(sk, head + k0 * 3 * d + d, 3 * d, seq - k0, tid);
  load_tile<ROWS, HD>(sv, head + k0 * 3 * d + 2 * d, 3 * d, seq - k0, tid);
}

/// One step of the two-stage cp.async pipeline: issue the next tile's loads
/// (if any) into the other buffer, then wait until this tile's have landed
/// and every thread sees them.
template <class Prefetch>
__device__ __forceinline__ void pipeline_step(bool has_next, Prefetch&& prefetch) {
  if (has_next) {
    prefetch();
    cp_async_commit();
    cp_async_wait<1>();
  } else {
    cp_async_wait<0>();
  }
  __syncthreads();
}

template <int N>
__device__ __forceinline__ void zero(float (&acc)[N][4]) {
#pragma unroll
  for (int n = 0; n < N; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.f;
}

/// x = A1 B1^T and y = A2 B2^T for the 16 rows row0.. of the [.][HD] smem
/// tiles a1, a2 against the N rows of the [N][HD] smem tiles b1, b2: the two
/// products (S and dP) both backward passes start with, in one loop over the
/// head dim.
template <class T, int HD, int N>
__device__ __forceinline__ void two_products_nt(float (&x)[N / 8][4], float (&y)[N / 8][4],
                                                const std::uint16_t* a1, const std::uint16_t* b1,
                                                const std::uint16_t* a2, const std::uint16_t* b2,
                                                int row0, int lane) {
  constexpr int LD = HD + kPad;
  zero(x);
  zero(y);
#pragma unroll
  for (int kk = 0; kk < HD / 16; ++kk) {
    std::uint32_t fa1[4], fa2[4];
    load_a(fa1, a1, LD, row0, kk * 16, lane);
    load_a(fa2, a2, LD, row0, kk * 16, lane);
#pragma unroll
    for (int np = 0; np < N / 16; ++np) {
      std::uint32_t f1[4], f2[4];
      load_b_nk(f1, b1, LD, np * 16, kk * 16, lane);
      load_b_nk(f2, b2, LD, np * 16, kk * 16, lane);
      Tc<T>::mma(x[2 * np], fa1, f1[0], f1[1]);
      Tc<T>::mma(x[2 * np + 1], fa1, f1[2], f1[3]);
      Tc<T>::mma(y[2 * np], fa2, f2[0], f2[1]);
      Tc<T>::mma(y[2 * np + 1], fa2, f2[2], f2[3]);
    }
  }
}

/// acc (16 x HD) += a B, a the 16 x 16 A fragment of k-chunk k0..k0+15 and B
/// rows k0..k0+15 of the [K][HD] smem tile b.
template <class T, int HD>
__device__ __forceinline__ void mma_rows_kn(float (&acc)[HD / 8][4], const std::uint32_t (&a)[4],
                                            const std::uint16_t* b, int k0, int lane) {
#pragma unroll
  for (int np = 0; np < HD / 16; ++np) {
    std::uint32_t f[4];
    load_b_kn(f, b, HD + kPad, k0, np * 16, lane);
    Tc<T>::mma(acc[2 * np], a, f[0], f[1]);
    Tc<T>::mma(acc[2 * np + 1], a, f[2], f[3]);
  }
}

/// This lane's part of accumulator row r (0: row g, 1: row g + 8) times mul,
/// rounded, at out (the row's element 2t).
template <class T, int HD>
__device__ __forceinline__ void store_row(std::uint16_t* out, const float (&acc)[HD / 8][4],
                                          int r, float mul) {
#pragma unroll
  for (int n = 0; n < HD / 8; ++n)
    *reinterpret_cast<std::uint32_t*>(out + n * 8) =
        Tc<T>::pack(acc[n][2 * r] * mul, acc[n][2 * r + 1] * mul);
}

/// Where this thread is: its lane's coordinates in the mma fragments (g =
/// lane / 4, t = lane % 4) and the (batch, head) of blockIdx.x.
struct Place {
  int tid, warp, lane, g, t;
  std::int64_t bh, b, h;
  __device__ __forceinline__ explicit Place(std::int64_t heads)
      : tid(threadIdx.x), warp(tid / 32), lane(tid % 32), g(lane / 4), t(lane % 4),
        bh(blockIdx.x), b(bh / heads), h(bh % heads) {}
  /// Query tile of blockIdx.y, longest causal rows first (short blocks last).
  __device__ __forceinline__ int longest_first() const {
    return static_cast<int>(gridDim.y - 1 - blockIdx.y);
  }
};

struct FwdParams {
  const std::uint16_t* qkv;
  std::uint16_t* ctx;
  float* lse;
  std::int64_t seq, d, heads;
  float scale, scale_log2;
};

struct BwdParams {
  const std::uint16_t* qkv;
  const std::uint16_t* ctx;
  const std::uint16_t* dout;
  const float* lse;
  float* delta;
  std::uint16_t* dqkv;
  std::int64_t seq, d, heads;
  float scale, scale_log2;
};

// --- forward ----------------------------------------------------------------

template <class T, int HD>
__global__ void __launch_bounds__(kThreads) flash_forward_kernel(const FwdParams p) {
  constexpr int BM = 64, BN = 64, LD = HD + kPad;
  auto* sq = reinterpret_cast<std::uint16_t*>(flash_smem);
  std::uint16_t* sk = sq + BM * LD;      // [2][BN][LD]
  std::uint16_t* sv = sk + 2 * BN * LD;  // [2][BN][LD]
  const Place at(p.heads);
  const int tid = at.tid, warp = at.warp, lane = at.lane, g = at.g, t = at.t;
  const std::int64_t bh = at.bh, b = at.b, h = at.h, ld = 3 * p.d;
  const int qb = at.longest_first();
  const std::int64_t q0 = std::int64_t(qb) * BM;
  const std::uint16_t* head = p.qkv + b * p.seq * ld + h * HD;

  load_tile<BM, HD>(sq, head + q0 * ld, ld, p.seq - q0, tid);
  load_kv<BN, HD>(sk, sv, head, 0, p.d, p.seq, tid);
  cp_async_commit();

  // Key tiles 0..qb: tile qb is the diagonal one (BM == BN, aligned), the only
  // one needing the mask; every row sees at least key 0 of tile 0, so the
  // running max is finite from the first tile on.
  const int nkb = qb + 1;
  std::uint32_t qf[HD / 16][4];
  float o[HD / 8][4];
  zero(o);
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};

  for (int kb = 0; kb < nkb; ++kb) {
    const int buf = kb & 1;
    pipeline_step(kb + 1 < nkb, [&] {
      load_kv<BN, HD>(sk + (buf ^ 1) * BN * LD, sv + (buf ^ 1) * BN * LD, head,
                      std::int64_t(kb + 1) * BN, p.d, p.seq, tid);
    });
    if (kb == 0) {
#pragma unroll
      for (int kk = 0; kk < HD / 16; ++kk) load_a(qf[kk], sq, LD, warp * 16, kk * 16, lane);
    }
    const std::uint16_t* ks = sk + buf * BN * LD;
    const std::uint16_t* vs = sv + buf * BN * LD;

    float s[BN / 8][4];
    zero(s);
#pragma unroll
    for (int kk = 0; kk < HD / 16; ++kk) {
#pragma unroll
      for (int np = 0; np < BN / 16; ++np) {
        std::uint32_t bf[4];
        load_b_nk(bf, ks, LD, np * 16, kk * 16, lane);
        Tc<T>::mma(s[2 * np], qf[kk], bf[0], bf[1]);
        Tc<T>::mma(s[2 * np + 1], qf[kk], bf[2], bf[3]);
      }
    }
    if (kb == nkb - 1) {
      // Key index within the tile vs query index within the tile (k0 == q0).
#pragma unroll
      for (int n = 0; n < BN / 8; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e)
          if (n * 8 + 2 * t + (e & 1) > warp * 16 + g + (e >> 1) * 8) s[n][e] = -INFINITY;
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float mx = m[r];
#pragma unroll
      for (int n = 0; n < BN / 8; ++n) mx = fmaxf(mx, fmaxf(s[n][2 * r], s[n][2 * r + 1]));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      const float base = mx * p.scale_log2;  // finite: see nkb above
      const float alpha = exp2f(m[r] * p.scale_log2 - base);  // 0 when m[r] = -inf
      m[r] = mx;
      float sum = 0.f;  // this lane's part; the quad's sum is taken at the end
#pragma unroll
      for (int n = 0; n < BN / 8; ++n) {
        s[n][2 * r] = exp2f(s[n][2 * r] * p.scale_log2 - base);
        s[n][2 * r + 1] = exp2f(s[n][2 * r + 1] * p.scale_log2 - base);
        sum += s[n][2 * r] + s[n][2 * r + 1];
      }
      l[r] = l[r] * alpha + sum;
#pragma unroll
      for (int n = 0; n < HD / 8; ++n) {
        o[n][2 * r] *= alpha;
        o[n][2 * r + 1] *= alpha;
      }
    }
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk) {
      std::uint32_t a[4];
      acc_to_a<T>(a, s[2 * kk], s[2 * kk + 1]);
      mma_rows_kn<T, HD>(o, a, vs, kk * 16, lane);
    }
    __syncthreads();  // the next iteration's prefetch overwrites this buffer
  }

#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float sum = l[r];
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    sum += __shfl_xor_sync(0xffffffffu, sum, 2);
    const std::int64_t row = q0 + warp * 16 + g + r * 8;
    if (row < p.seq) {
      store_row<T, HD>(p.ctx + (b * p.seq + row) * p.d + h * HD + 2 * t, o, r, 1.f / sum);
      if (t == 0) p.lse[bh * p.seq + row] = m[r] * p.scale + logf(sum);
    }
  }
}

// --- backward ---------------------------------------------------------------

// delta[(b*heads + h)*seq + i] = sum_c dO * O; threads walk (token, head) so
// that neighbours read neighbouring memory.
template <class T, int HD>
__global__ void flash_delta_kernel(const BwdParams p, std::int64_t n) {
  const std::int64_t r = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (r >= n) return;
  const std::int64_t token = r / p.heads, h = r % p.heads;
  const std::int64_t b = token / p.seq, i = token % p.seq;
  const std::int64_t off = token * p.d + h * HD;
  const uint4* o4 = reinterpret_cast<const uint4*>(p.ctx + off);
  const uint4* d4 = reinterpret_cast<const uint4*>(p.dout + off);
  float s = 0.f;
#pragma unroll
  for (int c = 0; c < HD / 8; ++c) {
    const uint4 x = o4[c], y = d4[c];
    const unsigned xs[4] = {x.x, x.y, x.z, x.w}, ys[4] = {y.x, y.y, y.z, y.w};
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      s += Tc<T>::widen(static_cast<std::uint16_t>(xs[k] & 0xffffu)) *
           Tc<T>::widen(static_cast<std::uint16_t>(ys[k] & 0xffffu));
      s += Tc<T>::widen(static_cast<std::uint16_t>(xs[k] >> 16)) *
           Tc<T>::widen(static_cast<std::uint16_t>(ys[k] >> 16));
    }
  }
  p.delta[(b * p.heads + h) * p.seq + i] = s;
}

template <int HD>
struct BwdTiles {
  static constexpr int kv_chunk = HD == 128 ? 32 : 64;  // rows streamed per step
};

template <class T, int HD>
__global__ void __launch_bounds__(kThreads) flash_dkdv_kernel(const BwdParams p) {
  constexpr int BN = 64, BM = BwdTiles<HD>::kv_chunk, LD = HD + kPad;
  auto* sk = reinterpret_cast<std::uint16_t*>(flash_smem);
  std::uint16_t* sv = sk + BN * LD;
  std::uint16_t* sq = sv + BN * LD;        // [2][BM][LD]
  std::uint16_t* sdo = sq + 2 * BM * LD;   // [2][BM][LD]
  auto* slse = reinterpret_cast<float*>(sdo + 2 * BM * LD);  // [2][BM]
  float* sdel = slse + 2 * BM;                                 // [2][BM]
  const Place at(p.heads);
  const int tid = at.tid, warp = at.warp, lane = at.lane, g = at.g, t = at.t;
  const std::int64_t bh = at.bh, b = at.b, h = at.h, ld = 3 * p.d;
  const std::int64_t k0 = std::int64_t(blockIdx.y) * BN;  // key tile 0 (most work) first
  const std::uint16_t* head = p.qkv + b * p.seq * ld + h * HD;
  const std::uint16_t* dhead = p.dout + b * p.seq * p.d + h * HD;
  const float* lse = p.lse + bh * p.seq;
  const float* del = p.delta + bh * p.seq;

  load_kv<BN, HD>(sk, sv, head, k0, p.d, p.seq, tid);
  auto load_chunk = [&](int buf, std::int64_t qc) {
    load_tile<BM, HD>(sq + buf * BM * LD, head + qc * ld, ld, p.seq - qc, tid);
    load_tile<BM, HD>(sdo + buf * BM * LD, dhead + qc * p.d, p.d, p.seq - qc, tid);
    load_vec(slse + buf * BM, lse + qc, BM, p.seq - qc, tid);
    load_vec(sdel + buf * BM, del + qc, BM, p.seq - qc, tid);
  };
  load_chunk(0, k0);  // queries before k0 see none of these keys
  cp_async_commit();

  float dk[HD / 8][4], dv[HD / 8][4];
  zero(dk);
  zero(dv);
  const std::int64_t key0 = k0 + warp * 16 + g;  // this lane's keys: key0, key0 + 8
  const int nchunks = static_cast<int>((p.seq - k0 + BM - 1) / BM);

  for (int c = 0; c < nchunks; ++c) {
    const int buf = c & 1;
    const std::int64_t qc = k0 + std::int64_t(c) * BM;
    pipeline_step(c + 1 < nchunks, [&] { load_chunk(buf ^ 1, qc + BM); });
    const std::uint16_t* qs = sq + buf * BM * LD;
    const std::uint16_t* dos = sdo + buf * BM * LD;
    const float* ls = slse + buf * BM;
    const float* ds = sdel + buf * BM;

    // S^T = K Q^T and dP^T = V dO^T: [16 keys of this warp] x [BM queries].
    float st[BM / 8][4], dpt[BM / 8][4];
    two_products_nt<T, HD, BM>(st, dpt, sk, qs, sv, dos, warp * 16, lane);
    // P^T = exp(scale s - lse), dS^T = P^T (dP^T - delta); masked where the
    // key comes after the query (diagonal chunks) or the query is padding.
    const bool edge = qc < k0 + BN || qc + BM > p.seq;
#pragma unroll
    for (int n = 0; n < BM / 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int col = n * 8 + 2 * t + (e & 1);
        const std::int64_t query = qc + col, key = key0 + (e >> 1) * 8;
        float pv = exp2f(st[n][e] * p.scale_log2 - ls[col] * kLog2e);
        if (edge && (key > query || query >= p.seq)) pv = 0.f;
        st[n][e] = pv;
        dpt[n][e] = pv * (dpt[n][e] - ds[col]);
      }
    // dV += P^T dO, dK += dS^T Q (the scale is applied once at the end).
#pragma unroll
    for (int kk = 0; kk < BM / 16; ++kk) {
      std::uint32_t pa[4], sa[4];
      acc_to_a<T>(pa, st[2 * kk], st[2 * kk + 1]);
      acc_to_a<T>(sa, dpt[2 * kk], dpt[2 * kk + 1]);
      mma_rows_kn<T, HD>(dv, pa, dos, kk * 16, lane);
      mma_rows_kn<T, HD>(dk, sa, qs, kk * 16, lane);
    }
    __syncthreads();
  }

#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const std::int64_t key = key0 + r * 8;
    if (key >= p.seq) continue;
    std::uint16_t* row = p.dqkv + (b * p.seq + key) * ld + h * HD + 2 * t;
    store_row<T, HD>(row + p.d, dk, r, p.scale);
    store_row<T, HD>(row + 2 * p.d, dv, r, 1.f);
  }
}

template <class T, int HD>
__global__ void __launch_bounds__(kThreads) flash_dq_kernel(const BwdParams p) {
  constexpr int BM = 64, BN = BwdTiles<HD>::kv_chunk, LD = HD + kPad;
  auto* sq = reinterpret_cast<std::uint16_t*>(flash_smem);
  std::uint16_t* sdo = sq + BM * LD;
  std::uint16_t* sk = sdo + BM * LD;     // [2][BN][LD]
  std::uint16_t* sv = sk + 2 * BN * LD;  // [2][BN][LD]
  const Place at(p.heads);
  const int tid = at.tid, warp = at.warp, lane = at.lane, g = at.g, t = at.t;
  const std::int64_t bh = at.bh, b = at.b, h = at.h, ld = 3 * p.d;
  const int qb = at.longest_first();
  const std::int64_t q0 = std::int64_t(qb) * BM;
  const std::uint16_t* head = p.qkv + b * p.seq * ld + h * HD;

  load_tile<BM, HD>(sq, head + q0 * ld, ld, p.seq - q0, tid);
  load_tile<BM, HD>(sdo, p.dout + (b * p.seq + q0) * p.d + h * HD, p.d, p.seq - q0, tid);
  load_kv<BN, HD>(sk, sv, head, 0, p.d, p.seq, tid);
  cp_async_commit();

  float lse2[2], del[2];  // this lane's rows: row0, row0 + 8 (padding rows: 0)
  const std::int64_t row0 = q0 + warp * 16 + g;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const std::int64_t row = row0 + r * 8;
    lse2[r] = row < p.seq ? p.lse[bh * p.seq + row] * kLog2e : 0.f;
    del[r] = row < p.seq ? p.delta[bh * p.seq + row] : 0.f;
  }
  float dq[HD / 8][4];
  zero(dq);
  const std::int64_t kend = q0 + BM < p.seq ? q0 + BM : p.seq;
  const int nchunks = static_cast<int>((kend + BN - 1) / BN);

  for (int c = 0; c < nchunks; ++c) {
    const int buf = c & 1;
    const std::int64_t kc = std::int64_t(c) * BN;
    pipeline_step(c + 1 < nchunks, [&] {
      load_kv<BN, HD>(sk + (buf ^ 1) * BN * LD, sv + (buf ^ 1) * BN * LD, head, kc + BN, p.d,
                      p.seq, tid);
    });
    const std::uint16_t* ks = sk + buf * BN * LD;
    const std::uint16_t* vs = sv + buf * BN * LD;

    // S = Q K^T and dP = dO V^T: [16 queries of this warp] x [BN keys].
    float s[BN / 8][4], dp[BN / 8][4];
    two_products_nt<T, HD, BN>(s, dp, sq, ks, sdo, vs, warp * 16, lane);
    const bool diagonal = kc + BN > q0;
#pragma unroll
    for (int n = 0; n < BN / 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = e >> 1;
        const std::int64_t key = kc + n * 8 + 2 * t + (e & 1), row = row0 + r * 8;
        float pv = exp2f(s[n][e] * p.scale_log2 - lse2[r]);
        if (diagonal && key > row) pv = 0.f;
        dp[n][e] = pv * (dp[n][e] - del[r]);
      }
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk) {  // dQ += dS K
      std::uint32_t sa[4];
      acc_to_a<T>(sa, dp[2 * kk], dp[2 * kk + 1]);
      mma_rows_kn<T, HD>(dq, sa, ks, kk * 16, lane);
    }
    __syncthreads();
  }

#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const std::int64_t row = row0 + r * 8;
    if (row < p.seq)
      store_row<T, HD>(p.dqkv + (b * p.seq + row) * ld + h * HD + 2 * t, dq, r, p.scale);
  }
}

// --- launch -----------------------------------------------------------------

using cuda_launch::check_launch;

// Every tile kernel: kThreads threads, dynamic shared memory, the Kokkos stream.
template <class Kernel, class Params>
void launch_tiles(Kernel kernel, const char* name, dim3 grid, std::size_t smem,
                  const Params& params) {
  cuda_launch::launch_with_smem(kernel, name, grid, kThreads, smem,
                                Kokkos::DefaultExecutionSpace().cuda_stream(), params);
}

bool aligned16(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; }

template <class T>
bool tensor_core_path(const FlashArgs<T>& a) {
  if constexpr (!is_low_precision_v<T>) {
    (void)a;
    return false;
  } else {
    const std::int64_t hd = a.head_dim();
    if (hd != 64 && hd != 128) return false;
    // 16-byte cp.async and vector loads: every row start must be 16-byte
    // aligned, which d % 8 == 0 (true for these hd) and aligned bases give.
    for (const void* ptr : {static_cast<const void*>(a.qkv), static_cast<const void*>(a.ctx),
                            static_cast<const void*>(a.dctx), static_cast<const void*>(a.out)})
      if (ptr != nullptr && !aligned16(ptr)) return false;
    const std::int64_t tiles = (a.seq + 63) / 64;
    return tiles <= 65535 && a.batch * a.heads <= std::numeric_limits<int>::max();
  }
}

template <class T, int HD>
void forward_tc(const FlashArgs<T>& a) {
  constexpr int LD = HD + kPad;
  FwdParams p{reinterpret_cast<const std::uint16_t*>(a.qkv),
              reinterpret_cast<std::uint16_t*>(a.out),
              a.lse,
              a.seq,
              a.d,
              a.heads,
              1.f / std::sqrt(static_cast<float>(HD)),
              0.f};
  p.scale_log2 = p.scale * kLog2e;
  const dim3 grid(static_cast<unsigned>(a.batch * a.heads), static_cast<unsigned>((a.seq + 63) / 64));
  const std::size_t smem = (64 + 4 * 64) * LD * sizeof(std::uint16_t);
  launch_tiles(flash_forward_kernel<T, HD>, "kshard flash_forward_kernel", grid, smem, p);
}

template <class T, int HD>
void backward_tc(const FlashArgs<T>& a) {
  constexpr int LD = HD + kPad, C = BwdTiles<HD>::kv_chunk;
  BwdParams p{reinterpret_cast<const std::uint16_t*>(a.qkv),
              reinterpret_cast<const std::uint16_t*>(a.ctx),
              reinterpret_cast<const std::uint16_t*>(a.dctx),
              a.lse_in,
              a.delta,
              reinterpret_cast<std::uint16_t*>(a.out),
              a.seq,
              a.d,
              a.heads,
              1.f / std::sqrt(static_cast<float>(HD)),
              0.f};
  p.scale_log2 = p.scale * kLog2e;
  cudaStream_t stream = Kokkos::DefaultExecutionSpace().cuda_stream();
  const std::int64_t n = a.batch * a.seq * a.heads;
  const std::int64_t blocks = (n + 255) / 256;
  if (blocks > std::numeric_limits<int>::max())
    throw Error("flash_attention_backward: " + std::to_string(n) + " rows",
                "batch*seq*heads below 2^39");
  flash_delta_kernel<T, HD><<<static_cast<unsigned>(blocks), 256, 0, stream>>>(p, n);
  check_launch("kshard flash_delta_kernel");
  const dim3 grid(static_cast<unsigned>(a.batch * a.heads), static_cast<unsigned>((a.seq + 63) / 64));
  // dK/dV: K, V tiles + double-buffered Q, dO chunks + lse, delta chunks.
  const std::size_t smem_kv = (2 * 64 + 4 * C) * LD * sizeof(std::uint16_t) + 4 * C * sizeof(float);
  launch_tiles(flash_dkdv_kernel<T, HD>, "kshard flash_dkdv_kernel", grid, smem_kv, p);
  // dQ: Q, dO tiles + double-buffered K, V chunks.
  const std::size_t smem_q = (2 * 64 + 4 * C) * LD * sizeof(std::uint16_t);
  launch_tiles(flash_dq_kernel<T, HD>, "kshard flash_dq_kernel", grid, smem_q, p);
}

// cuDNN's fused attention where it serves these arguments, else tensor cores
// where tensor_core_path says so (tc(args, integral_constant<hd>)), float on
// the f32 kernels where flash_f32_serves says so, else the portable kernel;
// tc is never instantiated for float/double.
#if defined(KSHARD_HAVE_CUDNN)
template <class T>
CudnnAttentionArgs cudnn_args(const FlashArgs<T>& a) {
  CudnnAttentionArgs c;
  c.f16 = std::is_same_v<T, float16_t>;
  c.batch = a.batch;
  c.seq = a.seq;
  c.d = a.d;
  c.heads = a.heads;
  c.qkv = a.qkv;
  c.ctx = a.ctx;
  c.dctx = a.dctx;
  c.out = a.out;
  c.lse = a.lse;
  c.lse_in = a.lse_in;
  return c;
}

// cuDNN's graphs and handle go in Kokkos::finalize, while the CUDA context
// they belong to still exists. Registered at the first cuDNN run.
void release_cudnn_at_finalize() {
  static const bool hooked = [] {
    Kokkos::push_finalize_hook([] { cudnn_attention_release(); });
    return true;
  }();
  (void)hooked;
}
#endif

template <class T>
bool cudnn_path(const FlashArgs<T>& a, bool backward) {
#if defined(KSHARD_HAVE_CUDNN)
  if constexpr (is_low_precision_v<T>) {
    return vendor_attention_enabled() && cudnn_attention_serves(cudnn_args(a), backward, nullptr);
  }
#endif
  (void)a;
  (void)backward;
  return false;
}

#if defined(KSHARD_HAVE_CUDNN)
// Runs cuDNN's graph with a workspace from the buffer pool for this call only
// (asking flash_attention_path allocates nothing): live, and counted by the
// memory tracker, while cuDNN runs, as PyTorch's caching allocator hands its
// attention workspaces out per call. The large model's deterministic
// backward wants 128 MiB; kept between calls it would sit under every peak.
template <class T>
void run_cudnn(const FlashArgs<T>& a, bool backward) {
  release_cudnn_at_finalize();
  const CudnnAttentionArgs c = cudnn_args(a);
  std::int64_t bytes = 0;
  cudnn_attention_serves(c, backward, &bytes);
  const memory::Block w =
      memory::acquire(static_cast<std::size_t>(bytes), "kshard::cudnn_attention.workspace");
  cudnn_attention_run(c, backward, Kokkos::DefaultExecutionSpace().cuda_stream(), w.data());
  // The block goes back to the pool with cuDNN's kernels queued: later users
  // are ordered after them on the one stream (kshard/core/buffer_pool.hpp).
}
#endif

template <class T, class TensorCores>
void dispatch(const FlashArgs<T>& a, bool backward, TensorCores tc,
              void (*portable)(const FlashArgs<T>&)) {
  if constexpr (is_low_precision_v<T>) {
#if defined(KSHARD_HAVE_CUDNN)
    if (cudnn_path(a, backward)) {
      run_cudnn(a, backward);
      return;
    }
#endif
    if (tensor_core_path(a)) {
      if (a.head_dim() == 64)
        tc(a, std::integral_constant<int, 64>());
      else
        tc(a, std::integral_constant<int, 128>());
      return;
    }
  }
  if constexpr (std::is_same_v<T, float>) {
    if (flash_f32_serves(a)) {
      cudaStream_t stream = Kokkos::DefaultExecutionSpace().cuda_stream();
      if (backward)
        flash_f32_backward(a, stream);
      else
        flash_f32_forward(a, stream);
      return;
    }
  }
  portable(a);
}

}  // namespace

template <class T>
const char* flash_attention_path(const FlashArgs<T>& a) {
  // The forward's path (the backward's is the same unless cuDNN declines only
  // the backward graph of a shape).
  if (cudnn_path(a, false)) return "cuDNN";
  if (tensor_core_path(a)) return "tensor cores";
  if constexpr (std::is_same_v<T, float>) {
    if (flash_f32_serves(a)) return "f32 kernel";
  }
  return "portable kernel";
}

template <class T>
void flash_attention_forward_backend(const FlashArgs<T>& a) {
  dispatch(a, false,
           [](const auto& args, auto hd) { forward_tc<T, decltype(hd)::value>(args); },
           flash_attention_forward_portable<T>);
}

template <class T>
void flash_attention_backward_backend(const FlashArgs<T>& a) {
  dispatch(a, true,
           [](const auto& args, auto hd) { backward_tc<T, decltype(hd)::value>(args); },
           flash_attention_backward_portable<T>);
}

#define KSHARD_FLASH_CUDA_INSTANTIATE(T)                                      \
  template void flash_attention_forward_backend<T>(const FlashArgs<T>&);      \
  template void flash_attention_backward_backend<T>(const FlashArgs<T>&);     \
  template const char* flash_attention_path<T>(const FlashArgs<T>&);
KSHARD_FLASH_CUDA_INSTANTIATE(float)
KSHARD_FLASH_CUDA_INSTANTIATE(double)
KSHARD_FLASH_CUDA_INSTANTIATE(bfloat16_t)
KSHARD_FLASH_CUDA_INSTANTIATE(float16_t)
#undef KSHARD_FLASH_CUDA_INSTANTIATE

}  // namespace kshard::detail
