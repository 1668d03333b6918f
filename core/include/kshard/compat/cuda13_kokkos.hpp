#pragma once
// Lets Kokkos 3.4.01 (the only Kokkos Debian bookworm ships as source) build
// and run with CUDA 13. Force-included, never #included:
//
//   nvcc_wrapper -arch=sm_80 -include <prefix>/include/kshard/compat/cuda13_kokkos.hpp ...
//
// The Kokkos build (ci/kokkos-cuda) and every kshard TU (presets/cuda.json)
// are compiled with it, because the fixes below must be visible *before*
// Kokkos' own headers: the calls they repair are non-dependent, so C++ binds
// them where Kokkos defines them.
//
// What it repairs:
//  1. CUDA 13 removed the int-device forms of cudaMemPrefetchAsync and
//     cudaMemAdvise (they take a cudaMemLocation now) and gave
//     cudaGraphAddDependencies an edge-data argument. Kokkos 3.4 calls the old
//     forms (Kokkos_CudaSpace.cpp, Kokkos_Cuda_Graph_Impl.hpp); the overloads
//     below keep those signatures and forward to the new API.
//  2. Kokkos_Cuda_Half.hpp picks its "CUDA >= 11.1" code with
//     `CUDA_VERSION < 11100` (11.1 is 11010), so every CUDA >= 12 takes a path
//     that calls __half2float, __half2short_rz, ... directly on
//     Kokkos::Experimental::half_t, which converts to __half only explicitly,
//     and calls __half2double, which CUDA never had. The templates below accept
//     exactly half_t, unwrap it and call CUDA's function (__half2double goes
//     through float: exact, every half is a float).
//  3. Not Kokkos, but every nvcc TU needs it and this header is the one every
//     nvcc TU gets: Boost.Preprocessor before 1.75 (Debian has 1.74) turns
//     variadic macros off under nvcc, so when any Boost header that pulls it
//     in (boost/mpl/list.hpp, ...) comes before boost/test, BOOST_TEST and
//     BOOST_DATA_TEST_CASE break ("identifier BOOST_TEST_TOOL_UNIV is
//     undefined"). nvcc has handled variadic macros for years; Boost 1.75
//     dropped the exclusion. We turn them back on.
//
// Known gaps it does not (cannot) close, so avoid them:
//  - That same Kokkos path declares cast_to_half(bool) and
//    cast_from_half<bool>(half_t) but never defines them: converting between
//    half_t and bool in device code fails at ptxas ("Unresolved extern").
//  - Kokkos_Cuda_BlockSize_Deduction.hpp's get_shmem_per_sm_prefer_l1 knows
//    compute capabilities up to 8.6 only; on the H200 (9.0) it throws
//    "Unknown device in cuda block size deduction". It runs only for policies
//    carrying Kokkos::Experimental::DesiredOccupancy, so never use
//    Kokkos::Experimental::prefer(policy, DesiredOccupancy{...}).
//
// Harmless elsewhere: the whole header is empty unless nvcc compiles the TU
// (__CUDACC__; both nvcc's host and device passes see the same declarations),
// the runtime-API overloads exist only for CUDA >= 13, and the half_t
// templates can never be chosen for anything but half_t. It assumes Kokkos 3.x
// with its CUDA half_t, a class on every arch CUDA 13 supports (3.4 makes it an
// alias only for Kepler/Maxwell). Kokkos >= 4.7 supports CUDA 13 itself: do not
// force-include this header there (4.x spells half_t as an alias, which clashes
// with the forward declaration below); KSHARD_NO_CUDA13_KOKKOS_COMPAT turns it off.
// Kokkos 4.6 still calls the three old runtime-API forms of (1) (its
// Kokkos_Cuda_Instance.hpp) but has a correct half_t path: build it and its
// users with -DKSHARD_CUDA13_KOKKOS4 as well, which keeps (1) and (3) and
// leaves out (2) (ci/kokkos4 --cuda, presets/cuda-kokkos4.json).
//
// A macro guard besides #pragma once: the source and the installed copy are
// two files, and one TU may be handed both (build flags naming one, a
// consumer's flags the other).
#if defined(__CUDACC__) && !defined(KSHARD_NO_CUDA13_KOKKOS_COMPAT) && \
    !defined(KSHARD_COMPAT_CUDA13_KOKKOS_HPP)
#define KSHARD_COMPAT_CUDA13_KOKKOS_HPP 1

#if !defined(BOOST_PP_VARIADICS)
#define BOOST_PP_VARIADICS 1
#endif

#include <cuda.h>  // CUDA_VERSION, the macro Kokkos tests
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <type_traits>

#if defined(CUDA_VERSION) && CUDA_VERSION >= 13000

namespace kshard::compat::cuda13_detail {
// Old API: a device ordinal, or cudaCpuDeviceId (-1) for the host.
inline cudaMemLocation location_of(int device) {
  cudaMemLocation loc{};
  if (device == cudaCpuDeviceId) {
    loc.type = cudaMemLocationTypeHost;
    loc.id = 0;  // ignored for the host
  } else {
    loc.type = cudaMemLocationTypeDevice;
    loc.id = device;
  }
  return loc;
}
}  // namespace kshard::compat::cuda13_detail

inline cudaError_t cudaMemPrefetchAsync(const void* dev_ptr, size_t count, int dst_device,
                                        cudaStream_t stream = 0) {
  return cudaMemPrefetchAsync(dev_ptr, count,
                              kshard::compat::cuda13_detail::location_of(dst_device), 0u, stream);
}

inline cudaError_t cudaMemAdvise(const void* dev_ptr, size_t count, cudaMemoryAdvise advice,
                                 int device) {
  return cudaMemAdvise(dev_ptr, count, advice,
                       kshard::compat::cuda13_detail::location_of(device));
}

inline cudaError_t cudaGraphAddDependencies(cudaGraph_t graph, const cudaGraphNode_t* from,
                                            const cudaGraphNode_t* to, size_t num_dependencies) {
  return cudaGraphAddDependencies(graph, from, to, static_cast<const cudaGraphEdgeData*>(nullptr),
                                  num_dependencies);
}

#endif  // CUDA_VERSION >= 13000

// Where Kokkos 3.4 takes the broken path; Kokkos 4.x does not (KSHARD_CUDA13_KOKKOS4).
#if defined(CUDA_VERSION) && CUDA_VERSION >= 11100 && !defined(KSHARD_CUDA13_KOKKOS4)

namespace Kokkos {
namespace Experimental {
class half_t;  // Kokkos_Cuda_Half.hpp (3.4): `class half_t { ... }`
}  // namespace Experimental
}  // namespace Kokkos

// Global, like CUDA's own functions, so that Kokkos' unqualified calls from
// inside namespace Kokkos::Experimental find them next to CUDA's. The body
// depends on T, so half_t only has to be complete where Kokkos instantiates.
#define KSHARD_CUDA13_HALF_UNWRAP(name, ret)                                          \
  template <class T,                                                                  \
            std::enable_if_t<std::is_same<T, Kokkos::Experimental::half_t>::value, int> = 0> \
  __host__ __device__ inline ret name(const T& h) {                                   \
    return name(static_cast<__half>(h));                                              \
  }
KSHARD_CUDA13_HALF_UNWRAP(__half2float, float)
KSHARD_CUDA13_HALF_UNWRAP(__half2short_rz, short)
KSHARD_CUDA13_HALF_UNWRAP(__half2ushort_rz, unsigned short)
KSHARD_CUDA13_HALF_UNWRAP(__half2int_rz, int)
KSHARD_CUDA13_HALF_UNWRAP(__half2uint_rz, unsigned int)
KSHARD_CUDA13_HALF_UNWRAP(__half2ll_rz, long long)
KSHARD_CUDA13_HALF_UNWRAP(__half2ull_rz, unsigned long long)
#undef KSHARD_CUDA13_HALF_UNWRAP

template <class T,
          std::enable_if_t<std::is_same<T, Kokkos::Experimental::half_t>::value, int> = 0>
__host__ __device__ inline double __half2double(const T& h) {
  return static_cast<double>(__half2float(static_cast<__half>(h)));
}

#endif  // CUDA_VERSION >= 11100 && !KSHARD_CUDA13_KOKKOS4

#endif  // __CUDACC__
