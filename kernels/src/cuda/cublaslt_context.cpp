#include "cublaslt_context.hpp"

#include <Kokkos_Core.hpp>
#include <string>

#include "kshard/error.hpp"
#include "cache_config.hpp"
#include "cublas_workspace.hpp"

namespace kshard::detail {

namespace {
CublasLt& instance() {
  static CublasLt s;
  return s;
}
}  // namespace

std::mutex& cublaslt_mutex() { return instance().mutex; }

CublasLt& cublaslt() {
  CublasLt& s = instance();
  if (!s.handle) {
    restore_default_cache_config();
    s.workspace = cublas_workspace();
    check_cublas(cublasLtCreate(&s.handle), "cublasLtCreate");
    Kokkos::push_finalize_hook([] {
      CublasLt& st = instance();
      std::lock_guard<std::mutex> l(st.mutex);
      if (st.handle) cublasLtDestroy(st.handle);
      st.handle = nullptr;
      st.workspace = nullptr;
    });
  }
  return s;
}

void check_cublas(cublasStatus_t s, const char* call) {
  if (s != CUBLAS_STATUS_SUCCESS)
    throw Error(std::string(call) + " returned cublasStatus_t " + std::to_string(int(s)),
                "CUBLAS_STATUS_SUCCESS");
}

std::uint32_t pointer_alignment(const void* p) {
  const std::uintptr_t a = reinterpret_cast<std::uintptr_t>(p);
  std::uint32_t al = 256;
  while (al > 1 && (a % al) != 0) al /= 2;
  return al;
}

namespace {
// A matmul preference allowing the shared workspace and the given operand
// alignments (A, B, C/D); destroy with cublasLtMatmulPreferenceDestroy.
cublasLtMatmulPreference_t matmul_preference(std::uint32_t align_a, std::uint32_t align_b,
                                             std::uint32_t align_d) {
  cublasLtMatmulPreference_t pref = nullptr;
  check_cublas(cublasLtMatmulPreferenceCreate(&pref), "cublasLtMatmulPreferenceCreate");
  const std::uint64_t ws = kCublasWorkspaceBytes;
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                       sizeof(ws));
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_a,
                                       sizeof(align_a));
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align_b,
                                       sizeof(align_b));
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align_d,
                                       sizeof(align_d));
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align_d,
                                       sizeof(align_d));
  return pref;
}
}  // namespace

void destroy(LtPlan& p) {
  for (cublasLtMatrixLayout_t* l : {&p.a, &p.b, &p.c, &p.d}) {
    if (*l) cublasLtMatrixLayoutDestroy(*l);
    *l = nullptr;
  }
  if (p.desc) cublasLtMatmulDescDestroy(p.desc);
  p.desc = nullptr;
  p.ok = false;
}

void choose_algorithm(CublasLt& s, LtPlan& p, std::uint32_t align_a, std::uint32_t align_b,
                      std::uint32_t align_d) {
  cublasLtMatmulPreference_t pref = matmul_preference(align_a, align_b, align_d);
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(
      s.handle, p.desc, p.a, p.b, p.c ? p.c : p.d, p.d, pref, 1, &result, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  p.ok = st == CUBLAS_STATUS_SUCCESS && found > 0 && result.state == CUBLAS_STATUS_SUCCESS;
  if (p.ok) p.algo = result.algo;
}

void create_tn_desc(LtPlan& p, cublasComputeType_t compute) {
  check_cublas(cublasLtMatmulDescCreate(&p.desc, compute, CUDA_R_32F), "cublasLtMatmulDescCreate");
  const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  check_cublas(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)),
               "cublasLtMatmulDescSetAttribute(TRANSA)");
  check_cublas(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)),
               "cublasLtMatmulDescSetAttribute(TRANSB)");
}

}  // namespace kshard::detail
