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
// A plan (descriptors + the heuristic's algorithm) is made once per shape,
// type, epilogue and pointer alignment and reused: the heuristic costs tens
// of microseconds of host time, a training step calls the same few shapes.
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <Kokkos_Core.hpp>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <type_traits>

#include "../linear_epilogue.hpp"
#include "kshard/engine/kernels/gemm.hpp"
#include "kshard/error.hpp"
#include "cache_config.hpp"
#include "cublas_workspace.hpp"
#include "sanitizer_marks.hpp"
#include "kshard/numeric/compute.hpp"

namespace kshard::detail {
namespace {

void check(cublasStatus_t s, const char* call) {
  if (s != CUBLAS_STATUS_SUCCESS)
    throw Error(std::string(call) + " returned cublasStatus_t " + std::to_string(int(s)),
                "CUBLAS_STATUS_SUCCESS");
}

// Largest power of two (<= 256) dividing the address: what the algorithm may
// assume about each operand (parameters are views into a flat buffer, so
// their alignment varies with the unit's layout).
std::uint32_t alignment(const void* p) {
  std::uintptr_t a = reinterpret_cast<std::uintptr_t>(p);
  std::uint32_t al = 256;
  while (al > 1 && (a % al) != 0) al /= 2;
  return al;
}

struct Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulAlgo_t algo{};
  bool ok = false;  // the heuristic found an algorithm
};

// (type, rows, in, out, epilogue, alignments of x, w, b, y, pre)
using Key = std::tuple<int, std::int64_t, std::int64_t, std::int64_t, int, std::uint32_t,
                       std::uint32_t, std::uint32_t, std::uint32_t, std::uint32_t>;

struct State {
  std::mutex mutex;
  cublasLtHandle_t handle = nullptr;
  void* workspace = nullptr;  // cublas_workspace(), shared with gemm_cublas.cpp
  std::map<Key, Plan> plans;

  void release() {
    for (auto& [key, p] : plans) {
      if (p.a) cublasLtMatrixLayoutDestroy(p.a);
      if (p.b) cublasLtMatrixLayoutDestroy(p.b);
      if (p.d) cublasLtMatrixLayoutDestroy(p.d);
      if (p.desc) cublasLtMatmulDescDestroy(p.desc);
    }
    plans.clear();
    if (handle) cublasLtDestroy(handle);
    handle = nullptr;
    workspace = nullptr;
  }
};

State& state() {
  static State s;
  return s;
}

// Created on first use; destroyed in Kokkos::finalize while the CUDA context
// still exists (like the cuBLAS handle of gemm_cublas.cpp).
void ensure_handle(State& s) {
  if (s.handle) return;
  restore_default_cache_config();
  s.workspace = cublas_workspace();
  check(cublasLtCreate(&s.handle), "cublasLtCreate");
  Kokkos::push_finalize_hook([] {
    State& st = state();
    std::lock_guard<std::mutex> l(st.mutex);
    st.release();
  });
}

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
Plan make_plan(State& s, std::int64_t rows, std::int64_t in, std::int64_t out,
               LinearEpilogue e, const Key& key) {
  Plan p;
  const cudaDataType_t t = cuda_type<T>();
  check(cublasLtMatmulDescCreate(&p.desc, compute_type<T>(), CUDA_R_32F),
        "cublasLtMatmulDescCreate");
  const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  check(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)),
        "cublasLtMatmulDescSetAttribute(TRANSA)");
  check(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)),
        "cublasLtMatmulDescSetAttribute(TRANSB)");
  const cublasLtEpilogue_t epi =
      e == LinearEpilogue::bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
  check(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)),
        "cublasLtMatmulDescSetAttribute(EPILOGUE)");
  if (e == LinearEpilogue::bias_gelu) {
    const std::int64_t ld = out;
    check(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld,
                                         sizeof(ld)),
          "cublasLtMatmulDescSetAttribute(EPILOGUE_AUX_LD)");
  }
  // A = W: column-major [in, out], ld in; B = x: [in, rows], ld in; D: [out, rows], ld out.
  check(cublasLtMatrixLayoutCreate(&p.a, t, std::uint64_t(in), std::uint64_t(out), in),
        "cublasLtMatrixLayoutCreate(A)");
  check(cublasLtMatrixLayoutCreate(&p.b, t, std::uint64_t(in), std::uint64_t(rows), in),
        "cublasLtMatrixLayoutCreate(B)");
  check(cublasLtMatrixLayoutCreate(&p.d, t, std::uint64_t(out), std::uint64_t(rows), out),
        "cublasLtMatrixLayoutCreate(D)");

  cublasLtMatmulPreference_t pref = nullptr;
  check(cublasLtMatmulPreferenceCreate(&pref), "cublasLtMatmulPreferenceCreate");
  const std::uint64_t ws = kCublasWorkspaceBytes;
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                       sizeof(ws));
  // Operand alignments (key: x, w, b, y, pre): A is W, B is x, C and D are y.
  const std::uint32_t al_a = std::get<6>(key), al_b = std::get<5>(key),
                      al_d = std::get<8>(key);
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_a,
                                       sizeof(al_a));
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_b,
                                       sizeof(al_b));
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_d,
                                       sizeof(al_d));
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_d,
                                       sizeof(al_d));
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(s.handle, p.desc, p.a, p.b, p.d, p.d,
                                                           pref, 1, &result, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  p.ok = st == CUBLAS_STATUS_SUCCESS && found > 0 && result.state == CUBLAS_STATUS_SUCCESS;
  if (p.ok) p.algo = result.algo;
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
    if (rows == 0 || in % 8 != 0 || out % 8 != 0 || alignment(b) < 16 ||
        (e == LinearEpilogue::bias_gelu && alignment(pre) < 16))
      return false;
    State& s = state();
    std::lock_guard<std::mutex> lock(s.mutex);
    ensure_handle(s);
    const Key key{type_key<T>(), rows, in, out, int(e),
                  alignment(x), alignment(w), alignment(b), alignment(y),
                  e == LinearEpilogue::bias_gelu ? alignment(pre) : 256u};
    auto it = s.plans.find(key);
    if (it == s.plans.end()) it = s.plans.emplace(key, make_plan<T>(s, rows, in, out, e, key)).first;
    Plan& p = it->second;
    if (!p.ok) return false;  // no algorithm for this case: the caller's two passes
    check(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &b, sizeof(b)),
          "cublasLtMatmulDescSetAttribute(BIAS_POINTER)");
    if (e == LinearEpilogue::bias_gelu)
      check(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER,
                                           &pre, sizeof(pre)),
            "cublasLtMatmulDescSetAttribute(EPILOGUE_AUX_POINTER)");
    const float alpha = 1.f, beta = 0.f;
    check(cublasLtMatmul(s.handle, p.desc, &alpha, w, p.a, x, p.b, &beta, y, p.d, y, p.d, &p.algo,
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
