#pragma once
// The one backend-specific query of the train target (private), behind a
// plain function so that no public header needs a backend's headers.
namespace kshard::train_detail {

/// Free memory of this rank's device in bytes (CUDA: cudaMemGetInfo on the
/// current device; host backends: MemAvailable from /proc/meminfo), or 0
/// when it cannot be told.
double available_device_bytes();

}  // namespace kshard::train_detail
