// detail::qkv_pack / qkv_unpack (grouped-query attention's k/v repetition and
// RoPE in front of the attention core) against the kernels they replaced,
// bitwise. The reference below is the previous implementation verbatim (one
// thread per element or pair, the angle's exp / cos / sin evaluated per
// element and per query head): the rewrite computes each row's angles once
// and each k rotation once per kv head, and must not change a bit of either
// direction for any compute type. Layouts: Llama-style GQA (16/4), plain
// multi-head (8/8), multi-query (4/1) and an odd group count (6/2), head dims
// 64 and 128, RoPE on and off, sequences of 1 to 200 rows in batches of 1 to
// 3; plus the scalar fallbacks (views starting one element into their
// allocation, a pair count no vector width divides, an odd head dim without
// RoPE). The whole allocations are compared, so a write outside the view
// shows too. On CUDA builds both run on the GPU, where the bits also depend
// on which products ptxas fuses into FMAs (the scalar path once fused
// differently from the previous kernels). Nothing here is timed.
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>

#include "kshard/compat/for_each.hpp"
#include "kshard/compat/kokkos.hpp"
#include "kshard/kernels/qkv_pack.hpp"
#include "layer_test_util.hpp"

using namespace kshard;
using namespace kshard::test;

// Named, not anonymous: unity builds put several test files in one
// translation unit (and nvcc wants device lambdas' enclosing functions
// externally visible).
namespace qkv_pack_test {

using detail::QkvLayout;

// ---- The previous kernels (kernels/src/qkv_pack.cpp before the rewrite) ----

template <class A>
struct Geometry {
  std::int64_t h, kv, hd, seq, g, sw, dw, half, per_head;
  bool rope;
  A log_theta;
  explicit Geometry(const QkvLayout& l)
      : h(l.heads), kv(l.kv_heads), hd(l.head_dim), seq(l.seq), g(l.heads / l.kv_heads),
        sw((l.heads + 2 * l.kv_heads) * l.head_dim), dw(3 * l.heads * l.head_dim),
        half(l.head_dim / 2), per_head(l.rope_theta > 0 ? l.head_dim / 2 : l.head_dim),
        rope(l.rope_theta > 0), log_theta(l.rope_theta > 0 ? A(std::log(l.rope_theta)) : A(0)) {}
  KOKKOS_INLINE_FUNCTION void angle(std::int64_t r, std::int64_t i, A& c, A& s) const {
    const A ang = A(r % seq) * compat::exp(-(A(2 * i) / A(hd)) * log_theta);
    c = compat::kmath::cos(ang);
    s = compat::kmath::sin(ang);
  }
};

template <class T>
void reference_pack(Kokkos::View<const T*> src, Kokkos::View<T*> dst, const QkvLayout& l) {
  using A = accum_t<T>;
  const Geometry<A> geo(l);
  const std::int64_t h = geo.h, kv = geo.kv, hd = geo.hd, g = geo.g, sw = geo.sw, dw = geo.dw,
                     half = geo.half, per_head = geo.per_head;
  const bool rope = geo.rope;
  compat::for_each_index(
      "qkv_pack_test::reference_pack_qk", l.rows * h * per_head, KOKKOS_LAMBDA(std::int64_t idx) {
        const std::int64_t r = idx / (h * per_head), rem = idx - r * h * per_head;
        const std::int64_t head = rem / per_head, i = rem - head * per_head;
        const T* s = src.data() + r * sw;
        T* d = dst.data() + r * dw;
        const std::int64_t qs = head * hd, ks = h * hd + (head / g) * hd;
        const std::int64_t qd = head * hd, kd = h * hd + head * hd;
        if (!rope) {
          d[qd + i] = s[qs + i];
          d[kd + i] = s[ks + i];
          return;
        }
        A c, sn;
        geo.angle(r, i, c, sn);
        const A q1 = to_accum(s[qs + i]), q2 = to_accum(s[qs + i + half]);
        d[qd + i] = from_accum<T>(q1 * c - q2 * sn);
        d[qd + i + half] = from_accum<T>(q2 * c + q1 * sn);
        const A k1 = to_accum(s[ks + i]), k2 = to_accum(s[ks + i + half]);
        d[kd + i] = from_accum<T>(k1 * c - k2 * sn);
        d[kd + i + half] = from_accum<T>(k2 * c + k1 * sn);
      });
  compat::for_each_index(
      "qkv_pack_test::reference_pack_v", l.rows * h * hd, KOKKOS_LAMBDA(std::int64_t idx) {
        const std::int64_t r = idx / (h * hd), rem = idx - r * h * hd;
        const std::int64_t head = rem / hd, i = rem - head * hd;
        dst(r * dw + 2 * h * hd + head * hd + i) = src(r * sw + (h + kv) * hd + (head / g) * hd + i);
      });
}

template <class T>
void reference_unpack(Kokkos::View<const T*> ddst, Kokkos::View<T*> dsrc, const QkvLayout& l) {
  using A = accum_t<T>;
  const Geometry<A> geo(l);
  const std::int64_t h = geo.h, kv = geo.kv, hd = geo.hd, g = geo.g, sw = geo.sw, dw = geo.dw,
                     half = geo.half, per_head = geo.per_head;
  const bool rope = geo.rope;
  compat::for_each_index(
      "qkv_pack_test::reference_unpack_qk", l.rows * (h + kv) * per_head,
      KOKKOS_LAMBDA(std::int64_t idx) {
        const std::int64_t r = idx / ((h + kv) * per_head), rem = idx - r * (h + kv) * per_head;
        const std::int64_t sh = rem / per_head, i = rem - sh * per_head;
        const T* d = ddst.data() + r * dw;
        T* s = dsrc.data() + r * sw;
        const bool is_q = sh < h;
        A a1 = 0, a2 = 0;
        if (is_q) {
          a1 = to_accum(d[sh * hd + i]);
          if (rope) a2 = to_accum(d[sh * hd + i + half]);
        } else {
          const std::int64_t j = sh - h;
          for (std::int64_t t = 0; t < g; ++t) {
            const std::int64_t kd = h * hd + (j * g + t) * hd;
            a1 += to_accum(d[kd + i]);
            if (rope) a2 += to_accum(d[kd + i + half]);
          }
        }
        const std::int64_t so = sh * hd;
        if (!rope) {
          s[so + i] = from_accum<T>(a1);
          return;
        }
        A c, sn;
        geo.angle(r, i, c, sn);
        s[so + i] = from_accum<T>(a1 * c + a2 * sn);
        s[so + i + half] = from_accum<T>(a2 * c - a1 * sn);
      });
  compat::for_each_index(
      "qkv_pack_test::reference_unpack_v", l.rows * kv * hd, KOKKOS_LAMBDA(std::int64_t idx) {
        const std::int64_t r = idx / (kv * hd), rem = idx - r * kv * hd;
        const std::int64_t j = rem / hd, i = rem - j * hd;
        A a = 0;
        for (std::int64_t t = 0; t < g; ++t) a += to_accum(ddst(r * dw + 2 * h * hd + (j * g + t) * hd + i));
        dsrc(r * sw + (h + kv) * hd + j * hd + i) = from_accum<T>(a);
      });
}

// ---- Comparison ----

/// Values to move: uniform in [-4, 4) with some exact zeros of both signs
/// (a group sum must start from +0 as before: -0 + +0 is +0) and some large
/// magnitudes (rounding of the rotated values at the top of the range).
/// splitmix64 rather than <random>'s engines: these arrays are the bulk of
/// the test's host time.
HostVec inputs(std::size_t n, std::uint64_t seed) {
  HostVec v(n);
  std::uint64_t state = seed * 0x9E3779B97F4A7C15ull;
  for (auto& x : v) {
    std::uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    x = double(z >> 11) * 0x1.0p-53 * 8.0 - 4.0;
    const unsigned pick = unsigned(z & 63);
    if (pick == 0) x = 0.0;
    if (pick == 1) x = -0.0;
    if (pick == 2) x *= 1000.0;
  }
  return v;
}

/// An allocation of `offset + n` elements filled with `fill`, and its
/// n-element window starting `offset` elements in.
template <class T>
std::pair<Kokkos::View<T*>, Kokkos::View<T*>> window(std::int64_t offset, std::int64_t n,
                                                     const HostVec& fill) {
  Kokkos::View<T*> all = to_device<T>(fill, "qkv_pack_test::all");
  BOOST_REQUIRE(static_cast<std::int64_t>(fill.size()) >= offset + n);
  Kokkos::View<T*> w =
      Kokkos::subview(all, std::make_pair(std::size_t(offset), std::size_t(offset + n)));
  return {all, w};
}

/// Index of the first element whose bytes differ, or -1.
template <class T>
std::int64_t first_difference(const Kokkos::View<T*>& a, const Kokkos::View<T*>& b) {
  auto ha = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), a);
  auto hb = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), b);
  for (std::size_t i = 0; i < ha.extent(0); ++i)
    if (std::memcmp(&ha(i), &hb(i), sizeof(T)) != 0) return static_cast<std::int64_t>(i);
  return -1;
}

std::string describe(const QkvLayout& l, std::int64_t offset) {
  return "rows " + std::to_string(l.rows) + " seq " + std::to_string(l.seq) + " heads " +
         std::to_string(l.heads) + "/" + std::to_string(l.kv_heads) + " hd " +
         std::to_string(l.head_dim) + " theta " + std::to_string(l.rope_theta) + " offset " +
         std::to_string(offset);
}

/// Both directions of one layout, new kernels against the reference, on
/// windows starting `offset` elements into their allocations.
template <class T>
void check_bitwise(const QkvLayout& l, std::int64_t offset, std::uint64_t seed) {
  BOOST_TEST_CONTEXT(describe(l, offset)) {
    const std::int64_t sn = l.rows * (l.heads + 2 * l.kv_heads) * l.head_dim;
    const std::int64_t dn = l.rows * 3 * l.heads * l.head_dim;
    const std::int64_t pad = offset + 16;  // guard elements after each window
    // Forward: src values, dst prefilled with other values (every element
    // of the window must be written, nothing outside it).
    const HostVec src_h = inputs(std::size_t(sn + pad), seed);
    const HostVec dst_fill = inputs(std::size_t(dn + pad), seed + 1);
    auto [src_all, src] = window<T>(offset, sn, src_h);
    auto [ref_all, ref] = window<T>(offset, dn, dst_fill);
    auto [got_all, got] = window<T>(offset, dn, dst_fill);
    reference_pack<T>(src, ref, l);
    detail::qkv_pack<T>(src, got, l);
    Kokkos::fence();
    const std::int64_t fwd = first_difference(ref_all, got_all);
    BOOST_TEST(fwd == -1, "qkv_pack differs from the previous kernel at element " << fwd - offset);
    // Backward: a packed gradient into the source layout.
    const HostVec ddst_h = inputs(std::size_t(dn + pad), seed + 2);
    const HostVec dsrc_fill = inputs(std::size_t(sn + pad), seed + 3);
    auto [ddst_all, ddst] = window<T>(offset, dn, ddst_h);
    auto [dref_all, dref] = window<T>(offset, sn, dsrc_fill);
    auto [dgot_all, dgot] = window<T>(offset, sn, dsrc_fill);
    reference_unpack<T>(ddst, dref, l);
    detail::qkv_unpack<T>(ddst, dgot, l);
    Kokkos::fence();
    const std::int64_t bwd = first_difference(dref_all, dgot_all);
    BOOST_TEST(bwd == -1, "qkv_unpack differs from the previous kernel at element " << bwd - offset);
  }
}

struct Heads {
  std::int64_t heads, kv_heads;
};
const Heads kHeads[] = {{16, 4}, {8, 8}, {4, 1}, {6, 2}};
const std::int64_t kHeadDims[] = {64, 128};
const double kThetas[] = {0.0, 10000.0};
struct Rows {
  std::int64_t seq, batch;
};
// Sequences of 1 to 200 in batches of 1 to 3 (rows = batch x seq): a single
// row, positions past one sequence, long sequences whose angles exceed 2 pi
// many times over.
const Rows kRows[] = {{1, 1}, {1, 3}, {5, 2}, {37, 3}, {64, 1}, {129, 2}, {200, 1}, {200, 3}};

// Each (heads, hd, theta) runs two of the row shapes, in turn, so that
// every layout meets every shape across the thetas and head dims while the
// host run stays short (the suite has one timeout).
template <class T>
void check_layouts() {
  constexpr int kShapes = sizeof(kRows) / sizeof(kRows[0]);
  std::uint64_t seed = 1;
  int next = 0;
  for (const Heads& hh : kHeads)
    for (std::int64_t hd : kHeadDims)
      for (double theta : kThetas)
        for (int k = 0; k < 2; ++k) {
          const Rows& rr = kRows[next++ % kShapes];
          const QkvLayout l{rr.seq * rr.batch, rr.seq, hh.heads, hh.kv_heads, hd, theta};
          check_bitwise<T>(l, 0, seed += 4);
        }
}

/// The narrower paths: windows one element into their allocations (no
/// vector alignment: one element at a time), a pair count of 3 (hd 6: only
/// width 1) and of 6 (hd 12: width 2), larger groups, and an odd head dim
/// without RoPE.
template <class T>
void check_fallbacks() {
  std::uint64_t seed = 1000;
  for (std::int64_t offset : {1, 2, 3})
    for (double theta : {0.0, 500.0})
      check_bitwise<T>(QkvLayout{2 * 37, 37, 16, 4, 64, theta}, offset, seed += 4);
  for (double theta : {0.0, 10000.0}) {
    check_bitwise<T>(QkvLayout{3 * 11, 11, 6, 2, 6, theta}, 0, seed += 4);
    check_bitwise<T>(QkvLayout{3 * 11, 11, 6, 3, 12, theta}, 0, seed += 4);
    check_bitwise<T>(QkvLayout{2 * 9, 9, 4, 2, 24, theta}, 1, seed += 4);
  }
  // Groups of 5 and 8: unpack loads a group's slots 4 at a time.
  for (double theta : {0.0, 10000.0}) {
    check_bitwise<T>(QkvLayout{2 * 37, 37, 10, 2, 64, theta}, 0, seed += 4);
    check_bitwise<T>(QkvLayout{3 * 5, 5, 8, 1, 128, theta}, 0, seed += 4);
  }
  check_bitwise<T>(QkvLayout{2 * 13, 13, 4, 2, 5, 0.0}, 0, seed += 4);
  check_bitwise<T>(QkvLayout{2 * 13, 13, 3, 1, 7, 0.0}, 1, seed += 4);
}

}  // namespace qkv_pack_test

BOOST_AUTO_TEST_SUITE(qkv_pack)

BOOST_AUTO_TEST_CASE(bitwise_as_before_bf16) {
  qkv_pack_test::check_layouts<bfloat16_t>();
  qkv_pack_test::check_fallbacks<bfloat16_t>();
}
BOOST_AUTO_TEST_CASE(bitwise_as_before_f16) {
  qkv_pack_test::check_layouts<float16_t>();
  qkv_pack_test::check_fallbacks<float16_t>();
}
BOOST_AUTO_TEST_CASE(bitwise_as_before_f32) {
  qkv_pack_test::check_layouts<float>();
  qkv_pack_test::check_fallbacks<float>();
}
BOOST_AUTO_TEST_CASE(bitwise_as_before_f64) {
  qkv_pack_test::check_layouts<double>();
  qkv_pack_test::check_fallbacks<double>();
}

BOOST_AUTO_TEST_SUITE_END()
