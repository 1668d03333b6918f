#pragma once
// The one place where Kokkos 3.4 (Debian, and our CUDA build of it) and
// Kokkos 4.x differ for kshard. Everything else uses the API common to both.
#include <Kokkos_Core.hpp>

#define KSHARD_KOKKOS_AT_LEAST(major, minor) (KOKKOS_VERSION >= ((major)*10000 + (minor)*100))

// Reducers with array value types (value_type = T*) join through pointers.
// Kokkos 3.4 calls join(volatile T*, const volatile T*); Kokkos 4 rejects a
// volatile-qualified join (static_assert) and calls join(T*, const T*).
// Write joins as `join(KSHARD_JOIN_VOLATILE value_type dst, const
// KSHARD_JOIN_VOLATILE value_type src)`.
#if KSHARD_KOKKOS_AT_LEAST(4, 0)
#define KSHARD_JOIN_VOLATILE
#else
#define KSHARD_JOIN_VOLATILE volatile
#endif

namespace kshard::compat {

// Math functions callable in kernels: Kokkos::Experimental:: in 3.x, Kokkos::
// in 4.x (where the Experimental names are gone).
#if KSHARD_KOKKOS_AT_LEAST(4, 0)
namespace kmath = ::Kokkos;
#else
namespace kmath = ::Kokkos::Experimental;
#endif
using kmath::cos;
using kmath::exp;
using kmath::floor;
using kmath::log;
using kmath::sqrt;
using kmath::tanh;

/// Host memory that device copies can use at full speed: pinned under CUDA,
/// plain host memory elsewhere. MPI staging buffers live here.
#if defined(KOKKOS_ENABLE_CUDA)
using StagingSpace = Kokkos::CudaHostPinnedSpace;
#else
using StagingSpace = Kokkos::HostSpace;
#endif

/// Memory of the default execution space (CudaSpace under CUDA).
using DeviceSpace = Kokkos::DefaultExecutionSpace::memory_space;

/// True when views of MemSpace are host-accessible (no staging needed for MPI).
template <class MemSpace>
inline constexpr bool host_accessible_v =
    Kokkos::SpaceAccessibility<Kokkos::HostSpace, MemSpace>::accessible;

/// Initialises Kokkos on the given device (-1: let Kokkos choose).
inline void initialize_kokkos(int& argc, char** argv, int device_id) {
#if KSHARD_KOKKOS_AT_LEAST(4, 0)
  Kokkos::InitializationSettings s;
  if (device_id >= 0) s.set_device_id(device_id);
  (void)argc;
  (void)argv;
  Kokkos::initialize(s);
#else
  Kokkos::InitArguments args;
  args.device_id = device_id;
  (void)argc;
  (void)argv;
  Kokkos::initialize(args);
#endif
}

}  // namespace kshard::compat
