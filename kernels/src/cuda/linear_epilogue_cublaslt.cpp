// CUDA backend of linear_epilogue.hpp: one cuBLASLt matmul whose epilogue adds
// the bias (and applies GELU, keeping the pre-activation as the epilogue's
// auxiliary output), for bf16/f16 operands with f32 accumulation and for f32
// (exact f32 compute unless TF32 is allowed, as cublasGemmEx in
// gemm_cublas.cpp: the same products, with the bias / GELU pass folded in).
// f64 declines.
//
// Row-major y[rows, out] = x[rows, in] W[out, in]^T is, column-major,
// y^T[out, rows] = (W as [in, out])^T x^T: A = W with op T, B = x with op N,
// m = out, n = rows, k = in; the bias is a vector of m (one per output
// feature), broadcast over the n columns, which is what cuBLASLt's BIAS
// epilogue does.
//
// Plans are cached per shape, type, epilogue and pointer alignment
// (cublaslt_context.hpp's plan_cache).
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <Kokkos_Core.hpp>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <type_traits>

#include "kshard/kernels/linear_epilogue.hpp"
#include "kshard/kernels/gemm.hpp"
#include "kshard/error.hpp"
#include "cublas_workspace.hpp"
#include "cublaslt_context.hpp"
#include "sanitizer_marks.hpp"
#include "kshard/numeric/compute.hpp"

namespace kshard::detail {
namespace {

struct EpiloguePlans;  // plan_cache tag
using Plan = LtPlan;

// (type, rows, in, out, epilogue, alignments of x, w, b, y, pre)
using Key = std::tuple<int, std::int64_t, std::int64_t, std::int64_t, int, std::uint32_t,
                       std::uint32_t, std::uint32_t, std::uint32_t, std::uint32_t>;

template <class T>
cudaDataType_t cuda_type() {
  if constexpr (std::is_same_v<T, bfloat16_t>) return CUDA_R_16BF;
  if constexpr (std::is_same_v<T, float>) return CUDA_R_32F;
  return CUDA_R_16F;
}

// f32 follows the TF32 switch (kshard::set_allow_tf32); 16-bit operands
// always accumulate in f32.
template <class T>
cublasComputeType_t compute_type() {
  if constexpr (std::is_same_v<T, float>)
    return allow_tf32() ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  return CUBLAS_COMPUTE_32F;
}

// Plan key's type field: the operand type, and for f32 whether TF32 is on.
template <class T>
int type_key() {
  if constexpr (std::is_same_v<T, bfloat16_t>) return 0;
  if constexpr (std::is_same_v<T, float16_t>) return 1;
  return allow_tf32() ? 3 : 2;
}

template <class T>
Plan make_plan(CublasLt& s, std::int64_t rows, std::int64_t in, std::int64_t out,
               LinearEpilogue e, const Key& key) {
  Plan p;
  const cudaDataType_t t = cuda_type<T>();
  create_tn_desc(p, compute_type<T>());
  const cublasLtEpilogue_t epi =
      e == LinearEpilogue::bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
  check_cublas(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)),
        "cublasLtMatmulDescSetAttribute(EPILOGUE)");
  if (e == LinearEpilogue::bias_gelu) {
    const std::int64_t ld = out;
    check_cublas(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld,
                                         sizeof(ld)),
          "cublasLtMatmulDescSetAttribute(EPILOGUE_AUX_LD)");
  }
  // A = W: column-major [in, out], ld in; B = x: [in, rows], ld in; D: [out, rows], ld out.
  check_cublas(cublasLtMatrixLayoutCreate(&p.a, t, std::uint64_t(in), std::uint64_t(out), in),
        "cublasLtMatrixLayoutCreate(A)");
  check_cublas(cublasLtMatrixLayoutCreate(&p.b, t, std::uint64_t(in), std::uint64_t(rows), in),
        "cublasLtMatrixLayoutCreate(B)");
  check_cublas(cublasLtMatrixLayoutCreate(&p.d, t, std::uint64_t(out), std::uint64_t(rows), out),
        "cublasLtMatrixLayoutCreate(D)");

  // Operand alignments (key: x, w, b, y, pre): A is W, B is x, C and D are y.
  choose_algorithm(s, p, std::get<6>(key), std::get<5>(key), std::get<8>(key));
  return p;
}

}  // namespace

template <class T>
bool linear_epilogue_backend(std::int64_t rows, std::int64_t in, std::int64_t out, const T* x,
                             const T* w, const T* b, T* y, LinearEpilogue e, T* pre) {
  if constexpr (std::is_same_v<T, double>) {
    (void)rows, (void)in, (void)out, (void)x, (void)w, (void)b, (void)y, (void)e, (void)pre;
    return false;
  } else {
    // Bias and auxiliary pointers have no alignment preference to declare:
    // use the epilogue only where they (and the leading dimensions) are
    // 16-byte aligned, which every tensor-core-friendly shape gives.
    if (rows == 0 || in % 8 != 0 || out % 8 != 0 || pointer_alignment(b) < 16 ||
        (e == LinearEpilogue::bias_gelu && pointer_alignment(pre) < 16))
      return false;
    std::lock_guard<std::mutex> lock(cublaslt_mutex());
    CublasLt& s = cublaslt();
    const Key key{type_key<T>(), rows, in, out, int(e),
                  pointer_alignment(x), pointer_alignment(w), pointer_alignment(b),
                  pointer_alignment(y), e == LinearEpilogue::bias_gelu ? pointer_alignment(pre) : 256u};
    auto& cache = plan_cache<EpiloguePlans, Key>();
    auto it = cache.find(key);
    if (it == cache.end()) it = cache.emplace(key, make_plan<T>(s, rows, in, out, e, key)).first;
    Plan& p = it->second;
    if (!p.ok) return false;  // no algorithm for this case: the caller's two passes
    check_cublas(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &b, sizeof(b)),
          "cublasLtMatmulDescSetAttribute(BIAS_POINTER)");
    if (e == LinearEpilogue::bias_gelu)
      check_cublas(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER,
                                           &pre, sizeof(pre)),
            "cublasLtMatmulDescSetAttribute(EPILOGUE_AUX_POINTER)");
    const float alpha = 1.f, beta = 0.f;
    check_cublas(cublasLtMatmul(s.handle, p.desc, &alpha, w, p.a, x, p.b, &beta, y, p.d, y, p.d, &p.algo,
                         s.workspace, kCublasWorkspaceBytes,
                         Kokkos::DefaultExecutionSpace().cuda_stream()),
          "cublasLtMatmul");
    // y [rows, out] and GELU's input [rows, out] (sanitizer_marks.hpp).
    const cudaStream_t stream = Kokkos::DefaultExecutionSpace().cuda_stream();
    mark_written(stream, y, std::size_t(rows) * std::size_t(out) * sizeof(T));
    if (e == LinearEpilogue::bias_gelu)
      mark_written(stream, pre, std::size_t(rows) * std::size_t(out) * sizeof(T));
    return true;
  }
}

#define KSHARD_LINEAR_EPILOGUE_INSTANTIATE(T)                                                  \
  template bool linear_epilogue_backend<T>(std::int64_t, std::int64_t, std::int64_t, const T*, \
                                           const T*, const T*, T*, LinearEpilogue, T*);
KSHARD_FOR_EACH_COMPUTE_TYPE(KSHARD_LINEAR_EPILOGUE_INSTANTIATE)
#undef KSHARD_LINEAR_EPILOGUE_INSTANTIATE

}  // namespace kshard::detail
