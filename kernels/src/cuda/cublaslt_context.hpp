#pragma once
// The process's one cuBLASLt handle, shared by every cuBLASLt user of the
// engine (linear_epilogue_cublaslt.cpp, fp8_gemm_cublaslt.cpp), with the
// shared cuBLAS workspace (cublas_workspace.hpp) and the helpers their plan
// caches need. Private to the CUDA backend.
#include <cublasLt.h>

#include <Kokkos_Core.hpp>
#include <cstdint>
#include <map>
#include <mutex>

namespace kshard::detail {

struct CublasLt {
  std::mutex mutex;                 ///< cublaslt_mutex(): held around plan lookups and matmuls
  cublasLtHandle_t handle = nullptr;
  void* workspace = nullptr;        ///< cublas_workspace(), kCublasWorkspaceBytes
};

/// The mutex to hold around cublaslt() and everything done with it.
std::mutex& cublaslt_mutex();
/// The context with its handle made (the first call creates it; destroyed in
/// Kokkos::finalize while the CUDA context still exists). Call with
/// cublaslt_mutex() held.
CublasLt& cublaslt();

/// Throws kshard::Error naming the call unless s is CUBLAS_STATUS_SUCCESS.
void check_cublas(cublasStatus_t s, const char* call);

/// Largest power of two (<= 256) dividing the address: what an algorithm may
/// assume about an operand (parameters are views into a flat buffer, so
/// their alignment varies with the unit's layout).
std::uint32_t pointer_alignment(const void* p);

/// A cached matmul: descriptors plus the heuristic's algorithm. Descriptors
/// do not depend on the handle, so a plan outlives handle changes.
struct LtPlan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr, d = nullptr;
  cublasLtMatmulAlgo_t algo{};
  bool ok = false;  ///< the heuristic found an algorithm
};

/// Creates p.desc for D = op(A) op(B) with A transposed and B not (the "TN"
/// form both cuBLASLt users map their row-major products to), f32 scales.
void create_tn_desc(LtPlan& p, cublasComputeType_t compute);

/// Destroys the plan's descriptors (the null ones skipped).
void destroy(LtPlan& p);

/// Asks the heuristic for the plan's algorithm (descriptor and layouts made;
/// C is p.c, or p.d where p.c is null) given the operand alignments: sets
/// p.algo and p.ok.
void choose_algorithm(CublasLt& s, LtPlan& p, std::uint32_t align_a, std::uint32_t align_b,
                      std::uint32_t align_d);

/// One user's plans, looked up with cublaslt_mutex() held and destroyed in
/// Kokkos::finalize. A plan is made once per shape, types, epilogue and
/// operand alignment: the heuristic costs tens of microseconds of host time
/// and a training step calls the same few shapes. Tag (a type in the user's
/// anonymous namespace) keeps two users with the same Key type apart.
template <class Tag, class Key>
std::map<Key, LtPlan>& plan_cache() {
  static std::map<Key, LtPlan>* cache = [] {
    auto* m = new std::map<Key, LtPlan>;
    Kokkos::push_finalize_hook([m] {
      std::lock_guard<std::mutex> l(cublaslt_mutex());
      for (auto& kv : *m) destroy(kv.second);
      m->clear();
    });
    return m;
  }();
  return *cache;
}

}  // namespace kshard::detail
