#pragma once
// How much memory this rank's device has free: the one backend-specific
// memory query, behind a plain function so that no public header needs a
// backend's headers. Used to check a run's memory estimate before it starts.
namespace kshard::memory {

/// Free memory of this process's device in bytes (CUDA: cudaMemGetInfo on
/// the current device; host backends: MemAvailable from /proc/meminfo), or 0
/// when it cannot be told.
double available_device_bytes();

}  // namespace kshard::memory
