#pragma once
// db[c] += sum over rows of dy[r, c] (accum_t<U>), the bias gradient of a
// Linear and LayerNorm's beta / gamma gradients, where the backend has a
// faster kernel than a GEMV against a vector of ones (layer.cpp's portable
// path). Private to the engine.
//
// Why: cuBLAS runs those GEMVs as a split-K kernel plus a reduction kernel
// (two launches per bias; on the H200, 13 + 4 us for [4096, 2048] f32 that a
// single pass reads in 9), 120 launches of a large fp32 step. The CUDA
// kernel reads dy once as 16-byte vectors, each thread summing eight
// columns over a slice of the rows, and a second small kernel adds the
// slices in a fixed order (deterministic: bitwise repeatable).
#include <cstdint>

namespace kshard::detail {

/// Returns false when the backend has no kernel for this case (host builds;
/// cols not a multiple of 8 or dy not 16-byte aligned): nothing ran.
template <class U, class A>
bool column_sums_accumulate(const U* dy, std::int64_t rows, std::int64_t cols, A* db);

}  // namespace kshard::detail

/// A backend's explicit instantiation for compute type U (with
/// KSHARD_FOR_EACH_COMPUTE_TYPE).
#define KSHARD_INSTANTIATE_COLUMN_SUMS(U) \
  template bool column_sums_accumulate<U, accum_t<U>>(const U*, std::int64_t, std::int64_t, accum_t<U>*);
