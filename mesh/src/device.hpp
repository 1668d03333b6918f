#pragma once
// Private: the accelerator facts Session needs before Kokkos starts.
namespace kshard::detail {
/// GPUs visible to this process (0 on host-only builds).
int device_count() noexcept;
}
