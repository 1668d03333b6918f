#pragma once
// SwiGLU (Llama's MLP activation; Shazeer 2020), as row kernels on flat
// Views, computed in accum_t<T>. The input row holds the gate and up halves
// side by side, [a | b] (one fused gate/up GEMM writes both):
//   y = silu(a) * b,  silu(a) = a * sigmoid(a)
//   da = dy * b * silu'(a),  silu'(a) = sigmoid(a) * (1 + a * (1 - sigmoid(a)))
//   db = dy * silu(a)
// Used by the SwiGLU layer (kshard/engine/nn/swiglu.hpp).
#include <cstdint>

#include <Kokkos_Core.hpp>

#include "kshard/numeric/compute.hpp"

namespace kshard::detail {

/// x: [rows, 2h] ([a | b] per row), y: [rows, h].
template <class T>
void swiglu_forward(Kokkos::View<const T*> x, Kokkos::View<T*> y, std::int64_t rows,
                    std::int64_t h);
/// x: the forward's input, dy: [rows, h], dx: [rows, 2h] ([da | db] per row).
template <class T>
void swiglu_backward(Kokkos::View<const T*> x, Kokkos::View<const T*> dy, Kokkos::View<T*> dx,
                     std::int64_t rows, std::int64_t h);

}  // namespace kshard::detail
