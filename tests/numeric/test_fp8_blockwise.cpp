// kshard/kernels/fp8_blockwise.hpp (1x128 and 128x128 block-scaled
// E4M3 casts, the operands of the fp8-block recipe's GEMMs) against the
// scalar reference of fp8_reference.hpp applied block by block: q and qt bit
// for bit, every scale in the documented layout (the 128x128 grid's padding
// included), blocks of different magnitudes side by side, zero blocks,
// inf/NaN; the fused column sums against exact sums; bad arguments.
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include <Kokkos_Core.hpp>

#include "checker.hpp"
#include "fp8_reference.hpp"
#include "fp8_test_io.hpp"
#include "kshard/kernels/fp8_blockwise.hpp"
#include "kshard/kernels/gelu.hpp"
#include "kshard/error.hpp"

using namespace kshard_test;
using kshard::bfloat16_t;
using kshard::float8_e4m3_t;

namespace {

constexpr std::int64_t B = 128;

/// x [rows, cols] whose 128-blocks differ in magnitude (each row and each
/// column band scaled by its own power of two), with one all-zero 128 x 128
/// tile and, when asked, an inf and a NaN.
std::vector<float> block_values(std::int64_t rows, std::int64_t cols, std::uint32_t seed,
                                bool specials) {
  std::vector<float> x = bf16_values(std::size_t(rows * cols), seed, -6, 6);
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t c = 0; c < cols; ++c) {
      const int e = int((r * 7 + (c / B) * 5) % 23) - 11;
      x[std::size_t(r * cols + c)] = std::ldexp(x[std::size_t(r * cols + c)], e);
      if (r >= rows - B && c < B) x[std::size_t(r * cols + c)] = 0.0f;  // a zero tile
    }
  if (specials) {
    x[std::size_t(3 * cols + 5)] = std::numeric_limits<float>::infinity();
    x[std::size_t(7 * cols + 200 % cols)] = std::numeric_limits<float>::quiet_NaN();
  }
  return x;
}

std::vector<float> transpose(const std::vector<float>& x, std::int64_t rows, std::int64_t cols) {
  std::vector<float> t(x.size());
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t c = 0; c < cols; ++c) t[std::size_t(c * rows + r)] = x[std::size_t(r * cols + c)];
  return t;
}

/// The reference of a 1x128 cast of m [outer, k]: bytes in m's layout and
/// scales in the documented one, s[(c / 128) * outer + r].
struct Ref {
  std::vector<std::uint32_t> q;
  std::vector<float> s;
};
Ref ref_1x128(const std::vector<float>& m, std::int64_t outer, std::int64_t k) {
  const RefQuant r = ref_quantize<float8_e4m3_t>(m, int(B));  // blocks of 128 along rows
  Ref out{r.q, std::vector<float>(std::size_t(outer * (k / B)))};
  for (std::int64_t o = 0; o < outer; ++o)
    for (std::int64_t b = 0; b < k / B; ++b)
      out.s[std::size_t(b * outer + o)] = r.scales[std::size_t(o * (k / B) + b)];
  return out;
}

/// The reference of a 128x128 cast of m [outer, k]: each tile one block;
/// s[(r / 128) * ld + c / 128], padding 1.
Ref ref_128x128(const std::vector<float>& m, std::int64_t outer, std::int64_t k) {
  const std::int64_t ld = kshard::fp8_block_scale_ld(k);
  Ref out{std::vector<std::uint32_t>(m.size()), std::vector<float>(std::size_t(outer / B * ld), 1.0f)};
  for (std::int64_t tr = 0; tr < outer / B; ++tr)
    for (std::int64_t tc = 0; tc < k / B; ++tc) {
      std::vector<float> tile;
      for (std::int64_t r = 0; r < B; ++r)
        for (std::int64_t c = 0; c < B; ++c) tile.push_back(m[std::size_t((tr * B + r) * k + tc * B + c)]);
      const RefQuant q = ref_quantize<float8_e4m3_t>(tile, int(B * B));
      out.s[std::size_t(tr * ld + tc)] = q.scales.at(0);
      for (std::int64_t r = 0; r < B; ++r)
        for (std::int64_t c = 0; c < B; ++c)
          out.q[std::size_t((tr * B + r) * k + tc * B + c)] = q.q[std::size_t(r * B + c)];
    }
  return out;
}

void compare(Checker& c, const char* what, const std::vector<float8_e4m3_t>& q,
             const std::vector<float>& s, const Ref& want) {
  for (std::size_t i = 0; i < q.size(); ++i)
    c.check(q[i].bits == want.q[i], [&] {
      return std::string(what) + " byte " + std::to_string(i) + " = " + hex(q[i].bits, 2) +
             ", want " + hex(want.q[i], 2);
    });
  c.check(s.size() == want.s.size(), [&] { return std::string(what) + ": scale count"; });
  for (std::size_t i = 0; i < std::min(s.size(), want.s.size()); ++i)
    c.check(s[i] == want.s[i], [&] {
      return std::string(what) + " scale " + std::to_string(i) + " = " + show(s[i]) + ", want " +
             show(want.s[i]);
    });
}

void check_casts(std::int64_t rows, std::int64_t cols, bool specials) {
  const std::vector<float> xs = block_values(rows, cols, std::uint32_t(rows * 31 + cols), specials);
  const auto x = upload(xs);
  const std::size_t n = xs.size();
  Checker c("fp8 blockwise [" + std::to_string(rows) + ", " + std::to_string(cols) + "]" +
            (specials ? " with inf/NaN" : ""));
  const std::vector<float> xt = transpose(xs, rows, cols);
  {
    Kokkos::View<float8_e4m3_t*> q("q", n), qt("qt", n);
    Kokkos::View<float*> s("s", std::size_t(kshard::fp8_scales_1x128(rows, cols)));
    Kokkos::View<float*> st("st", std::size_t(kshard::fp8_scales_1x128(cols, rows)));
    kshard::fp8_cast_1x128(x, rows, cols, q, s, qt, st);
    compare(c, "1x128 q", download(q), download(s), ref_1x128(xs, rows, cols));
    compare(c, "1x128 qt", download(qt), download(st), ref_1x128(xt, cols, rows));
    // Each output alone: the same bytes.
    Kokkos::View<float8_e4m3_t*> q1("q1", n);
    Kokkos::View<float*> s1("s1", s.extent(0));
    kshard::fp8_cast_1x128(x, rows, cols, q1, s1, {}, {});
    compare(c, "1x128 q alone", download(q1), download(s1), ref_1x128(xs, rows, cols));
  }
  {
    Kokkos::View<float8_e4m3_t*> q("q", n), qt("qt", n);
    Kokkos::View<float*> s("s", std::size_t(kshard::fp8_scales_128x128(rows, cols)));
    Kokkos::View<float*> st("st", std::size_t(kshard::fp8_scales_128x128(cols, rows)));
    Kokkos::deep_copy(s, -1.0f);  // the padding must be written
    Kokkos::deep_copy(st, -1.0f);
    kshard::fp8_cast_128x128(x, rows, cols, q, s, qt, st);
    compare(c, "128x128 q", download(q), download(s), ref_128x128(xs, rows, cols));
    compare(c, "128x128 qt", download(qt), download(st), ref_128x128(xt, cols, rows));
  }
  c.report();
}

}  // namespace

BOOST_AUTO_TEST_SUITE(numeric_fp8_blockwise)

BOOST_AUTO_TEST_CASE(layouts) {
  BOOST_TEST(kshard::fp8_blockwise_supported(128, 256));
  BOOST_TEST(!kshard::fp8_blockwise_supported(128, 192));
  BOOST_TEST(!kshard::fp8_blockwise_supported(64, 128));
  BOOST_TEST(kshard::fp8_block_scale_ld(768) == 8);   // 6 blocks, rows of 4
  BOOST_TEST(kshard::fp8_block_scale_ld(512) == 4);
  BOOST_TEST(kshard::fp8_scales_1x128(256, 384) == 256 * 3);
  BOOST_TEST(kshard::fp8_scales_128x128(256, 768) == 2 * 8);
}

BOOST_AUTO_TEST_CASE(casts_match_reference) {
  check_casts(128, 128, false);
  check_casts(256, 384, true);
  check_casts(384, 768, false);  // 6 column tiles: the 128x128 grid pads to 8
}

// The GELU steps of Fp8Input: the 1x128 casts (q alone: the row kernel; qt
// alone, both, and both with the bias sums: the tile kernel) give the bytes,
// scales and sums of the cast of the tensor gelu_forward / gelu_backward
// write; a bias gradient of gelu(x) is refused.
BOOST_AUTO_TEST_CASE(gelu_steps_cast_what_gelu_writes) {
  for (auto [rows, cols] : {std::pair<std::int64_t, std::int64_t>{128, 128}, {256, 384}}) {
    std::vector<float> xs = bf16_values(std::size_t(rows * cols), std::uint32_t(rows + cols), -8, 3);
    xs[5] = std::numeric_limits<float>::infinity();
    const std::size_t n = xs.size();
    const auto x = upload(xs), pre = upload(bf16_values(n, std::uint32_t(rows * cols), -6, 2));
    for (auto in : {kshard::Fp8Input::gelu_of_x, kshard::Fp8Input::gelu_grad}) {
      const bool grad = in == kshard::Fp8Input::gelu_grad;
      Kokkos::View<const bfloat16_t*> p = grad ? pre : Kokkos::View<const bfloat16_t*>();
      Kokkos::View<bfloat16_t*> w("written", n);
      if (grad)
        kshard::detail::gelu_backward<bfloat16_t>(pre, x, w);
      else
        kshard::detail::gelu_forward<bfloat16_t>(x, w);
      Checker c(std::string(grad ? "fp8 1x128 cast of x gelu'(pre) [" : "fp8 1x128 cast of gelu(x) [") +
                std::to_string(rows) + ", " + std::to_string(cols) + "]");
      for (int outputs = 0; outputs < 4; ++outputs) {
        const bool sums = outputs == 3;
        if (sums && !grad) continue;
        const std::size_t nq = outputs != 2 ? n : 0, nqt = outputs != 1 ? n : 0;
        const std::size_t ns = nq ? std::size_t(kshard::fp8_scales_1x128(rows, cols)) : 0;
        const std::size_t nst = nqt ? std::size_t(kshard::fp8_scales_1x128(cols, rows)) : 0;
        Kokkos::View<float8_e4m3_t*> qw("qw", nq), qtw("qtw", nqt), qx("qx", nq), qtx("qtx", nqt);
        Kokkos::View<float*> sw("sw", ns), stw("stw", nst), sx("sx", ns), stx("stx", nst);
        Kokkos::View<float*> dbw("dbw", sums ? cols : 0), dbx("dbx", sums ? cols : 0);
        Kokkos::View<float*> part("part", std::size_t(rows / 128 * cols));
        kshard::fp8_cast_1x128(w, rows, cols, qw, sw, qtw, stw, dbw, part);
        kshard::fp8_cast_1x128(x, rows, cols, qx, sx, qtx, stx, dbx, part, in, p);
        const std::string what =
            outputs == 0 ? "q and qt" : outputs == 1 ? "q" : outputs == 2 ? "qt" : "q, qt and dbias";
        const auto same = [&](const std::string& name, const auto& mine, const auto& want) {
          const auto hm = download(mine), hw = download(want);
          for (std::size_t i = 0; i < hm.size(); ++i)
            c.check(std::memcmp(&hm[i], &hw[i], sizeof hm[i]) == 0,
                    [&] { return what + ": " + name + "[" + std::to_string(i) + "] differs"; });
        };
        same("q", qx, qw);
        same("qt", qtx, qtw);
        same("q scale", sx, sw);
        same("qt scale", stx, stw);
        same("dbias", dbx, dbw);
      }
      c.report();
    }
  }
  Kokkos::View<bfloat16_t*> x("x", 128 * 128), short_pre("short", 128 * 128 - 8);
  Kokkos::View<float8_e4m3_t*> q("q", 128 * 128);
  Kokkos::View<float*> s("s", 128), db("db", 128), partials("p", 128);
  BOOST_CHECK_THROW(kshard::fp8_cast_1x128(x, 128, 128, q, s, {}, {}, db, partials,
                                           kshard::Fp8Input::gelu_of_x),
                    kshard::Error);
  BOOST_CHECK_THROW(kshard::fp8_cast_1x128(x, 128, 128, q, s, {}, {}, {}, {},
                                           kshard::Fp8Input::gelu_grad, short_pre),
                    kshard::Error);
}

BOOST_AUTO_TEST_CASE(column_sums_from_the_cast) {
  // dbias += column sums, from the same kernel: vs exact sums, within the f32
  // summation bound (rows terms: |err| <= rows * 2^-24 * sum |x|), and added
  // to what dbias held.
  const std::int64_t rows = 384, cols = 256;
  const std::vector<float> xs = block_values(rows, cols, 7, false);
  const auto x = upload(xs);
  Kokkos::View<float8_e4m3_t*> q("q", xs.size()), qt("qt", xs.size());
  Kokkos::View<float*> s("s", std::size_t(kshard::fp8_scales_1x128(rows, cols)));
  Kokkos::View<float*> st("st", std::size_t(kshard::fp8_scales_1x128(cols, rows)));
  Kokkos::View<float*> db("db", std::size_t(cols)), partials("partials", std::size_t(rows / B * cols));
  Kokkos::deep_copy(db, 0.5f);
  kshard::fp8_cast_1x128(x, rows, cols, q, s, qt, st, db, partials);
  const auto got = download(db);
  Checker c("fp8_cast_1x128 column sums");
  for (std::int64_t j = 0; j < cols; ++j) {
    double exact = 0.5, mag = 0.5;
    for (std::int64_t i = 0; i < rows; ++i) {
      exact += double(xs[std::size_t(i * cols + j)]);
      mag += std::fabs(double(xs[std::size_t(i * cols + j)]));
    }
    const double bound = double(rows + 2) * std::ldexp(mag, -24);
    c.check(std::fabs(double(got[std::size_t(j)]) - exact) <= bound, [&] {
      return "column " + std::to_string(j) + ": " + show(got[std::size_t(j)]) + ", exact " +
             std::to_string(exact);
    });
  }
  // The bytes are those of the cast without sums.
  compare(c, "q with sums", download(q), download(s), ref_1x128(xs, rows, cols));
  c.report();
}

BOOST_AUTO_TEST_CASE(bad_arguments_throw) {
  const auto x = upload(std::vector<float>(128 * 256, 1.0f));
  Kokkos::View<float8_e4m3_t*> q("q", 128 * 256), small("small", 100);
  Kokkos::View<float*> s("s", std::size_t(kshard::fp8_scales_1x128(128, 256)));
  Kokkos::View<float*> s2("s2", std::size_t(kshard::fp8_scales_128x128(128, 256)));
  BOOST_CHECK_THROW(kshard::fp8_cast_1x128(x, 64, 512, q, s, {}, {}), kshard::Error);  // rows % 128
  BOOST_CHECK_THROW(kshard::fp8_cast_1x128(x, 128, 128, q, s, {}, {}), kshard::Error);  // x size
  BOOST_CHECK_THROW(kshard::fp8_cast_1x128(x, 128, 256, small, s, {}, {}), kshard::Error);
  BOOST_CHECK_THROW(kshard::fp8_cast_1x128(x, 128, 256, q, s2, {}, {}), kshard::Error);  // scales
  BOOST_CHECK_THROW(kshard::fp8_cast_1x128(x, 128, 256, {}, {}, {}, {}), kshard::Error);  // no output
  BOOST_CHECK_THROW(kshard::fp8_cast_128x128(x, 128, 256, q, s, {}, {}), kshard::Error);  // 1x128 scales
  Kokkos::View<float*> db("db", 255), partials("p", 256);
  BOOST_CHECK_THROW(kshard::fp8_cast_1x128(x, 128, 256, q, s, {}, {}, db, partials), kshard::Error);
  BOOST_CHECK_NO_THROW(kshard::fp8_cast_128x128(x, 128, 256, q, s2, {}, {}));
}

BOOST_AUTO_TEST_SUITE_END()
