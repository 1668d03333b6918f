// CUDA backend of fp8_gemm.hpp: one cuBLASLt matmul per product.
//
// Row-major C[m, n] = A[m, k] B[n, k]^T is, column-major, C^T[n, m] =
// (B as [k, n])^T (A as [k, m]): cuBLASLt's A is our B with op T, its B is
// our A with op N ("TN", the one layout fp8 tensor cores take), m_lt = n,
// n_lt = m. So cuBLASLt's A scale is our B's and its B scale is our A's; the
// bias is a vector of m_lt = n, one per output column, as the epilogue wants.
// Plans are cached per shape, types, epilogue, accumulation mode and pointer
// alignment (cublaslt_context.hpp's plan_cache).
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <Kokkos_Core.hpp>
#include <cstdint>
#include <mutex>
#include <string>
#include <tuple>
#include <type_traits>

#include "kshard/kernels/fp8_gemm.hpp"
#include "kshard/error.hpp"
#include "cublas_workspace.hpp"
#include "cublaslt_context.hpp"
#include "sanitizer_marks.hpp"

namespace kshard::detail {
namespace {

struct Fp8Plans;  // plan_cache tag

// (m, n, k, A format, B format, C is f32, epilogue, fast accum, alignments of A, B, C, bias,
//  pre, A scale mode, B scale mode)
using Key = std::tuple<std::int64_t, std::int64_t, std::int64_t, int, int, bool, int, bool,
                       std::uint32_t, std::uint32_t, std::uint32_t, std::uint32_t, std::uint32_t,
                       int, int>;
using Plan = LtPlan;

cudaDataType_t fp8_type(Fp8Format f) {
  return f == Fp8Format::e4m3 ? CUDA_R_8F_E4M3 : CUDA_R_8F_E5M2;
}

// fp8_blockwise.hpp's layouts are the ones these modes read: 1x128 scales
// outer-dimension fastest, 128x128 tiles k-block fastest in rows of a
// multiple of four.
std::int32_t scale_mode(Fp8ScaleMode m) {
  switch (m) {
    case Fp8ScaleMode::block_1x128: return CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
    case Fp8ScaleMode::block_128x128: return CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;
    default: return CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F;
  }
}

// cuBLASLt's A is our B (and the other way round), so are their scales.
void set_scale_pointers(Plan& p, const Fp8Operand& a, const Fp8Operand& b) {
  check_cublas(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER,
                                              &b.scale_inv, sizeof(b.scale_inv)),
               "cublasLtMatmulDescSetAttribute(A_SCALE_POINTER)");
  check_cublas(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER,
                                              &a.scale_inv, sizeof(a.scale_inv)),
               "cublasLtMatmulDescSetAttribute(B_SCALE_POINTER)");
}

template <class TC>
Plan make_plan(CublasLt& s, std::int64_t m, std::int64_t n, std::int64_t k, const Fp8Operand& a,
               const Fp8Operand& b, const Fp8GemmOptions& opt, const Key& key) {
  constexpr bool f32 = std::is_same_v<TC, float>;
  Plan p;
  create_tn_desc(p, CUBLAS_COMPUTE_32F);
  const std::int8_t fast = opt.fast_accum ? 1 : 0;
  check_cublas(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast,
                                              sizeof(fast)),
               "cublasLtMatmulDescSetAttribute(FAST_ACCUM)");
  if (a.scaling != Fp8ScaleMode::tensor || b.scaling != Fp8ScaleMode::tensor) {
    // cuBLASLt's A is our B: its scale mode too.
    const std::int32_t mode_a = scale_mode(b.scaling), mode_b = scale_mode(a.scaling);
    check_cublas(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE,
                                                &mode_a, sizeof(mode_a)),
                 "cublasLtMatmulDescSetAttribute(A_SCALE_MODE)");
    check_cublas(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE,
                                                &mode_b, sizeof(mode_b)),
                 "cublasLtMatmulDescSetAttribute(B_SCALE_MODE)");
  }
  if (opt.epilogue != Fp8Epilogue::none) {
    const cublasLtEpilogue_t epi = opt.epilogue == Fp8Epilogue::bias
                                       ? CUBLASLT_EPILOGUE_BIAS
                                       : CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
    check_cublas(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi,
                                                sizeof(epi)),
                 "cublasLtMatmulDescSetAttribute(EPILOGUE)");
    const cudaDataType_t bias_t = CUDA_R_16BF;
    check_cublas(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE,
                                                &bias_t, sizeof(bias_t)),
                 "cublasLtMatmulDescSetAttribute(BIAS_DATA_TYPE)");
    if (opt.epilogue == Fp8Epilogue::bias_gelu) {
      const std::int64_t ld = n;
      check_cublas(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD,
                                                  &ld, sizeof(ld)),
                   "cublasLtMatmulDescSetAttribute(EPILOGUE_AUX_LD)");
      const cudaDataType_t aux_t = CUDA_R_16BF;
      check_cublas(cublasLtMatmulDescSetAttribute(
                       p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE, &aux_t, sizeof(aux_t)),
                   "cublasLtMatmulDescSetAttribute(EPILOGUE_AUX_DATA_TYPE)");
    }
  }
  // cuBLASLt's A = our B: [k, n] column-major, ld k; its B = our A: [k, m], ld k.
  check_cublas(cublasLtMatrixLayoutCreate(&p.a, fp8_type(b.format), std::uint64_t(k),
                                          std::uint64_t(n), k),
               "cublasLtMatrixLayoutCreate(A)");
  check_cublas(cublasLtMatrixLayoutCreate(&p.b, fp8_type(a.format), std::uint64_t(k),
                                          std::uint64_t(m), k),
               "cublasLtMatrixLayoutCreate(B)");
  const cudaDataType_t ct = f32 ? CUDA_R_32F : CUDA_R_16BF;
  check_cublas(cublasLtMatrixLayoutCreate(&p.c, ct, std::uint64_t(n), std::uint64_t(m), n),
               "cublasLtMatrixLayoutCreate(C)");
  check_cublas(cublasLtMatrixLayoutCreate(&p.d, ct, std::uint64_t(n), std::uint64_t(m), n),
               "cublasLtMatrixLayoutCreate(D)");
  // The scale pointers before the heuristic: with block scale modes cuBLASLt
  // finds no algorithm without them (CUBLAS_STATUS_NOT_SUPPORTED on the H100,
  // cuBLASLt 13.1); run() sets each call's own.
  set_scale_pointers(p, a, b);
  choose_algorithm(s, p, std::get<9>(key), std::get<8>(key), std::get<10>(key));
  return p;
}

template <class TC>
bool run(std::int64_t m, std::int64_t n, std::int64_t k, const Fp8Operand& a,
         const Fp8Operand& b, TC* c, const Fp8GemmOptions& opt) {
  constexpr bool f32 = std::is_same_v<TC, float>;
  // Bias and auxiliary pointers have no alignment preference to declare:
  // fuse only where they are 16-byte aligned (any tensor-core shape gives that).
  if (opt.epilogue != Fp8Epilogue::none &&
      (pointer_alignment(opt.bias) < 16 ||
       (opt.epilogue == Fp8Epilogue::bias_gelu && pointer_alignment(opt.pre) < 16)))
    return false;
  std::lock_guard<std::mutex> lock(cublaslt_mutex());
  CublasLt& s = cublaslt();
  const Key key{m, n, k, int(a.format), int(b.format), f32, int(opt.epilogue), opt.fast_accum,
                pointer_alignment(a.data), pointer_alignment(b.data), pointer_alignment(c),
                opt.epilogue != Fp8Epilogue::none ? pointer_alignment(opt.bias) : 256u,
                opt.epilogue == Fp8Epilogue::bias_gelu ? pointer_alignment(opt.pre) : 256u,
                int(a.scaling), int(b.scaling)};
  auto& cache = plan_cache<Fp8Plans, Key>();
  auto it = cache.find(key);
  if (it == cache.end()) it = cache.emplace(key, make_plan<TC>(s, m, n, k, a, b, opt, key)).first;
  Plan& p = it->second;
  if (!p.ok) return false;
  set_scale_pointers(p, a, b);
  if (opt.epilogue != Fp8Epilogue::none)
    check_cublas(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                &opt.bias, sizeof(opt.bias)),
                 "cublasLtMatmulDescSetAttribute(BIAS_POINTER)");
  if (opt.epilogue == Fp8Epilogue::bias_gelu)
    check_cublas(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER,
                                                &opt.pre, sizeof(opt.pre)),
                 "cublasLtMatmulDescSetAttribute(EPILOGUE_AUX_POINTER)");
  const float alpha = 1.f, beta = opt.beta;
  const cudaStream_t stream = Kokkos::DefaultExecutionSpace().cuda_stream();
  check_cublas(cublasLtMatmul(s.handle, p.desc, &alpha, b.data, p.a, a.data, p.b, &beta, c, p.c,
                              c, p.d, &p.algo, s.workspace, kCublasWorkspaceBytes, stream),
               "cublasLtMatmul (fp8)");
  mark_written(stream, c, std::size_t(m) * std::size_t(n) * sizeof(TC));
  if (opt.epilogue == Fp8Epilogue::bias_gelu)
    mark_written(stream, opt.pre, std::size_t(m) * std::size_t(n) * sizeof(bfloat16_t));
  return true;
}

}  // namespace

bool fp8_gemm_backend(std::int64_t m, std::int64_t n, std::int64_t k, const Fp8Operand& a,
                      const Fp8Operand& b, bfloat16_t* c, const Fp8GemmOptions& opt) {
  return run(m, n, k, a, b, c, opt);
}
bool fp8_gemm_backend(std::int64_t m, std::int64_t n, std::int64_t k, const Fp8Operand& a,
                      const Fp8Operand& b, float* c, const Fp8GemmOptions& opt) {
  return run(m, n, k, a, b, c, opt);
}

bool fp8_gemm_backend_available(std::string* why, bool blocks) {
  int dev = 0;
  cudaDeviceProp prop{};
  if (cudaGetDevice(&dev) != cudaSuccess || cudaGetDeviceProperties(&prop, dev) != cudaSuccess) {
    if (why) *why = "no CUDA device could be queried";
    return false;
  }
  const bool ok = blocks ? prop.major == 9
                        : prop.major > 8 || (prop.major == 8 && prop.minor >= 9);
  if (!ok && why)
    *why = std::string(prop.name) + " (compute capability " + std::to_string(prop.major) + "." +
           std::to_string(prop.minor) + ")" +
           (blocks ? " has no block-scaled fp8 GEMM in cuBLASLt (Hopper, 9.0)"
                   : " has no fp8 tensor cores (8.9 or newer)");
  return ok;
}

}  // namespace kshard::detail
