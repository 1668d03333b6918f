#include "kshard/kernels/fp8_tensor.hpp"

#include <cstdint>
#include <string>

#include "kshard/compat/for_each.hpp"
#include "kshard/error.hpp"
#include "kshard/numeric/convert.hpp"
#include "fp8_scaling.hpp"

namespace kshard {
namespace {

using Member = Kokkos::TeamPolicy<>::member_type;
using detail::Bf16x8;
using detail::bf16_lane;
using detail::encode8;
using detail::fp8_teams;

// Non-negative floats order like their bit patterns, so an amax can be
// max-folded with an integer atomic (exact, and native on every backend).
KOKKOS_INLINE_FUNCTION void fold_amax(float* amax, float v) {
  Kokkos::atomic_fetch_max(reinterpret_cast<unsigned int*>(amax),
                           static_cast<unsigned int>(detail::float_bits(v)));
}

constexpr std::int64_t kAmaxChunk = 256 * 16;  // elements per team
// Vectors of eight per team of the vector amax: four per thread, so a tensor
// of 8 M elements spreads over 1024 teams (at sixteen per thread its 256 teams
// left most of the H100 idle: 24 us for 16 MB, 0.7 TB/s).
constexpr std::int64_t kAmax8Chunk = 256 * 4;

// Tiles of the cast: kTile x kTile elements staged in team scratch so the
// transposed copy is written along its own rows.
constexpr int kTile = 64;
constexpr int kTilePad = kTile + 1;  // no shared-memory bank conflicts on the column walk

// 1/s for a cast: from the last amax (current scaling; team 0 also stores s
// as scale_inv for the GEMM) or the scale as set (delayed; exact, s is a
// power of two).
template <class Fp8>
KOKKOS_INLINE_FUNCTION float cast_inverse_scale(const Member& team, float* scale, bool from_amax) {
  if (!from_amax) return 1.0f / scale[0];
  const int k = detail::fp8_scale_exponent<Fp8>(scale[2]);
  if (team.league_rank() == 0)
    Kokkos::single(Kokkos::PerTeam(team), [&]() { scale[0] = detail::fp8_pow2(k); });
  return detail::fp8_pow2(-k);
}

// Column sums of a tile for the fused bias gradient (fp8_cast_dbias), in a
// fixed order whatever the team size: 4 groups of 16 rows summed per column,
// then the 4 group sums, into partials[tile row][column]. value(r, c) reads
// the tile (0 outside the tensor); the first row of each group is
// overwritten with the group's sum (its only reader is the same index).
constexpr int kSumGroups = 4, kSumRows = kTile / kSumGroups;

template <class Tile>
KOKKOS_INLINE_FUNCTION void tile_column_sums(const Member& team, const Tile& t, float* partials,
                                             std::int64_t cols, std::int64_t r0, std::int64_t c0) {
  team.team_barrier();
  Kokkos::parallel_for(Kokkos::TeamThreadRange(team, kSumGroups * kTile), [&](const int i) {
    const int c = i % kTile, r = (i / kTile) * kSumRows;
    float sum = 0.0f;
    for (int k = 0; k < kSumRows; ++k) sum += t(r + k, c);
    t(r, c) = sum;
  });
  team.team_barrier();
  Kokkos::parallel_for(Kokkos::TeamThreadRange(team, kTile), [&](const int c) {
    if (c0 + c >= cols) return;
    float sum = 0.0f;
    for (int g = 0; g < kSumGroups; ++g) sum += t(g * kSumRows, c);
    partials[(r0 / kTile) * cols + c0 + c] = sum;
  });
}

template <class Fp8>
struct CastTiles {
  Kokkos::View<const bfloat16_t*> x;
  Kokkos::View<Fp8*> q, qt;
  float* scale;  // [0] scale_inv, [1] amax
  float* partials;  // column sums per tile row (fp8_cast_dbias), or null
  std::int64_t rows, cols, tiles_c;
  bool from_amax, write_q, write_qt;
  Fp8Input input;
  const bfloat16_t* pre;  // GELU's input (Fp8Input::gelu_grad)

  using Scratch = Kokkos::View<float**, Kokkos::DefaultExecutionSpace::scratch_memory_space,
                               Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
  static std::size_t scratch_bytes() { return Scratch::shmem_size(kTile, kTilePad); }

  KOKKOS_INLINE_FUNCTION void operator()(const Member& team) const {
    const std::int64_t r0 = std::int64_t(team.league_rank() / tiles_c) * kTile;
    const std::int64_t c0 = std::int64_t(team.league_rank() % tiles_c) * kTile;
    Scratch tile(team.team_scratch(0), kTile, kTilePad);
    const float inv = cast_inverse_scale<Fp8>(team, scale, from_amax);
    float local = 0.0f;
    Kokkos::parallel_reduce(
        Kokkos::TeamThreadRange(team, kTile * kTile),
        [&](const int i, float& m) {
          const int r = i / kTile, c = i % kTile;
          const std::int64_t gr = r0 + r, gc = c0 + c;
          float v = 0.0f;
          if (gr < rows && gc < cols) {
            v = to_float(x(gr * cols + gc));
            if (input != Fp8Input::x)
              v = detail::cast_input(input, v, pre ? to_float(pre[gr * cols + gc]) : 0.0f);
            if (write_q) q(gr * cols + gc) = detail::fp8_encode_scaled<Fp8>(v, inv);
          }
          tile(r, c) = v;
          const float a = detail::fp8_amax_term(v);
          if (a > m) m = a;
        },
        Kokkos::Max<float>(local));
    team.team_barrier();
    if (write_qt) {
      Kokkos::parallel_for(Kokkos::TeamThreadRange(team, kTile * kTile), [&](const int i) {
        const int c = i / kTile, r = i % kTile;  // qt row c0 + c, column r0 + r
        const std::int64_t gr = r0 + r, gc = c0 + c;
        if (gr < rows && gc < cols)
          qt(gc * rows + gr) = detail::fp8_encode_scaled<Fp8>(tile(r, c), inv);
      });
    }
    if (partials) tile_column_sums(team, tile, partials, cols, r0, c0);
    if (!from_amax && local > 0.0f)
      Kokkos::single(Kokkos::PerTeam(team), [&]() { fold_amax(scale + 1, local); });
  }
};

// The row-major cast alone (no transposed copy) as a flat stream: each team
// takes kStreamChunk vectors of eight elements.
constexpr std::int64_t kStreamChunk = 256 * 4;

// The input step as a template argument: the vector kernels keep no
// registers for steps they do not run.
template <Fp8Input kIn>
KOKKOS_INLINE_FUNCTION Bf16x8 load_input(const Bf16x8* x, const Bf16x8* pre, std::int64_t j) {
  return detail::cast_input<kIn>(x[j], kIn == Fp8Input::gelu_grad ? pre + j : nullptr);
}

template <class Fp8, Fp8Input kIn>
struct CastStream8 {
  const Bf16x8* x;      // n / 8 vectors
  const Bf16x8* pre;    // GELU's input (Fp8Input::gelu_grad)
  std::uint64_t* q;     // n / 8 groups of eight fp8
  float* scale;
  std::int64_t vectors;
  bool from_amax;

  KOKKOS_INLINE_FUNCTION void operator()(const Member& team) const {
    const std::int64_t base = std::int64_t(team.league_rank()) * kStreamChunk;
    const std::int64_t len = base + kStreamChunk < vectors ? kStreamChunk : vectors - base;
    const float inv = cast_inverse_scale<Fp8>(team, scale, from_amax);
    float local = 0.0f;
    Kokkos::parallel_reduce(
        Kokkos::TeamThreadRange(team, len),
        [&](const std::int64_t i, float& m) {
          q[base + i] = encode8<Fp8>(load_input<kIn>(x, pre, base + i), inv, m);
        },
        Kokkos::Max<float>(local));
    if (!from_amax && local > 0.0f)
      Kokkos::single(Kokkos::PerTeam(team), [&]() { fold_amax(scale + 1, local); });
  }
};

// The transposed copy's bytes from an encoded tile: w[e] holds four encoded
// bytes (columns k = 0..3) of tile row e; qt row k gets byte k of each, in row
// order, as one eight-byte store.
KOKKOS_INLINE_FUNCTION std::uint64_t column_bytes(const std::uint32_t (&w)[8], int k) {
  std::uint64_t out = 0;
  for (int e = 0; e < 8; ++e) out |= std::uint64_t((w[e] >> (8 * k)) & 0xFFu) << (8 * e);
  return out;
}

// The cast with its transposed copy (and the row-major one if asked), eight
// elements at a time where rows and cols are multiples of 8 and the buffers
// aligned (every fp8 GEMM operand: multiples of 16). A 64 x 64 tile is read in
// 16-byte rows of eight, encoded once, and its bytes kept row-major in team
// scratch (one eight-byte store per vector); the qt pass reads four columns
// of eight rows (eight four-byte loads) and transposes them in registers into
// four eight-byte stores. (The previous layout stored the bytes one by one
// into a transposed scratch tile, 8 conflicting stores per vector, and kept
// the bias sums' values as floats: shared memory, not HBM, set its speed.)
template <class Fp8, bool kSums, Fp8Input kIn>
struct CastTiles8 {
  const Bf16x8* x;           // [rows, cols / 8]
  const Bf16x8* pre;         // GELU's input, x's shape (Fp8Input::gelu_grad)
  std::uint64_t *q, *qt;     // [rows, cols / 8] and [cols, rows / 8] groups of eight fp8
  float* scale;
  float* partials;           // kSums: column sums per tile row (fp8_cast_dbias)
  std::int64_t rows, cols, tiles_c;
  bool from_amax;

  static constexpr int kVectors = kTile / 8;  // vectors per tile row
  static constexpr int kQuads = kTile / 4;    // four-column groups per tile row
  static constexpr int kQtItems = kQuads * kVectors;  // (quad, eight-row group) pairs
  static constexpr int kSumItems = kSumGroups * kTile / 2;  // (group, column pair) pairs
  // Rows of 72 bytes: 8-byte aligned for the vector stores, and the qt pass's
  // eight-row groups fall on different banks.
  static constexpr int kStride = kTile + 8;
  using Bytes = Kokkos::View<std::uint8_t**, Kokkos::LayoutRight,
                             Kokkos::DefaultExecutionSpace::scratch_memory_space,
                             Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
  // kSums: the tile's bf16 bits (row-major) and the row groups' column sums.
  using Values = Kokkos::View<std::uint16_t**, Kokkos::LayoutRight,
                              Kokkos::DefaultExecutionSpace::scratch_memory_space,
                              Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
  using Sums = Kokkos::View<float**, Kokkos::LayoutRight,
                            Kokkos::DefaultExecutionSpace::scratch_memory_space,
                            Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
  static std::size_t scratch_bytes() {
    return Bytes::shmem_size(kTile, kStride) +
           (kSums ? Values::shmem_size(kTile, kTile) + Sums::shmem_size(kSumGroups, kTile) : 0);
  }

  KOKKOS_INLINE_FUNCTION void operator()(const Member& team) const {
    const std::int64_t r0 = std::int64_t(team.league_rank() / tiles_c) * kTile;
    const std::int64_t c0 = std::int64_t(team.league_rank() % tiles_c) * kTile;
    Bytes bytes(team.team_scratch(0), kTile, kStride);
    Values values;
    Sums sums;
    if constexpr (kSums) {
      values = Values(team.team_scratch(0), kTile, kTile);
      sums = Sums(team.team_scratch(0), kSumGroups, kTile);
    }
    const float inv = cast_inverse_scale<Fp8>(team, scale, from_amax);
    float local = 0.0f;
    compat::team_reduce(
        team, kTile * kVectors,
        [&](const int v, float& m) {
          const int r = v / kVectors, c = (v % kVectors) * 8;
          const std::int64_t gr = r0 + r, gc = c0 + c;
          auto* vals = kSums ? reinterpret_cast<std::uint64_t*>(&values(r, c)) : nullptr;
          if (gr >= rows || gc >= cols) {  // a vector is inside or outside whole
            if constexpr (kSums) vals[0] = vals[1] = 0;  // +0.0 in the sums
            return;
          }
          const Bf16x8 in = load_input<kIn>(x, pre, (gr * cols + gc) / 8);
          const std::uint64_t packed = encode8<Fp8>(in, inv, m);
          *reinterpret_cast<std::uint64_t*>(&bytes(r, c)) = packed;
          if constexpr (kSums) {
            vals[0] = in.lo;
            vals[1] = in.hi;
          }
          if (q) q[(gr * cols + gc) / 8] = packed;
        },
        Kokkos::Max<float>(local));
    // qt and the column sums read different scratch: one pass, the first
    // kQtItems indices transpose, the rest sum.
    Kokkos::parallel_for(
        Kokkos::TeamThreadRange(team, kQtItems + (kSums ? kSumItems : 0)), [&](const int i) {
          if (i < kQtItems) {
            // Consecutive indices take consecutive eight-row groups: each
            // qt row's bytes of this tile are written by neighbouring lanes.
            const int g = i % kVectors, k4 = (i / kVectors) * 4;
            const std::int64_t gr = r0 + 8 * g, gc = c0 + k4;
            if (gr >= rows || gc >= cols) return;  // cols % 8 == 0: a quad is whole
            std::uint32_t w[8];
            for (int e = 0; e < 8; ++e)
              w[e] = *reinterpret_cast<const std::uint32_t*>(&bytes(8 * g + e, k4));
            for (int k = 0; k < 4; ++k) qt[((gc + k) * rows + gr) / 8] = column_bytes(w, k);
          } else if constexpr (kSums) {
            // kSumRows rows of a column pair (one four-byte load a row) in
            // row order: the same sums, in the same order, as tile_column_sums.
            const int j = i - kQtItems, p = j % (kTile / 2), g = j / (kTile / 2);
            float s0 = 0.0f, s1 = 0.0f;
            for (int k = 0; k < kSumRows; ++k) {
              const std::uint32_t w = *reinterpret_cast<const std::uint32_t*>(
                  &values(g * kSumRows + k, 2 * p));
              s0 += detail::bf16_bits_float(std::uint16_t(w));
              s1 += detail::bf16_bits_float(std::uint16_t(w >> 16));
            }
            sums(g, 2 * p) = s0;
            sums(g, 2 * p + 1) = s1;
          }
        });
    if constexpr (kSums) {
      team.team_barrier();
      Kokkos::parallel_for(Kokkos::TeamThreadRange(team, kTile), [&](const int c) {
        if (c0 + c >= cols) return;
        float sum = 0.0f;
        for (int g = 0; g < kSumGroups; ++g) sum += sums(g, c);
        partials[(r0 / kTile) * cols + c0 + c] = sum;
      });
    }
    if (!from_amax && local > 0.0f)
      Kokkos::single(Kokkos::PerTeam(team), [&]() { fold_amax(scale + 1, local); });
  }
};

// Floats per tensor in Fp8AmaxHistory's buffer: 16 bytes, so every scale
// pointer a GEMM reads is 16-byte aligned.
constexpr std::size_t kFp8HistorySlot = 4;
static_assert(kFp8HistorySlot >= kFp8ScaleFloats, "a slot holds an Fp8Scale");

bool aligned(const void* p, std::size_t a) { return reinterpret_cast<std::uintptr_t>(p) % a == 0; }

template <class Fp8>
void cast_impl(Kokkos::View<const bfloat16_t*> x, std::int64_t rows, std::int64_t cols,
               Fp8Scale& scale, Fp8ScaleFrom from, Kokkos::View<Fp8*> q, Kokkos::View<Fp8*> qt,
               Fp8Input in, Kokkos::View<const bfloat16_t*> pre,
               Kokkos::View<float*> dbias = {}, Kokkos::View<float*> partials = {},
               bool assign_dbias = false) {
  const std::string who = std::string(dbias.extent(0) ? "fp8_cast_dbias (" : "fp8_cast (") +
                          detail::Fp8Traits<Fp8>::name + ")";
  if (rows < 0 || cols < 0 || std::int64_t(x.extent(0)) != rows * cols)
    throw Error(who + ": x of " + std::to_string(x.extent(0)) + " elements for [" +
                    std::to_string(rows) + ", " + std::to_string(cols) + "]",
                "x with rows x cols elements");
  const bool write_q = q.extent(0) != 0, write_qt = qt.extent(0) != 0;
  if (!write_q && !write_qt)
    throw Error(who + " with no output", "q [rows, cols] and/or qt [cols, rows]");
  for (auto [name, n] : {std::pair<const char*, std::size_t>{"q", q.extent(0)}, {"qt", qt.extent(0)}})
    if (n != 0 && std::int64_t(n) != rows * cols)
      throw Error(who + ": " + name + " of " + std::to_string(n) + " elements",
                  std::to_string(rows * cols) + " (rows x cols) or 0 (not written)");
  const bool sums = dbias.extent(0) != 0;
  detail::check_fp8_input(who, in, rows * cols, pre.extent(0), sums);
  if (sums && (std::int64_t(dbias.extent(0)) != cols ||
               std::int64_t(partials.extent(0)) < fp8_column_sum_partials(rows, cols)))
    throw Error(who + ": dbias of " + std::to_string(dbias.extent(0)) + " and partials of " +
                    std::to_string(partials.extent(0)) + " floats",
                "dbias of cols = " + std::to_string(cols) + " and partials of at least " +
                    std::to_string(fp8_column_sum_partials(rows, cols)) +
                    " floats (fp8_column_sum_partials)");
  if (rows * cols == 0) return;
  const std::int64_t tiles_r = (rows + kTile - 1) / kTile, tiles_c = (cols + kTile - 1) / kTile;
  const bool from_amax = from == Fp8ScaleFrom::amax;
  float* sv = scale.values().data();
  float* pv = sums ? partials.data() : nullptr;
  const auto* x8 = reinterpret_cast<const Bf16x8*>(x.data());
  const auto* pre8 = reinterpret_cast<const Bf16x8*>(pre.data());
  const bool pre_aligned = in != Fp8Input::gelu_grad || aligned(pre.data(), 16);
  // The bias gradient needs the tiles' column sums, which the flat stream has not.
  if (!sums && !write_qt && (rows * cols) % 8 == 0 && aligned(x.data(), 16) &&
      aligned(q.data(), 8) && pre_aligned) {
    const std::int64_t vectors = rows * cols / 8;
    auto* q8 = reinterpret_cast<std::uint64_t*>(q.data());
    const std::string name = std::string("kshard::fp8_cast_stream8_") + detail::Fp8Traits<Fp8>::name +
                             detail::fp8_input_suffix(in);
    const auto teams = fp8_teams((vectors + kStreamChunk - 1) / kStreamChunk);
    detail::with_fp8_input(in, [&](auto k) {
      Kokkos::parallel_for(name, teams, CastStream8<Fp8, k.value>{x8, pre8, q8, sv, vectors, from_amax});
    });
    return;
  }
  if (write_qt && rows % 8 == 0 && cols % 8 == 0 && aligned(x.data(), 16) &&
      aligned(q.data(), 8) && aligned(qt.data(), 8) && pre_aligned) {
    auto* q8 = write_q ? reinterpret_cast<std::uint64_t*>(q.data()) : nullptr;
    auto* qt8 = reinterpret_cast<std::uint64_t*>(qt.data());
    const std::string name = std::string("kshard::fp8_cast_tiles8_") + detail::Fp8Traits<Fp8>::name;
    auto launch = [&](auto f) {
      Kokkos::parallel_for(
          name + (sums ? "_dbias" : "") + detail::fp8_input_suffix(in),
          fp8_teams(tiles_r * tiles_c).set_scratch_size(0, Kokkos::PerTeam(decltype(f)::scratch_bytes())),
          f);
    };
    // (check_fp8_input: the bias sums come with a gradient's steps only.)
    if (sums) {
      if (in == Fp8Input::gelu_grad)
        launch(CastTiles8<Fp8, true, Fp8Input::gelu_grad>{x8, pre8, q8, qt8, sv, pv, rows, cols, tiles_c, from_amax});
      else
        launch(CastTiles8<Fp8, true, Fp8Input::x>{x8, pre8, q8, qt8, sv, pv, rows, cols, tiles_c, from_amax});
    } else {
      detail::with_fp8_input(in, [&](auto k) {
        launch(CastTiles8<Fp8, false, k.value>{x8, pre8, q8, qt8, sv, nullptr, rows, cols, tiles_c, from_amax});
      });
    }
  } else {
    CastTiles<Fp8> f{x,     q,        qt,       sv, pv, rows, cols, tiles_c, from_amax, write_q,
                     write_qt, in, pre.data()};
    Kokkos::parallel_for(
        std::string("kshard::fp8_cast_") + detail::Fp8Traits<Fp8>::name,
        fp8_teams(tiles_r * tiles_c).set_scratch_size(0, Kokkos::PerTeam(CastTiles<Fp8>::scratch_bytes())),
        f);
  }
  if (sums) detail::add_column_partials(partials, tiles_r, cols, dbias, assign_dbias);
}

}  // namespace

Fp8Scale::Fp8Scale(const char* label, Fp8Format format)
    : v_(std::string(label), kFp8ScaleFloats), format_(format) {
  Kokkos::deep_copy(Kokkos::subview(v_, 0), 1.0f);
}

void Fp8Scale::bind(Kokkos::View<float*> slot) {
  if (slot.extent(0) != kFp8ScaleFloats)
    throw Error("Fp8Scale::bind to " + std::to_string(slot.extent(0)) + " floats",
                std::to_string(kFp8ScaleFloats) + " floats");
  Kokkos::deep_copy(slot, v_);
  v_ = slot;
}

Fp8AmaxHistory::Fp8AmaxHistory(const std::vector<Fp8Scale*>& scales, int length, Fp8AmaxAlgo algo)
    : scales_(scales), length_(length), algo_(algo) {
  if (length < 1)
    throw Error("amax history of length " + std::to_string(length), "a length >= 1");
  const std::size_t n = scales.size();
  // Slots of 4 floats (kFp8ScaleFloats used, one padding): cuBLASLt refuses
  // scale pointers that are not 16-byte aligned (CUBLAS_STATUS_NOT_SUPPORTED
  // from cublasLtMatmul on the H200 with 12-byte slots).
  constexpr std::size_t w = kFp8HistorySlot;
  values_ = Kokkos::View<float*>("kshard::Fp8AmaxHistory::values", w * n);
  history_ = Kokkos::View<float*>("kshard::Fp8AmaxHistory::history", n * std::size_t(length));
  is_e5m2_ = Kokkos::View<std::uint8_t*>("kshard::Fp8AmaxHistory::is_e5m2", n);
  auto h = Kokkos::create_mirror_view(is_e5m2_);
  for (std::size_t t = 0; t < n; ++t) {
    formats_.push_back(scales[t]->format());
    h(t) = scales[t]->format() == Fp8Format::e5m2 ? 1 : 0;
    scales[t]->bind(Kokkos::subview(values_, std::make_pair(w * t, w * t + kFp8ScaleFloats)));
  }
  Kokkos::deep_copy(is_e5m2_, h);
}

void Fp8AmaxHistory::update() {
  const std::int64_t n = std::int64_t(size()), len = length_, pos = pos_;
  const bool use_max = algo_ == Fp8AmaxAlgo::max;
  auto values = values_;
  auto history = history_;
  auto e5 = is_e5m2_;
  if (n > 0)
    Kokkos::parallel_for(
        "kshard::fp8_amax_history_update", Kokkos::RangePolicy<>(0, n),
        KOKKOS_LAMBDA(const std::int64_t t) {
          float* h = history.data() + t * len;
          constexpr std::int64_t w = kFp8HistorySlot;
          const float a = values(w * t + 1);
          h[pos] = a;
          values(w * t + 1) = 0.0f;
          float ref = a;
          if (use_max)
            for (std::int64_t i = 0; i < len; ++i) ref = h[i] > ref ? h[i] : ref;
          const int k = e5(t) ? detail::fp8_scale_exponent<float8_e5m2_t>(ref)
                              : detail::fp8_scale_exponent<float8_e4m3_t>(ref);
          values(w * t) = detail::fp8_pow2(k);
        });
  pos_ = (pos_ + 1) % length_;
  updated_ = true;
  for (Fp8Scale* s : scales_) s->set_calibrated(true);
}

std::vector<float> Fp8AmaxHistory::state() const {
  auto v = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), values_);
  auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), history_);
  std::vector<float> s(v.data(), v.data() + v.extent(0));
  s.insert(s.end(), h.data(), h.data() + h.extent(0));
  s.push_back(float(pos_));
  s.push_back(updated_ ? 1.0f : 0.0f);
  return s;
}

void Fp8AmaxHistory::set_state(const std::vector<float>& s) {
  const std::size_t want = values_.extent(0) + history_.extent(0) + 2;
  if (s.size() != want)
    throw Error("fp8 amax history state of " + std::to_string(s.size()) + " values",
                std::to_string(want) + " (" + std::to_string(size()) + " tensors, history length " +
                    std::to_string(length_) + ")");
  const float pos = s[s.size() - 2], updated = s.back();
  if (updated != 0.0f && updated != 1.0f)
    throw Error("fp8 amax history 'updated' flag " + std::to_string(updated), "0 or 1");
  if (!(pos >= 0.0f && pos < float(length_)) || pos != float(int(pos)))
    throw Error("fp8 amax history position " + std::to_string(pos),
                "an integer in [0, " + std::to_string(length_) + ")");
  auto v = Kokkos::create_mirror_view(values_);
  auto h = Kokkos::create_mirror_view(history_);
  for (std::size_t i = 0; i < v.extent(0); ++i) v(i) = s[i];
  for (std::size_t i = 0; i < h.extent(0); ++i) h(i) = s[v.extent(0) + i];
  Kokkos::deep_copy(values_, v);
  Kokkos::deep_copy(history_, h);
  pos_ = int(pos);
  updated_ = updated == 1.0f;
  for (Fp8Scale* sc : scales_) sc->set_calibrated(updated_);
}

float Fp8Scale::scale_inv_host() const {
  auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), v_);
  return h(0);
}
float Fp8Scale::amax_host() const {
  auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), v_);
  return h(1);
}

void fp8_amax(Kokkos::View<const bfloat16_t*> x, Fp8Scale& scale, Fp8Input in,
              Kokkos::View<const bfloat16_t*> pre) {
  detail::check_fp8_input("fp8_amax", in, std::int64_t(x.extent(0)), pre.extent(0), false);
  float* s = scale.values().data();
  const bfloat16_t* pv = pre.data();
  const std::int64_t n = std::int64_t(x.extent(0));
  Kokkos::parallel_for(
      "kshard::fp8_amax_reset", Kokkos::RangePolicy<>(0, 1), KOKKOS_LAMBDA(int) { s[2] = 0.0f; });
  if (n == 0) return;
  if (n % 8 == 0 && aligned(x.data(), 16) && (in != Fp8Input::gelu_grad || aligned(pv, 16))) {
    // Eight elements per 16-byte load (every fp8 GEMM operand).
    const auto* x8 = reinterpret_cast<const Bf16x8*>(x.data());
    const auto* p8 = reinterpret_cast<const Bf16x8*>(pv);
    const std::int64_t n8 = n / 8, league8 = (n8 + kAmax8Chunk - 1) / kAmax8Chunk;
    Kokkos::parallel_for(
        "kshard::fp8_amax8", fp8_teams(league8), KOKKOS_LAMBDA(const Member& team) {
          const std::int64_t base = std::int64_t(team.league_rank()) * kAmax8Chunk;
          const std::int64_t len = base + kAmax8Chunk < n8 ? kAmax8Chunk : n8 - base;
          float local = 0.0f;
          Kokkos::parallel_reduce(
              Kokkos::TeamThreadRange(team, len),
              [&](const std::int64_t i, float& m) {
                const std::int64_t j = base + i;
                const Bf16x8 v = detail::cast_input(in, x8[j], in == Fp8Input::gelu_grad ? p8 + j : nullptr);
                for (int e = 0; e < 8; ++e) {
                  const float a = detail::fp8_amax_term(bf16_lane(v, e));
                  if (a > m) m = a;
                }
              },
              Kokkos::Max<float>(local));
          if (local > 0.0f)
            Kokkos::single(Kokkos::PerTeam(team), [&]() {
              fold_amax(s + 2, local);
              fold_amax(s + 1, local);
            });
        });
    return;
  }
  const std::int64_t league = (n + kAmaxChunk - 1) / kAmaxChunk;
  Kokkos::parallel_for(
      "kshard::fp8_amax", fp8_teams(league), KOKKOS_LAMBDA(const Member& team) {
        const std::int64_t base = std::int64_t(team.league_rank()) * kAmaxChunk;
        const std::int64_t len = base + kAmaxChunk < n ? kAmaxChunk : n - base;
        float local = 0.0f;
        Kokkos::parallel_reduce(
            Kokkos::TeamThreadRange(team, len),
            [&](const std::int64_t i, float& m) {
              const float v = detail::cast_input(in, to_float(x(base + i)),
                                                 pv ? to_float(pv[base + i]) : 0.0f);
              const float a = detail::fp8_amax_term(v);
              if (a > m) m = a;
            },
            Kokkos::Max<float>(local));
        if (local > 0.0f)
          Kokkos::single(Kokkos::PerTeam(team), [&]() {
            fold_amax(s + 2, local);
            fold_amax(s + 1, local);
          });
      });
}

void fp8_cast(Kokkos::View<const bfloat16_t*> x, std::int64_t rows, std::int64_t cols,
              Fp8Scale& scale, Fp8ScaleFrom from, Kokkos::View<float8_e4m3_t*> q,
              Kokkos::View<float8_e4m3_t*> qt, Fp8Input in, Kokkos::View<const bfloat16_t*> pre) {
  cast_impl<float8_e4m3_t>(x, rows, cols, scale, from, q, qt, in, pre);
}
void fp8_cast(Kokkos::View<const bfloat16_t*> x, std::int64_t rows, std::int64_t cols,
              Fp8Scale& scale, Fp8ScaleFrom from, Kokkos::View<float8_e5m2_t*> q,
              Kokkos::View<float8_e5m2_t*> qt, Fp8Input in, Kokkos::View<const bfloat16_t*> pre) {
  cast_impl<float8_e5m2_t>(x, rows, cols, scale, from, q, qt, in, pre);
}

std::int64_t fp8_column_sum_partials(std::int64_t rows, std::int64_t cols) {
  return (rows + kTile - 1) / kTile * cols;
}

void fp8_cast_dbias(Kokkos::View<const bfloat16_t*> dy, std::int64_t rows, std::int64_t cols,
                    Fp8Scale& scale, Fp8ScaleFrom from, Kokkos::View<float8_e5m2_t*> q,
                    Kokkos::View<float8_e5m2_t*> qt, Kokkos::View<float*> dbias,
                    Kokkos::View<float*> partials, Fp8Input in,
                    Kokkos::View<const bfloat16_t*> pre, bool assign_dbias) {
  if (dbias.extent(0) == 0)
    throw Error("fp8_cast_dbias with an empty dbias", "dbias of cols = " + std::to_string(cols) + " floats");
  cast_impl<float8_e5m2_t>(dy, rows, cols, scale, from, q, qt, in, pre, dbias, partials,
                           assign_dbias);
}

}  // namespace kshard
