#!/usr/bin/env bash
# Runs the CUDA tensor-core fused-attention kernels (kernels/src/cuda/
# flash_attention_cuda.cpp, verbatim) on the host, without a GPU: every CUDA
# thread is a std::thread, __syncthreads and the warp-collective instructions
# (shfl, ldmatrix, mma.sync m16n8k16) are emulated with their documented
# fragment layouts, cp.async copies synchronously, shared memory starts as NaN.
# It checks indexing, masking, tiling and fragment bookkeeping against a naive
# double reference (bf16 and f16, head dims 64 and 128, sequence lengths on
# and off the tile sizes); it cannot check timing or asynchronous hazards.
#
# The exact-f32 SIMT kernels (flash_attention_f32_cuda.cpp) run the same way
# (256 threads per block, shuffles emulated), float against the same double
# reference at head dims 64 and 128.
#
#   tests/layers/flash_cuda_emulation/run.sh [N [tc|f32]]
#     N: the first N cases of each list (default all); tc / f32: only the
#     16-bit tensor-core cases / only the f32 cases (default both)
#
# Slow by design (128 OS threads per block, a barrier per warp instruction):
# about 1-3 minutes for all cases on 2 cores. Not part of ctest; run it after
# editing the CUDA kernels, before taking them to a GPU.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../../.." && pwd)
OUT="$REPO/build/flash-emu"
mkdir -p "$OUT"
python3 "$HERE/make_emu.py" "$REPO/kernels/src/cuda/flash_attention_cuda.cpp" "$OUT/fa_emu.cpp"
python3 "$HERE/make_emu.py" "$REPO/kernels/src/cuda/flash_attention_f32_cuda.cpp" "$OUT/fa_f32_emu.cpp"
KOKKOS_INC=${KOKKOS_INC:-/usr/include/trilinos}
g++ -std=c++17 -O1 -w -include "$HERE/shim.hpp" -I"$REPO/kernels/include" -I"$REPO/core/include" \
  -I"$HERE" -I"$REPO/kernels/src/cuda" -isystem "$KOKKOS_INC" \
  "$OUT/fa_emu.cpp" "$OUT/fa_f32_emu.cpp" "$HERE/driver.cpp" -o "$OUT/flash-emu" -lpthread
"$OUT/flash-emu" "$@"
