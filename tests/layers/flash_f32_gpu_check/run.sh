#!/usr/bin/env bash
# Standalone GPU check and timing of the exact-f32 attention kernels
# (engine/src/kernels/cuda/flash_attention_f32_cuda.cpp) without Kokkos or the
# rest of kshard: stub/ stands in for the two kshard headers the kernel file
# includes. Checks fwd+bwd against a double reference at small shapes (and
# that the backward is bitwise repeatable), then times the training shapes
# (TFLOP/s counting the causal half: fwd 2 products, bwd 5).
#   tests/layers/flash_f32_gpu_check/run.sh [nvcc arch, default sm_90]
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../../.." && pwd)
OUT="$REPO/build/flash-f32-gpu"
mkdir -p "$OUT"
nvcc -O3 -std=c++17 -arch="${1:-sm_90}" -I"$HERE/stub" -I"$REPO/engine/src/kernels/cuda" \
  -x cu "$REPO/engine/src/kernels/cuda/flash_attention_f32_cuda.cpp" -x cu "$HERE/harness.cu" \
  -o "$OUT/flash-f32-gpu"
"$OUT/flash-f32-gpu"
