#pragma once
// Runs kshard's conversions inside Kokkos kernels on the default execution
// space, so that on a CUDA build the device code path is what gets checked.
// Bit patterns travel as uint32 so one runner serves every storage type.
#include <cstdint>
#include <vector>

#include <Kokkos_Core.hpp>

#include "kshard/numeric/convert.hpp"

namespace kshard_test {

template <class T>
struct DecodeKernel {
  Kokkos::View<const std::uint32_t*> in;
  Kokkos::View<float*> out;
  KOKKOS_INLINE_FUNCTION void operator()(const std::size_t i) const {
    T v;
    v.bits = static_cast<decltype(v.bits)>(in(i));
    out(i) = kshard::to_float(v);
  }
};

template <class T>
struct EncodeKernel {
  Kokkos::View<const float*> in;
  Kokkos::View<std::uint32_t*> out;
  KOKKOS_INLINE_FUNCTION void operator()(const std::size_t i) const {
    out(i) = kshard::from_float<T>(in(i)).bits;
  }
};

template <class Src, class Dst, class Kernel>
std::vector<Dst> run_elementwise(const std::vector<Src>& host_in, const char* label) {
  const std::size_t n = host_in.size();
  std::vector<Dst> host_out(n);
  if (n == 0) return host_out;
  Kokkos::View<Src*> in(Kokkos::view_alloc(Kokkos::WithoutInitializing, "in"), n);
  Kokkos::View<Dst*> out(Kokkos::view_alloc(Kokkos::WithoutInitializing, "out"), n);
  Kokkos::deep_copy(in, Kokkos::View<const Src*, Kokkos::HostSpace, Kokkos::MemoryUnmanaged>(
                            host_in.data(), n));
  Kokkos::parallel_for(label, Kokkos::RangePolicy<Kokkos::IndexType<std::size_t>>(0, n),
                       Kernel{in, out});
  Kokkos::deep_copy(Kokkos::View<Dst*, Kokkos::HostSpace, Kokkos::MemoryUnmanaged>(
                        host_out.data(), n),
                    out);
  return host_out;
}

/// to_float(T{bits[i]}) for every i, computed on the default execution space.
template <class T>
std::vector<float> device_decode(const std::vector<std::uint32_t>& bits) {
  return run_elementwise<std::uint32_t, float, DecodeKernel<T>>(bits, "kshard_test::decode");
}

/// from_float<T>(x[i]).bits for every i, computed on the default execution space.
template <class T>
std::vector<std::uint32_t> device_encode(const std::vector<float>& x) {
  return run_elementwise<float, std::uint32_t, EncodeKernel<T>>(x, "kshard_test::encode");
}

}  // namespace kshard_test
