// ci/sanitizer-probe.cu: does compute-sanitizer's initcheck see a cuBLASLt
// bf16 GEMM's output as written? C is touched by nothing but the GEMM; a
// plain kernel then reads all of it. With MARK set in the environment, C is
// first declared initialized through NVTX's memory extension, as kshard does
// after every library call (kernels/src/cuda/sanitizer_marks.hpp).
//
//   nvcc -O2 -arch=sm_90 -o sanitizer-probe ci/sanitizer-probe.cu -lcublasLt -ldl
//   compute-sanitizer --tool initcheck --print-limit 1 ./sanitizer-probe          # H200: 32768 errors
//   MARK=1 compute-sanitizer --tool initcheck --print-limit 1 ./sanitizer-probe   # H200: 0 errors
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cstdio>
#include <cstdlib>
#include <nvtx3/nvToolsExt.h>
#include <nvtx3/nvToolsExtMem.h>
#include <nvtx3/nvToolsExtMemCudaRt.h>
__global__ void sum(const __nv_bfloat16* c, int n, float* out) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) atomicAdd(out, __bfloat162float(c[i]));
}
int main(int argc, char** argv) {
  int M = 256, N = 128, K = 128;
  if (argc > 1) { M = atoi(argv[1]); N = atoi(argv[2]); K = atoi(argv[3]); }
  __nv_bfloat16 *A, *B, *C; float* out;
  cudaMalloc(&A, sizeof(__nv_bfloat16) * M * K); cudaMalloc(&B, sizeof(__nv_bfloat16) * K * N);
  cudaMalloc(&C, sizeof(__nv_bfloat16) * M * N); cudaMalloc(&out, 4);
  cudaMemset(A, 0, sizeof(__nv_bfloat16) * M * K); cudaMemset(B, 0, sizeof(__nv_bfloat16) * K * N);
  cudaMemset(out, 0, 4);
  void* ws; size_t wsz = 32 << 20; cudaMalloc(&ws, wsz);
  cublasLtHandle_t h; cublasLtCreate(&h);
  cublasLtMatmulDesc_t op; cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F);
  cublasLtMatrixLayout_t la, lb, lc;
  // column-major: C[N x M] = B^T... keep it simple: C(MxN) = A(MxK) * B(KxN), col-major
  cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, M, K, M);
  cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, K, N, K);
  cublasLtMatrixLayoutCreate(&lc, CUDA_R_16BF, M, N, M);
  cublasLtMatmulPreference_t pref; cublasLtMatmulPreferenceCreate(&pref);
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsz, sizeof wsz);
  cublasLtMatmulHeuristicResult_t res; int got = 0;
  cublasLtMatmulAlgoGetHeuristic(h, op, la, lb, lc, lc, pref, 1, &res, &got);
  float alpha = 1, beta = 0;
  cublasStatus_t st = cublasLtMatmul(h, op, &alpha, A, la, B, lb, &beta, C, lc, C, lc, &res.algo, ws, wsz, 0);
  if (getenv("MARK")) {
    nvtxMemVirtualRangeDesc_t r{sizeof(__nv_bfloat16) * M * N, C};
    nvtxMemMarkInitializedBatch_t b{};
    b.extCompatID = NVTX_EXT_COMPATID_MEM; b.structSize = sizeof b;
    b.regionType = NVTX_MEM_TYPE_VIRTUAL_ADDRESS; b.regionDescCount = 1;
    b.regionDescElementSize = sizeof r; b.regionDescElements = &r;
    nvtxMemCudaMarkInitialized(nvtxDomainCreateA("probe"), 0, 0, &b);
  }
  cudaDeviceSynchronize();
  printf("M %d N %d K %d: heuristics %d, matmul status %d\n", M, N, K, got, int(st));
  fflush(stdout);
  sum<<<(M * N + 255) / 256, 256>>>(C, M * N, out);
  cudaDeviceSynchronize();
  printf("M %d N %d K %d: heuristics %d, matmul status %d, %s\n", M, N, K, got, int(st), cudaGetErrorString(cudaGetLastError()));
  return 0;
}
