#pragma once
// The rotary position embedding's angle, defined once for every kernel that
// rotates q or k (qkv_pack / qkv_unpack here, the KV cache's append in
// engine/src/nn/cached_attention.cpp): a key cached at decode time must be
// rotated by the same angle as the training forward rotates it, so the
// formula, its precision and its order of operations live in one place.
//
//   angle(position, i) = position x theta^(-2i/hd), in accum_t<T>
//                      = position x exp(-(2i / hd) x ln(theta))
//
// ln(theta) is taken in double on the host and rounded to A once
// (rope_log_theta), then every angle is A arithmetic: A(2i) / A(hd), negated,
// times ln(theta), exp, times A(position). Changing any step (exp2, a
// precomputed inverse frequency, pow) changes the low bits of the rotations,
// and with them every result checked bitwise against an earlier run.
#include <cmath>
#include <cstdint>

#include "kshard/compat/kokkos.hpp"

namespace kshard::detail {

/// ln(theta) in A (0 when theta <= 0: no rotary embedding).
template <class A>
A rope_log_theta(double theta) {
  return theta > 0 ? A(std::log(theta)) : A(0);
}

/// The angle of pair index i (element i pairs with i + head_dim / 2) at a
/// position, in A (accum_t<T>).
template <class A>
KOKKOS_INLINE_FUNCTION A rope_angle(std::int64_t position, std::int64_t i, std::int64_t head_dim,
                                    A log_theta) {
  return A(position) * compat::exp(-(A(2 * i) / A(head_dim)) * log_theta);
}

}  // namespace kshard::detail
