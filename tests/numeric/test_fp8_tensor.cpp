// kshard/kernels/fp8_tensor.hpp (per-tensor scaled fp8 casts) against
// the scalar reference of fp8_reference.hpp with the whole tensor as one
// block: q bit for bit, the transposed copy, the scale and the amax, for both
// formats, tile-straddling shapes, special values, and the delayed-scaling
// mode (a given scale, saturation, amax folded with a max).
#include <boost/mpl/list.hpp>
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include <Kokkos_Core.hpp>

#include "checker.hpp"
#include "fp8_reference.hpp"
#include "fp8_test_io.hpp"
#include "kshard/kernels/fp8_tensor.hpp"
#include "kshard/kernels/gelu.hpp"
#include "kshard/error.hpp"
#include "kshard/numeric/convert.hpp"

using namespace kshard_test;
using kshard::bfloat16_t;

namespace {

/// Casts x [rows, cols] with current scaling (amax pass + cast) and checks q,
/// qt, scale and amax against the reference.
template <class Fp8>
void check_current(const std::vector<float>& xs, std::int64_t rows, std::int64_t cols,
                   const std::string& what) {
  const auto x = upload(xs);
  kshard::Fp8Scale s;
  Kokkos::View<Fp8*> q("q", xs.size()), qt("qt", xs.size());
  kshard::fp8_amax(x, s);
  kshard::fp8_cast(x, rows, cols, s, kshard::Fp8ScaleFrom::amax, q, qt);
  // The row-major copy alone takes another kernel (a flat stream where the
  // size allows): it must give the same bytes.
  kshard::Fp8Scale s_rows;
  Kokkos::View<Fp8*> q_rows("q_rows", xs.size());
  kshard::fp8_amax(x, s_rows);
  kshard::fp8_cast(x, rows, cols, s_rows, kshard::Fp8ScaleFrom::amax, q_rows, {});
  const RefQuant r = ref_quantize<Fp8>(xs, int(xs.size()));
  double amax = 0;
  for (float v : xs)
    if (std::isfinite(v)) amax = std::max(amax, std::fabs(double(v)));
  Checker c(std::string(table<Fp8>().fmt.name) + " per-tensor " + what + " [" + std::to_string(rows) + ", " +
            std::to_string(cols) + "]");
  const float scale = s.scale_inv_host(), got_amax = s.amax_host();
  c.check(scale == r.scales.at(0), [&] { return "scale " + show(scale) + ", want " + show(r.scales[0]); });
  c.check(double(got_amax) == amax, [&] { return "amax " + show(got_amax); });
  const auto hq = download(q), hqt = download(qt), hq_rows = download(q_rows);
  c.check(s_rows.scale_inv_host() == scale, [&] { return "scale of the row-only cast differs"; });
  for (std::int64_t i = 0; i < rows; ++i)
    for (std::int64_t j = 0; j < cols; ++j) {
      const std::size_t k = std::size_t(i * cols + j), t = std::size_t(j * rows + i);
      c.check(hq[k].bits == r.q[k], [&] {
        return "q(" + std::to_string(i) + "," + std::to_string(j) + ") of " + show(xs[k]) + " = " +
               hex(hq[k].bits, 2) + ", want " + hex(r.q[k], 2);
      });
      c.check(hq_rows[k].bits == r.q[k], [&] {
        return "row-only q(" + std::to_string(i) + "," + std::to_string(j) + ") = " +
               hex(hq_rows[k].bits, 2) + ", want " + hex(r.q[k], 2);
      });
      c.check(hqt[t].bits == r.q[k], [&] {
        return "qt(" + std::to_string(j) + "," + std::to_string(i) + ") = " + hex(hqt[t].bits, 2) +
               ", want " + hex(r.q[k], 2);
      });
    }
  c.report();
}

using Fp8Types = boost::mpl::list<kshard::float8_e4m3_t, kshard::float8_e5m2_t>;

}  // namespace

BOOST_AUTO_TEST_SUITE(numeric_fp8_tensor)

BOOST_AUTO_TEST_CASE_TEMPLATE(current_scaling_matches_reference, Fp8, Fp8Types) {
  // Shapes inside one 64x64 tile, exactly one, and straddling tiles both ways;
  // multiples of 8 take the eight-wide kernels, the others the element ones
  // ({68, 132}: multiples of 4 only; {17, 200}: a flat stream of whole
  // vectors for the row-only cast, element-wise for the transposed one).
  const std::pair<int, int> shapes[] = {{1, 1},    {3, 5},     {64, 64},  {70, 130},
                                        {128, 256}, {17, 200}, {72, 136}, {68, 132}, {8, 8}};
  std::uint32_t seed = 1;
  for (auto [r, c] : shapes)
    check_current<Fp8>(bf16_values(std::size_t(r) * c, seed++), r, c, "random");
  // Small and large magnitudes: the scale moves far from 1 both ways.
  check_current<Fp8>(bf16_values(96 * 80, 40, -60, -50), 96, 80, "tiny values");
  check_current<Fp8>(bf16_values(96 * 80, 41, 60, 70), 96, 80, "huge values");
  // bf16 subnormals (float subnormal amax: scale clamped at 2^-126).
  check_current<Fp8>(bf16_values(32 * 48, 42, -133, -127), 32, 48, "subnormal values");
}

BOOST_AUTO_TEST_CASE_TEMPLATE(special_values, Fp8, Fp8Types) {
  std::vector<float> xs = bf16_values(40 * 24, 7);
  const float inf = std::numeric_limits<float>::infinity();
  xs[3] = std::numeric_limits<float>::quiet_NaN();
  xs[100] = inf;
  xs[101] = -inf;
  xs[500] = -0.0f;
  check_current<Fp8>(xs, 40, 24, "with NaN, +-inf, -0");
  // Only non-finite values and zeros: amax 0, scale 1.
  std::vector<float> bad(16 * 16, 0.0f);
  bad[0] = inf;
  bad[5] = std::numeric_limits<float>::quiet_NaN();
  check_current<Fp8>(bad, 16, 16, "zeros and non-finite only");
  check_current<Fp8>(std::vector<float>(32 * 16, 0.0f), 32, 16, "all zero");
}

BOOST_AUTO_TEST_CASE_TEMPLATE(given_scale_saturates_and_folds_amax, Fp8, Fp8Types) {
  // Delayed scaling: the scale is set beforehand (here by a cast of a tensor
  // 16x smaller), so the larger tensor's top values saturate; the cast folds
  // its amax into the state with a max.
  const std::int64_t rows = 48, cols = 80;
  std::vector<float> small = bf16_values(std::size_t(rows * cols), 9);
  std::vector<float> big = small;
  for (auto& v : big) v *= 16.0f;
  kshard::Fp8Scale s;
  Kokkos::View<Fp8*> q("q", small.size()), none;
  kshard::fp8_amax(upload(small), s);
  kshard::fp8_cast(upload(small), rows, cols, s, kshard::Fp8ScaleFrom::amax, q, none);
  const float scale = s.scale_inv_host();
  kshard::fp8_cast(upload(big), rows, cols, s, kshard::Fp8ScaleFrom::scale, q, none);
  BOOST_TEST(s.scale_inv_host() == scale);  // unchanged
  double amax = 0;
  for (float v : big) amax = std::max(amax, std::fabs(double(v)));
  BOOST_TEST(double(s.amax_host()) == amax);
  const RefTable& t = table<Fp8>();
  const auto hq = download(q);
  Checker c(std::string(t.fmt.name) + " cast with a given scale (saturating)");
  for (std::size_t i = 0; i < big.size(); ++i) {
    const std::uint32_t want = t.encode(double(big[i]) / scale, true);  // saturating
    c.check(hq[i].bits == want, [&] { return show(big[i]) + " -> " + hex(hq[i].bits, 2); });
  }
  c.report();
  // A second, smaller tensor cast with that scale keeps the larger amax.
  kshard::fp8_cast(upload(small), rows, cols, s, kshard::Fp8ScaleFrom::scale, q, none);
  BOOST_TEST(double(s.amax_host()) == amax);
}

BOOST_AUTO_TEST_CASE(amax_history_sets_delayed_scales) {
  // Three tensors (E4M3, E5M2, E4M3), history length 3, both algorithms,
  // against a host model of the history: each step casts one tensor of
  // amax a(t, step) with the scale the history set, then update().
  const std::int64_t rows = 16, cols = 16;
  const double amaxes[5][3] = {{1.0, 3e-3, 0.0}, {40.0, 1e-3, 0.0}, {2.0, 2e-2, 5.0},
                               {0.5, 1e-3, 0.0}, {0.25, 1e-4, 0.0}};
  for (auto algo : {kshard::Fp8AmaxAlgo::max, kshard::Fp8AmaxAlgo::most_recent}) {
    kshard::Fp8Scale a("a", kshard::Fp8Format::e4m3), b("b", kshard::Fp8Format::e5m2),
        c("c", kshard::Fp8Format::e4m3);
    kshard::Fp8Scale* all[] = {&a, &b, &c};
    kshard::Fp8AmaxHistory h({&a, &b, &c}, 3, algo);
    std::vector<std::vector<double>> hist(3);
    const double fmax[3] = {448.0, 57344.0, 448.0};
    Checker chk(std::string("amax history, ") +
                (algo == kshard::Fp8AmaxAlgo::max ? "max" : "most_recent"));
    for (int step = 0; step < 5; ++step) {
      for (int t = 0; t < 3; ++t) {
        // expected scale in effect for this step
        double ref = 0;
        if (!hist[t].empty()) {
          if (algo == kshard::Fp8AmaxAlgo::max)
            for (double v : hist[t]) ref = std::max(ref, v);
          else
            ref = hist[t].back();
        }
        const float want = float(ref_scale(ref, fmax[t]));
        const float got = all[t]->scale_inv_host();
        chk.check(got == want, [&] {
          return "step " + std::to_string(step) + " tensor " + std::to_string(t) + ": scale " +
                 show(got) + ", want " + show(want);
        });
        if (amaxes[step][t] > 0) {
          std::vector<float> xs(std::size_t(rows * cols), 0.0f);
          xs[7] = float(-amaxes[step][t]);  // bf16-exact magnitudes
          xs[8] = float(amaxes[step][t] / 2);
          if (t == 1) {
            Kokkos::View<kshard::float8_e5m2_t*> q("q", xs.size()), none;
            kshard::fp8_cast(upload(xs), rows, cols, *all[t], kshard::Fp8ScaleFrom::scale, q, none);
          } else {
            Kokkos::View<kshard::float8_e4m3_t*> q("q", xs.size()), none;
            kshard::fp8_cast(upload(xs), rows, cols, *all[t], kshard::Fp8ScaleFrom::scale, q, none);
          }
        }
        hist[t].push_back(double(kshard::to_float(kshard::from_float<bfloat16_t>(float(amaxes[step][t])))));
        if (hist[t].size() > 3) hist[t].erase(hist[t].begin());
      }
      h.update();
      for (int t = 0; t < 3; ++t)
        chk.check(all[t]->amax_host() == 0.0f, [&] { return "amax not reset by update()"; });
    }
    chk.report();
    // state() round trip: a fresh set with the saved state scales identically.
    const std::vector<float> st = h.state();
    BOOST_TEST(st.size() == 4 * 3 + 3 * 3 + 2u);  // 16-byte slots
    BOOST_TEST(a.calibrated());
    kshard::Fp8Scale a2("a", kshard::Fp8Format::e4m3), b2("b", kshard::Fp8Format::e5m2),
        c2("c", kshard::Fp8Format::e4m3);
    kshard::Fp8AmaxHistory h2({&a2, &b2, &c2}, 3, algo);
    BOOST_TEST(!a2.calibrated());
    h2.set_state(st);
    BOOST_TEST(h2.state() == st);
    BOOST_TEST(a2.calibrated());
    BOOST_TEST(b2.scale_inv_host() == b.scale_inv_host());
    h.update();
    h2.update();
    BOOST_TEST(h2.state() == h.state());
    std::vector<float> bad = st;
    bad.pop_back();
    BOOST_CHECK_THROW(h2.set_state(bad), kshard::Error);
    bad = st;
    bad[bad.size() - 2] = 3.0f;  // position out of range
    BOOST_CHECK_THROW(h2.set_state(bad), kshard::Error);
  }
  kshard::Fp8Scale x;
  BOOST_CHECK_THROW(kshard::Fp8AmaxHistory({&x}, 0, kshard::Fp8AmaxAlgo::max), kshard::Error);
}

// fp8_cast_dbias: the same bytes as fp8_cast, and dbias += the column sums of
// dy. Bound: each column is summed in f32 (64-row tiles, 16-row groups), so
// |got - exact| <= rows * 2^-24 * sum |dy| over the column (the textbook
// bound for recursive f32 summation, plus the one rounding of the +=).
BOOST_AUTO_TEST_CASE(cast_dbias_sums_columns) {
  using E5 = kshard::float8_e5m2_t;
  const std::pair<int, int> shapes[] = {{72, 136}, {70, 130}, {200, 64}, {8, 8}, {256, 48}};
  std::uint32_t seed = 100;
  for (auto [rows, cols] : shapes) {
    const auto xs = bf16_values(std::size_t(rows) * cols, seed++, -10, 4);
    const auto x = upload(xs);
    kshard::Fp8Scale s_ref("ref", kshard::Fp8Format::e5m2), s("dbias", kshard::Fp8Format::e5m2);
    Kokkos::View<E5*> q_ref("q_ref", xs.size()), qt_ref("qt_ref", xs.size()), q("q", xs.size()),
        qt("qt", xs.size());
    kshard::fp8_amax(x, s_ref);
    kshard::fp8_cast(x, rows, cols, s_ref, kshard::Fp8ScaleFrom::amax, q_ref, qt_ref);
    std::vector<float> start(static_cast<std::size_t>(cols));
    for (int c = 0; c < cols; ++c) start[std::size_t(c)] = 0.25f * float(c % 7) - 0.5f;
    Kokkos::View<float*> db("db", cols), partials("partials", kshard::fp8_column_sum_partials(rows, cols));
    {
      auto h = Kokkos::create_mirror_view(db);
      for (int c = 0; c < cols; ++c) h(c) = start[std::size_t(c)];
      Kokkos::deep_copy(db, h);
    }
    kshard::fp8_amax(x, s);
    kshard::fp8_cast_dbias(x, rows, cols, s, kshard::Fp8ScaleFrom::amax, q, qt, db, partials);
    Checker c("fp8_cast_dbias [" + std::to_string(rows) + ", " + std::to_string(cols) + "]");
    const auto hq = download(q), hqt = download(qt), hq_ref = download(q_ref), hqt_ref = download(qt_ref);
    for (std::size_t i = 0; i < hq.size(); ++i) {
      c.check(hq[i].bits == hq_ref[i].bits, [&] { return "q[" + std::to_string(i) + "] differs from fp8_cast's"; });
      c.check(hqt[i].bits == hqt_ref[i].bits, [&] { return "qt[" + std::to_string(i) + "] differs from fp8_cast's"; });
    }
    const auto hdb = download(db);
    for (int col = 0; col < cols; ++col) {
      double exact = start[std::size_t(col)], mag = std::fabs(exact);
      for (int r = 0; r < rows; ++r) {
        exact += xs[std::size_t(r) * cols + col];
        mag += std::fabs(xs[std::size_t(r) * cols + col]);
      }
      const double bound = (rows + 1) * std::ldexp(mag, -24) + 1e-30;
      c.check(std::fabs(hdb[std::size_t(col)] - exact) <= bound, [&] {
        return "dbias[" + std::to_string(col) + "] = " + show(hdb[std::size_t(col)]) + ", exact " +
               std::to_string(exact) + ", bound " + std::to_string(bound);
      });
    }
    c.report();
  }
  // Sizes: dbias must have cols floats and partials enough room.
  kshard::Fp8Scale s("bad", kshard::Fp8Format::e5m2);
  Kokkos::View<bfloat16_t*> x("x", 64 * 16);
  Kokkos::View<E5*> q("q", 64 * 16), none;
  Kokkos::View<float*> db("db", 16), short_db("short", 15), partials("p", 16), few("few", 15);
  BOOST_CHECK_THROW(kshard::fp8_cast_dbias(x, 64, 16, s, kshard::Fp8ScaleFrom::amax, q, none, short_db, partials),
                    kshard::Error);
  BOOST_CHECK_THROW(kshard::fp8_cast_dbias(x, 64, 16, s, kshard::Fp8ScaleFrom::amax, q, none, db, few),
                    kshard::Error);
  BOOST_CHECK_THROW(kshard::fp8_cast_dbias(x, 64, 16, s, kshard::Fp8ScaleFrom::amax, q, none, {}, partials),
                    kshard::Error);
}

// The GELU steps of Fp8Input: the amax and every cast kernel (row stream,
// tiles of eight with q and/or qt, the element-wise tiles, the dbias cast)
// must give the bytes, scale, amax and bias sums of the same cast of the
// tensor gelu_forward / gelu_backward write; both scale sources, both
// formats. Values in (-16, 16) with zeros, plus +-inf (gelu(-inf) is NaN:
// not counted in the amax).
BOOST_AUTO_TEST_CASE_TEMPLATE(gelu_steps_cast_what_gelu_writes, Fp8, Fp8Types) {
  const std::pair<int, int> shapes[] = {{64, 64}, {128, 256}, {70, 130}, {17, 200}, {8, 8}, {3, 5}};
  std::uint32_t seed = 300;
  for (auto [rows, cols] : shapes) {
    std::vector<float> xs = bf16_values(std::size_t(rows) * cols, seed++, -8, 3);
    xs[1] = std::numeric_limits<float>::infinity();
    xs[2] = -std::numeric_limits<float>::infinity();
    const std::size_t n = xs.size();
    const auto x = upload(xs), pre = upload(bf16_values(n, seed++, -6, 2));
    for (auto in : {kshard::Fp8Input::gelu_of_x, kshard::Fp8Input::gelu_grad}) {
      const bool grad = in == kshard::Fp8Input::gelu_grad;
      Kokkos::View<const bfloat16_t*> p = grad ? pre : Kokkos::View<const bfloat16_t*>();
      Kokkos::View<bfloat16_t*> w("written", n);  // what gelu_forward / gelu_backward write
      if (grad)
        kshard::detail::gelu_backward<bfloat16_t>(pre, x, w);
      else
        kshard::detail::gelu_forward<bfloat16_t>(x, w);
      Checker c(std::string(table<Fp8>().fmt.name) + (grad ? " cast of x gelu'(pre) [" : " cast of gelu(x) [") +
                std::to_string(rows) + ", " + std::to_string(cols) + "]");
      auto same_bytes = [&](const std::string& what, const Kokkos::View<Fp8*>& mine,
                            const Kokkos::View<Fp8*>& want) {
        const auto hm = download(mine), hw = download(want);
        for (std::size_t i = 0; i < hm.size(); ++i)
          c.check(hm[i].bits == hw[i].bits, [&] {
            return what + "[" + std::to_string(i) + "] = " + hex(hm[i].bits, 2) + ", want " + hex(hw[i].bits, 2);
          });
      };
      for (auto from : {kshard::Fp8ScaleFrom::amax, kshard::Fp8ScaleFrom::scale}) {
        const bool cur = from == kshard::Fp8ScaleFrom::amax;
        // (q, qt), q alone, qt alone, and (q, qt) with the bias sums.
        for (int outputs = 0; outputs < 4; ++outputs) {
          const bool sums = outputs == 3;
          if (sums && !grad) continue;  // a bias gradient comes with a gradient's cast
          kshard::Fp8Scale sw, sx;  // scale_inv 1 for the given-scale runs
          Kokkos::View<Fp8*> qw("qw", outputs != 2 ? n : 0), qtw("qtw", outputs != 1 ? n : 0);
          Kokkos::View<Fp8*> qx("qx", outputs != 2 ? n : 0), qtx("qtx", outputs != 1 ? n : 0);
          Kokkos::View<float*> dbw("dbw", cols), dbx("dbx", cols);
          Kokkos::View<float*> part("part", kshard::fp8_column_sum_partials(rows, cols));
          if (cur) {
            kshard::fp8_amax(w, sw);
            kshard::fp8_amax(x, sx, in, p);
          }
          if (!sums) {
            kshard::fp8_cast(w, rows, cols, sw, from, qw, qtw);
            kshard::fp8_cast(x, rows, cols, sx, from, qx, qtx, in, p);
          } else if constexpr (std::is_same_v<Fp8, kshard::float8_e5m2_t>) {
            kshard::fp8_cast_dbias(w, rows, cols, sw, from, qw, qtw, dbw, part);
            kshard::fp8_cast_dbias(x, rows, cols, sx, from, qx, qtx, dbx, part, in, p);
          } else {
            continue;  // the dbias cast is E5M2's (a gradient)
          }
          const std::string what = std::string(cur ? "current" : "given scale") +
                                   (outputs == 0 ? ", q and qt" : outputs == 1 ? ", q" : outputs == 2 ? ", qt" : ", dbias");
          c.check(sx.scale_inv_host() == sw.scale_inv_host() && sx.amax_host() == sw.amax_host(), [&] {
            return what + ": scale " + show(sx.scale_inv_host()) + " amax " + show(sx.amax_host()) +
                   ", want " + show(sw.scale_inv_host()) + " " + show(sw.amax_host());
          });
          same_bytes(what + ": q", qx, qw);
          same_bytes(what + ": qt", qtx, qtw);
          const auto hx = download(dbx), hw = download(dbw);
          for (int col = 0; col < cols; ++col)
            c.check(hx[std::size_t(col)] == hw[std::size_t(col)], [&] {
              return what + ": dbias[" + std::to_string(col) + "] = " + show(hx[std::size_t(col)]) +
                     ", want " + show(hw[std::size_t(col)]);
            });
        }
      }
      c.report();
    }
  }
  // The step's arguments: gelu_grad needs pre of x's size, the others none.
  kshard::Fp8Scale s;
  Kokkos::View<bfloat16_t*> x("x", 64), short_pre("short", 63);
  Kokkos::View<Fp8*> q("q", 64);
  BOOST_CHECK_THROW(kshard::fp8_cast(x, 8, 8, s, kshard::Fp8ScaleFrom::amax, q, {},
                                     kshard::Fp8Input::gelu_grad, short_pre),
                    kshard::Error);
  BOOST_CHECK_THROW(kshard::fp8_cast(x, 8, 8, s, kshard::Fp8ScaleFrom::amax, q, {},
                                     kshard::Fp8Input::gelu_grad),
                    kshard::Error);
  BOOST_CHECK_THROW(kshard::fp8_cast(x, 8, 8, s, kshard::Fp8ScaleFrom::amax, q, {},
                                     kshard::Fp8Input::gelu_of_x, x),
                    kshard::Error);
  BOOST_CHECK_THROW(kshard::fp8_amax(x, s, kshard::Fp8Input::gelu_grad, short_pre), kshard::Error);
}

BOOST_AUTO_TEST_CASE(bad_sizes_throw) {
  kshard::Fp8Scale s;
  Kokkos::View<bfloat16_t*> x("x", 12);
  Kokkos::View<kshard::float8_e4m3_t*> q("q", 12), wrong("w", 11), none;
  BOOST_CHECK_THROW(kshard::fp8_cast(x, 3, 5, s, kshard::Fp8ScaleFrom::amax, q, none), kshard::Error);
  BOOST_CHECK_THROW(kshard::fp8_cast(x, 3, 4, s, kshard::Fp8ScaleFrom::amax, wrong, none),
                    kshard::Error);
  BOOST_CHECK_THROW(kshard::fp8_cast(x, 3, 4, s, kshard::Fp8ScaleFrom::amax, none, none),
                    kshard::Error);
  BOOST_CHECK_NO_THROW(kshard::fp8_cast(x, 3, 4, s, kshard::Fp8ScaleFrom::amax, none, q));
}

BOOST_AUTO_TEST_SUITE_END()
