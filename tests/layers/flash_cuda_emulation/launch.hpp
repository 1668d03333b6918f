#pragma once
// The host emulation's stand-in for kernels/src/cuda/launch.hpp (found
// first on the include path): the same two functions, launching through
// emu_launch (shim.hpp) instead of <<<...>>>.
#include <cstddef>

namespace kshard::detail::cuda_launch {

inline void check_launch(const char*) {}

template <class Kernel, class Params>
void launch_with_smem(Kernel kernel, const char*, dim3 grid, int threads, std::size_t smem,
                      cudaStream_t stream, const Params& params) {
  emu_launch(kernel, grid, threads, smem, stream, params);
}

}  // namespace kshard::detail::cuda_launch
