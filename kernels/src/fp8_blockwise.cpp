#include "kshard/kernels/fp8_blockwise.hpp"

#include <string>

#include "kshard/compat/for_each.hpp"
#include "kshard/error.hpp"
#include "kshard/numeric/convert.hpp"
#include "fp8_scaling.hpp"

namespace kshard {
namespace {

using Member = Kokkos::TeamPolicy<>::member_type;
using E4 = float8_e4m3_t;
using detail::Bf16x8;
using detail::bf16_bits_float;

constexpr int kB = int(kFp8Block);
constexpr int kVectors = kB / 8;  // eight-element vectors per tile row
// Tile rows of 136 bf16 (272 bytes): 16-byte aligned for the vector stores,
// and rows 4 banks apart, so the column walks do not all hit one bank.
constexpr int kStride = kB + 8;

std::int64_t round_up4(std::int64_t n) { return (n + 3) / 4 * 4; }

KOKKOS_INLINE_FUNCTION float max_of(float a, float b) { return a > b ? a : b; }
KOKKOS_INLINE_FUNCTION std::uint32_t max_bits(std::uint32_t pair) {
  return (pair & 0xFFFFu) > (pair >> 16) ? (pair & 0xFFFFu) : (pair >> 16);
}

// One team per 128 x 128 tile of x [rows, cols]: the tile is staged in team
// scratch as bf16, its amaxes taken per row and per column (and per tile),
// then q is written along the tile's rows and qt along its columns, eight
// encoded bytes per store.
//   1x128:   q's scale per tile row (a 128-block along cols), qt's per tile
//            column (a 128-block along rows); column sums for dbias.
//   128x128: one scale for the tile, for q and qt alike.
struct CastBlockTiles {
  const Bf16x8* x;                 // [rows, cols / 8]
  std::uint64_t *q, *qt;           // [rows, cols / 8], [cols, rows / 8] groups of eight
  float *q_scales, *qt_scales;
  float* partials;                 // 1x128 with dbias: [rows / 128, cols] column sums
  std::int64_t rows, cols, tiles_c, q_ld, qt_ld;  // q_ld / qt_ld: 128x128 grid strides
  bool tile_scale;                 // 128x128
  Fp8Input input;                  // the step applied as the tile is staged
  const Bf16x8* pre;               // GELU's input (Fp8Input::gelu_grad)

  using Tile = Kokkos::View<std::uint16_t**, Kokkos::LayoutRight,
                            Kokkos::DefaultExecutionSpace::scratch_memory_space,
                            Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
  using Floats = Kokkos::View<float*, Kokkos::DefaultExecutionSpace::scratch_memory_space,
                              Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
  // part: [0, 256) row halves' amaxes, [256, 768) column quarters' amaxes,
  // [768, 1280) column quarters' sums; amax: [0, 128) rows, [128, 256) columns.
  static constexpr int kRowParts = 2 * kB, kColParts = 4 * kB;
  static std::size_t scratch_bytes() {
    return Tile::shmem_size(kB, kStride) + Floats::shmem_size(kRowParts + 2 * kColParts) +
           Floats::shmem_size(2 * kB);
  }

  KOKKOS_INLINE_FUNCTION void operator()(const Member& team) const {
    const std::int64_t tr = team.league_rank() / tiles_c, tc = team.league_rank() % tiles_c;
    const std::int64_t r0 = tr * kB, c0 = tc * kB;
    Tile tile(team.team_scratch(0), kB, kStride);
    Floats part(team.team_scratch(0), kRowParts + 2 * kColParts);
    Floats amax(team.team_scratch(0), 2 * kB);
    const bool sums = partials != nullptr;
    // Row amaxes feed q's scales and the tile's; column amaxes qt's, and the
    // column sums the bias gradient: only what this cast writes is taken.
    const bool rows_needed = tile_scale || q != nullptr;
    const bool cols_needed = (!tile_scale && qt != nullptr) || sums;

    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, kB * kVectors), [&](const int v) {
      const int r = v / kVectors, c = (v % kVectors) * 8;
      const std::int64_t j = ((r0 + r) * cols + c0 + c) / 8;
      const Bf16x8 in = detail::cast_input(input, x[j], pre ? pre + j : nullptr);
      auto* dst = reinterpret_cast<std::uint64_t*>(&tile(r, c));
      dst[0] = in.lo;
      dst[1] = in.hi;
    });
    team.team_barrier();
    if (rows_needed)  // two threads a row, four values per scratch load
      Kokkos::parallel_for(Kokkos::TeamThreadRange(team, kRowParts), [&](const int t) {
        const int i = t / 2, h = (t % 2) * (kB / 2);
        const auto* src = reinterpret_cast<const std::uint32_t*>(&tile(i, h));
        std::uint32_t m = 0;  // two lanes' amax bits
        for (int j = 0; j < kB / 4; ++j) m = detail::bf16x2_amax_bits(m, src[j]);
        part(t) = bf16_bits_float(std::uint16_t(max_bits(m)));
      });
    if (cols_needed)  // a column pair per thread (one 4-byte load), a quarter of the rows
      Kokkos::parallel_for(Kokkos::TeamThreadRange(team, kB / 2 * 4), [&](const int t) {
        const int p = t % (kB / 2), g = t / (kB / 2);
        std::uint32_t m = 0;  // the pair's amax bits
        float s0 = 0.0f, s1 = 0.0f;
        for (int r = g * (kB / 4); r < (g + 1) * (kB / 4); ++r) {
          const std::uint32_t w = *reinterpret_cast<const std::uint32_t*>(&tile(r, 2 * p));
          m = detail::bf16x2_amax_bits(m, w);
          if (sums) {
            s0 += bf16_bits_float(std::uint16_t(w));
            s1 += bf16_bits_float(std::uint16_t(w >> 16));
          }
        }
        part(kRowParts + g * kB + 2 * p) = bf16_bits_float(std::uint16_t(m));
        part(kRowParts + g * kB + 2 * p + 1) = bf16_bits_float(std::uint16_t(m >> 16));
        part(kRowParts + kColParts + g * kB + 2 * p) = s0;
        part(kRowParts + kColParts + g * kB + 2 * p + 1) = s1;
      });
    team.team_barrier();
    float whole = 0.0f;
    if (tile_scale) {  // (never with sums: the bias gradient comes with 1x128 casts)
      compat::team_reduce(
          team, kRowParts, [&](const int t, float& m) { m = max_of(m, part(t)); },
          Kokkos::Max<float>(whole));
    } else {
      Kokkos::parallel_for(Kokkos::TeamThreadRange(team, kB), [&](const int i) {
        if (rows_needed) amax(i) = max_of(part(2 * i), part(2 * i + 1));
        if (cols_needed) {
          const float* m = &part(kRowParts + i);
          amax(kB + i) = max_of(max_of(m[0], m[kB]), max_of(m[2 * kB], m[3 * kB]));
          const float* s = &part(kRowParts + kColParts + i);
          if (sums) partials[tr * cols + c0 + i] = (s[0] + s[kB]) + (s[2 * kB] + s[3 * kB]);
        }
      });
      team.team_barrier();
    }
    const int k_tile = detail::fp8_scale_exponent<E4>(whole);
    if (q) {
      Kokkos::parallel_for(Kokkos::TeamThreadRange(team, kB * kVectors), [&](const int v) {
        const int r = v / kVectors, c = (v % kVectors) * 8;
        const int k = tile_scale ? k_tile : detail::fp8_scale_exponent<E4>(amax(r));
        const auto* src = reinterpret_cast<const std::uint64_t*>(&tile(r, c));
        float unused = 0.0f;
        q[((r0 + r) * cols + c0 + c) / 8] =
            detail::encode8<E4>(Bf16x8{src[0], src[1]}, detail::fp8_pow2(-k), unused);
        if (!tile_scale && c == 0) q_scales[tc * rows + r0 + r] = detail::fp8_pow2(k);
      });
      if (tile_scale)
        Kokkos::single(Kokkos::PerTeam(team), [&]() {
          q_scales[tr * q_ld + tc] = detail::fp8_pow2(k_tile);
          // The grid's padding to 16-byte rows holds 1s, so every float a
          // GEMM may load was written.
          if (tc == tiles_c - 1)
            for (std::int64_t j = tiles_c; j < q_ld; ++j) q_scales[tr * q_ld + j] = 1.0f;
        });
    }
    if (qt) {
      // A column pair per lane (4-byte scratch loads, consecutive lanes on
      // consecutive words), eight rows: eight encoded bytes to each of two qt rows.
      Kokkos::parallel_for(Kokkos::TeamThreadRange(team, kB / 2 * kVectors), [&](const int v) {
        const int p = v % (kB / 2), r = (v / (kB / 2)) * 8, c = 2 * p;
        const int k0 = tile_scale ? k_tile : detail::fp8_scale_exponent<E4>(amax(kB + c));
        const int k1 = tile_scale ? k_tile : detail::fp8_scale_exponent<E4>(amax(kB + c + 1));
        std::uint64_t lo0 = 0, hi0 = 0, lo1 = 0, hi1 = 0;
        for (int e = 0; e < 4; ++e) {
          const std::uint32_t a = *reinterpret_cast<const std::uint32_t*>(&tile(r + e, c));
          const std::uint32_t b = *reinterpret_cast<const std::uint32_t*>(&tile(r + 4 + e, c));
          lo0 |= std::uint64_t(a & 0xFFFFu) << (16 * e);
          lo1 |= std::uint64_t(a >> 16) << (16 * e);
          hi0 |= std::uint64_t(b & 0xFFFFu) << (16 * e);
          hi1 |= std::uint64_t(b >> 16) << (16 * e);
        }
        float unused = 0.0f;
        qt[((c0 + c) * rows + r0 + r) / 8] =
            detail::encode8<E4>(Bf16x8{lo0, hi0}, detail::fp8_pow2(-k0), unused);
        qt[((c0 + c + 1) * rows + r0 + r) / 8] =
            detail::encode8<E4>(Bf16x8{lo1, hi1}, detail::fp8_pow2(-k1), unused);
        if (!tile_scale && r == 0) {
          qt_scales[tr * cols + c0 + c] = detail::fp8_pow2(k0);
          qt_scales[tr * cols + c0 + c + 1] = detail::fp8_pow2(k1);
        }
      });
      if (tile_scale)
        Kokkos::single(Kokkos::PerTeam(team), [&]() {
          qt_scales[tc * qt_ld + tr] = detail::fp8_pow2(k_tile);
          if (tr == rows / kB - 1)
            for (std::int64_t j = rows / kB; j < qt_ld; ++j) qt_scales[tc * qt_ld + j] = 1.0f;
        });
    }
  }
};

// q alone with 1x128 scales (the forward's x): nothing is transposed, so no
// tile is staged. Each thread loads one eight-element vector, sixteen threads
// make a 128-block, and the block's amax meets in team scratch: one barrier,
// 5 KB of scratch a team (the tile kernel's 39 KB held five teams per SM).
struct CastRows1x128 {
  const Bf16x8* x;     // [rows, cols / 8]
  std::uint64_t* q;    // the same shape, eight fp8 a group
  float* q_scales;     // [cols / 128][rows]
  std::int64_t rows, cols;
  Fp8Input input;      // the step applied on load
  const Bf16x8* pre;   // GELU's input (Fp8Input::gelu_grad)

  static constexpr int kThreads = 256;
  using Vectors = Kokkos::View<Bf16x8*, Kokkos::DefaultExecutionSpace::scratch_memory_space,
                               Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
  using Bits = Kokkos::View<std::uint32_t*, Kokkos::DefaultExecutionSpace::scratch_memory_space,
                            Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
  static std::size_t scratch_bytes() {
    return Vectors::shmem_size(kThreads) + Bits::shmem_size(kThreads);
  }
  std::int64_t vectors() const { return rows * cols / 8; }

  KOKKOS_INLINE_FUNCTION void operator()(const Member& team) const {
    Vectors vec(team.team_scratch(0), kThreads);
    Bits bits(team.team_scratch(0), kThreads);
    const std::int64_t v0 = std::int64_t(team.league_rank()) * kThreads, n = rows * cols / 8;
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, kThreads), [&](const int i) {
      const std::int64_t j = v0 + i;
      const Bf16x8 in =
          j < n ? detail::cast_input(input, x[j], pre ? pre + j : nullptr) : Bf16x8{0, 0};
      vec(i) = in;
      std::uint32_t m = detail::bf16x2_amax_bits(0, std::uint32_t(in.lo));
      m = detail::bf16x2_amax_bits(m, std::uint32_t(in.lo >> 32));
      m = detail::bf16x2_amax_bits(m, std::uint32_t(in.hi));
      m = detail::bf16x2_amax_bits(m, std::uint32_t(in.hi >> 32));
      bits(i) = max_bits(m);
    });
    team.team_barrier();
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, kThreads), [&](const int i) {
      const std::int64_t v = v0 + i;
      if (v >= n) return;
      // cols % 128 == 0 and v0 % 16 == 0: a block is 16 aligned vectors.
      const int b = i / kVectors * kVectors;
      std::uint32_t m = 0;
      for (int j = 0; j < kVectors; ++j) m = bits(b + j) > m ? bits(b + j) : m;
      const int k = detail::fp8_scale_exponent<E4>(bf16_bits_float(std::uint16_t(m)));
      float unused = 0.0f;
      q[v] = detail::encode8<E4>(vec(i), detail::fp8_pow2(-k), unused);
      if (i == b) {
        const std::int64_t r = v / (cols / 8), cb = (v % (cols / 8)) / kVectors;
        q_scales[cb * rows + r] = detail::fp8_pow2(k);
      }
    });
  }
};

void check(const char* who, Kokkos::View<const bfloat16_t*> x, std::int64_t rows,
           std::int64_t cols, std::size_t q, std::size_t q_scales, std::int64_t want_q_scales,
           std::size_t qt, std::size_t qt_scales, std::int64_t want_qt_scales) {
  const std::string w = std::string(who) + " of [" + std::to_string(rows) + ", " +
                        std::to_string(cols) + "]";
  if (!fp8_blockwise_supported(rows, cols))
    throw Error(w, "rows and cols positive multiples of 128 (fp8_blockwise_supported)");
  if (std::int64_t(x.extent(0)) != rows * cols)
    throw Error(w + ": x of " + std::to_string(x.extent(0)) + " elements",
                std::to_string(rows * cols) + " (rows x cols)");
  if (q == 0 && qt == 0) throw Error(w + " with no output", "q and/or qt");
  const auto out = [&](const char* name, std::size_t n, std::size_t s, std::int64_t want_s) {
    if (n == 0) return;
    if (std::int64_t(n) != rows * cols || std::int64_t(s) != want_s)
      throw Error(w + ": " + name + " of " + std::to_string(n) + " elements with " +
                      std::to_string(s) + " scales",
                  std::to_string(rows * cols) + " elements with " + std::to_string(want_s) +
                      " scales (or 0 elements: not written)");
  };
  out("q", q, q_scales, want_q_scales);
  out("qt", qt, qt_scales, want_qt_scales);
  // The vector loads and stores need 16 / 8-byte alignment (Kokkos views and
  // the scratch pool give 128 bytes or more).
  if (reinterpret_cast<std::uintptr_t>(x.data()) % 16 != 0)
    throw Error(w + ": x not 16-byte aligned", "x from a Kokkos view or the scratch pool");
}

void launch(const char* label, Kokkos::View<const bfloat16_t*> x, std::int64_t rows,
            std::int64_t cols, void* q, float* q_scales, void* qt, float* qt_scales,
            float* partials, bool tile_scale, Fp8Input input, const bfloat16_t* pre) {
  const std::int64_t tiles_c = cols / kB;
  CastBlockTiles f{reinterpret_cast<const Bf16x8*>(x.data()),
                   static_cast<std::uint64_t*>(q),
                   static_cast<std::uint64_t*>(qt),
                   q_scales,
                   qt_scales,
                   partials,
                   rows,
                   cols,
                   tiles_c,
                   fp8_block_scale_ld(cols),
                   fp8_block_scale_ld(rows),
                   tile_scale,
                   input,
                   reinterpret_cast<const Bf16x8*>(pre)};
  Kokkos::parallel_for(label,
                       detail::fp8_teams(rows / kB * tiles_c)
                           .set_scratch_size(0, Kokkos::PerTeam(CastBlockTiles::scratch_bytes())),
                       f);
}

}  // namespace

bool fp8_blockwise_supported(std::int64_t rows, std::int64_t cols) noexcept {
  return rows > 0 && cols > 0 && rows % kB == 0 && cols % kB == 0;
}

std::int64_t fp8_block_scale_ld(std::int64_t k) noexcept { return round_up4((k + kB - 1) / kB); }

std::int64_t fp8_scales_1x128(std::int64_t outer, std::int64_t k) noexcept {
  return outer * ((k + kB - 1) / kB);
}

std::int64_t fp8_scales_128x128(std::int64_t outer, std::int64_t k) noexcept {
  return (outer + kB - 1) / kB * fp8_block_scale_ld(k);
}

void fp8_cast_1x128(Kokkos::View<const bfloat16_t*> x, std::int64_t rows, std::int64_t cols,
                    Kokkos::View<float8_e4m3_t*> q, Kokkos::View<float*> q_scales,
                    Kokkos::View<float8_e4m3_t*> qt, Kokkos::View<float*> qt_scales,
                    Kokkos::View<float*> dbias, Kokkos::View<float*> partials, Fp8Input in,
                    Kokkos::View<const bfloat16_t*> pre, bool assign_dbias) {
  check("fp8_cast_1x128", x, rows, cols, q.extent(0), q_scales.extent(0),
        fp8_scales_1x128(rows, cols), qt.extent(0), qt_scales.extent(0),
        fp8_scales_1x128(cols, rows));
  const bool sums = dbias.extent(0) != 0;
  if (sums && (std::int64_t(dbias.extent(0)) != cols ||
               std::int64_t(partials.extent(0)) < rows / kB * cols))
    throw Error("fp8_cast_1x128: dbias of " + std::to_string(dbias.extent(0)) +
                    " and partials of " + std::to_string(partials.extent(0)) + " floats",
                "dbias of cols = " + std::to_string(cols) + " and partials of at least rows / 128 "
                "x cols = " + std::to_string(rows / kB * cols) + " floats");
  detail::check_fp8_input("fp8_cast_1x128", in, rows * cols, pre.extent(0), sums);
  if (reinterpret_cast<std::uintptr_t>(pre.data()) % 16 != 0)
    throw Error("fp8_cast_1x128: pre not 16-byte aligned", "pre from a Kokkos view or the scratch pool");
  const auto* pre8 = reinterpret_cast<const Bf16x8*>(pre.data());
  if (qt.extent(0) == 0 && !sums) {
    CastRows1x128 f{reinterpret_cast<const Bf16x8*>(x.data()),
                    reinterpret_cast<std::uint64_t*>(q.data()),
                    q_scales.data(),
                    rows,
                    cols,
                    in,
                    pre8};
    Kokkos::parallel_for(
        "kshard::fp8_cast_1x128_rows",
        detail::fp8_teams((f.vectors() + CastRows1x128::kThreads - 1) / CastRows1x128::kThreads)
            .set_scratch_size(0, Kokkos::PerTeam(CastRows1x128::scratch_bytes())),
        f);
    return;
  }
  launch("kshard::fp8_cast_1x128", x, rows, cols, q.extent(0) ? q.data() : nullptr,
         q_scales.data(), qt.extent(0) ? qt.data() : nullptr, qt_scales.data(),
         sums ? partials.data() : nullptr, false, in, pre.data());
  if (sums) detail::add_column_partials(partials, rows / kB, cols, dbias, assign_dbias);
}

void fp8_cast_128x128(Kokkos::View<const bfloat16_t*> x, std::int64_t rows, std::int64_t cols,
                      Kokkos::View<float8_e4m3_t*> q, Kokkos::View<float*> q_scales,
                      Kokkos::View<float8_e4m3_t*> qt, Kokkos::View<float*> qt_scales) {
  check("fp8_cast_128x128", x, rows, cols, q.extent(0), q_scales.extent(0),
        fp8_scales_128x128(rows, cols), qt.extent(0), qt_scales.extent(0),
        fp8_scales_128x128(cols, rows));
  launch("kshard::fp8_cast_128x128", x, rows, cols, q.extent(0) ? q.data() : nullptr,
         q_scales.data(), qt.extent(0) ? qt.data() : nullptr, qt_scales.data(), nullptr, true,
         Fp8Input::x, nullptr);
}

}  // namespace kshard
