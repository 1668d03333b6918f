// Host emulation of the CUDA primitives used by flash_attention_cuda.cpp and
// flash_attention_f32_cuda.cpp:
// one std::thread per CUDA thread, barriers for __syncthreads and for the
// warp-collective operations (shfl, ldmatrix, mma), synchronous cp.async.
#pragma once
#include <array>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>
#include "kshard/numeric/convert.hpp"
#include "kshard/numeric/types.hpp"

#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __align__(x)

struct dim3 {
  unsigned x = 1, y = 1, z = 1;
  dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {}
};
struct uint4 { unsigned x, y, z, w; };
struct alignas(16) float4 { float x, y, z, w; };
inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }
using cudaStream_t = void*;
enum cudaError_t { cudaSuccess = 0 };
enum cudaFuncAttribute { cudaFuncAttributeMaxDynamicSharedMemorySize };
inline cudaError_t cudaGetLastError() { return cudaSuccess; }
inline const char* cudaGetErrorName(cudaError_t) { return "x"; }
inline const char* cudaGetErrorString(cudaError_t) { return "x"; }
template <class F> cudaError_t cudaFuncSetAttribute(F, cudaFuncAttribute, int) { return cudaSuccess; }
enum cudaDeviceAttr { cudaDevAttrMaxSharedMemoryPerBlockOptin };
inline cudaError_t cudaGetDevice(int* d) { *d = 0; return cudaSuccess; }
// An H100 / H200's opt-in shared memory per block (227 KiB).
inline cudaError_t cudaDeviceGetAttribute(int* v, cudaDeviceAttr, int) { *v = 232448; return cudaSuccess; }
inline cudaStream_t emu_stream() { return nullptr; }

class Barrier {
 public:
  explicit Barrier(int n) : n_(n) {}
  void wait() {
    std::unique_lock<std::mutex> l(m_);
    const long gen = gen_;
    if (++count_ == n_) { count_ = 0; ++gen_; cv_.notify_all(); return; }
    cv_.wait(l, [&] { return gen_ != gen; });
  }
 private:
  std::mutex m_; std::condition_variable cv_; int n_, count_ = 0; long gen_ = 0;
};

struct Slot { std::uint64_t v[12]; const void* p; };
struct Warp { Barrier bar{32}; std::array<Slot, 32> s; };
struct BlockCtx { std::unique_ptr<Barrier> bar; std::vector<std::unique_ptr<Warp>> warps; unsigned char* smem; };

inline thread_local dim3 threadIdx, blockIdx;
inline dim3 gridDim, blockDim;
inline thread_local BlockCtx* emu_block = nullptr;
inline thread_local unsigned char* flash_smem = nullptr;

inline void __syncthreads() { emu_block->bar->wait(); }
inline Warp& my_warp() { return *emu_block->warps[threadIdx.x / 32]; }
inline int my_lane() { return threadIdx.x % 32; }

inline float __shfl_xor_sync(unsigned, float v, int m) {
  Warp& w = my_warp(); const int l = my_lane();
  std::memcpy(&w.s[l].v[0], &v, 4); w.bar.wait();
  float r; std::memcpy(&r, &w.s[l ^ m].v[0], 4); w.bar.wait();
  return r;
}

template <class... KArgs, class... Args>
void emu_launch_impl(void (*k)(KArgs...), dim3 grid, int threads, std::size_t smem, Args... args) {
  gridDim = grid; blockDim = dim3(threads);
  std::vector<unsigned char> mem(smem + 16);
  for (unsigned by = 0; by < grid.y; ++by)
    for (unsigned bx = 0; bx < grid.x; ++bx) {
      BlockCtx ctx; ctx.bar = std::make_unique<Barrier>(threads);
      for (int w = 0; w < (threads + 31) / 32; ++w) ctx.warps.push_back(std::make_unique<Warp>());
      std::memset(mem.data(), 0xFF, mem.size());  // poison shared memory
      ctx.smem = mem.data();
      std::vector<std::thread> ts;
      for (int t = 0; t < threads; ++t)
        ts.emplace_back([&, t] {
          threadIdx = dim3(t); blockIdx = dim3(bx, by); emu_block = &ctx; flash_smem = ctx.smem;
          k(args...);
        });
      for (auto& th : ts) th.join();
    }
}
#define emu_launch(k, grid, threads, smem, stream, ...) emu_launch_impl(k, grid, threads, smem, __VA_ARGS__)
