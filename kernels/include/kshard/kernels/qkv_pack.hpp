#pragma once
// Grouped-query attention and rotary position embeddings in front of the
// attention core (Llama's attention), as two kernels on flat Views:
//
// qkv_pack: the qkv projection's output src [rows, (h + 2 kv) hd] ([q | k |
// v], heads side by side) becomes the core's packed dst [rows, 3 h hd] ([q |
// k | v] with one k and one v head per query head): k/v head j serves query
// heads j g .. j g + g - 1 (g = h / kv; GQA, kv = 1 is multi-query), and
// with theta > 0 q and k are rotated by their position (RoPE in the
// rotate-half layout of GPT-NeoX and Hugging Face's Llama: element i pairs
// with i + hd/2, angle = position x theta^(-2i/hd), position = row % seq).
// qkv_unpack is its adjoint (the backward): q and k rotated back, and each
// k/v head's gradient summed over its group in a fixed order.
//
// Angles, sines and cosines are computed in accum_t<T> (f32 for f32 and the
// 16-bit types, as Hugging Face computes them in f32; f64 for double), by
// the one formula of kernels/rope_angle.hpp.
// The first version copies k and v per query head rather than having the
// fused attention kernels read shared heads in place (issue 22 asks for the
// latter; the packed layout lets every existing attention path run as is).
#include <cstdint>

#include <Kokkos_Core.hpp>

#include "kshard/numeric/compute.hpp"

namespace kshard::detail {

struct QkvLayout {
  std::int64_t rows, seq, heads, kv_heads, head_dim;
  double rope_theta;  ///< 0: no rotary embedding
};

template <class T>
void qkv_pack(Kokkos::View<const T*> src, Kokkos::View<T*> dst, const QkvLayout& l);
template <class T>
void qkv_unpack(Kokkos::View<const T*> ddst, Kokkos::View<T*> dsrc, const QkvLayout& l);

}  // namespace kshard::detail
