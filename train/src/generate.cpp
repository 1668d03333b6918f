#include "kshard/train/generate.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <optional>
#include <string>

#include "kshard/error.hpp"
#include "kshard/mesh/agree.hpp"

namespace kshard {
namespace {

void check_options(const std::vector<std::int32_t>& prompt, const GenerateOptions& o) {
  if (prompt.empty()) throw Error("generate with an empty prompt", "at least one token id");
  if (o.new_tokens < 0)
    throw Error("generate " + std::to_string(o.new_tokens) + " new tokens", "new_tokens >= 0");
  if (!std::isfinite(o.temperature) || o.temperature < 0)
    throw Error("temperature " + std::to_string(o.temperature),
                "a finite temperature >= 0 (0: greedy)");
  if (o.top_k < 0) throw Error("top_k " + std::to_string(o.top_k), "top_k >= 0 (0: every token)");
  if (o.context < 0)
    throw Error("context " + std::to_string(o.context), "context >= 0 (0: the whole sequence)");
}

// A uniform double in [0, 1) from the top 53 bits: the same on every
// platform (std::uniform_real_distribution's algorithm is the library's).
double uniform01(std::mt19937_64& rng) { return double(rng() >> 11) * 0x1.0p-53; }

}  // namespace

std::int32_t pick_token(const std::vector<float>& z, const GenerateOptions& o,
                        std::mt19937_64& rng) {
  // Indices of the finite logits, largest first (ties: the lower index).
  std::vector<std::int32_t> order;
  for (std::size_t i = 0; i < z.size(); ++i)
    if (std::isfinite(z[i])) order.push_back(std::int32_t(i));
  if (order.empty())
    throw Error("next-token logits with no finite value (" + std::to_string(z.size()) + " of them)",
                "finite logits (a model whose forward gives numbers)");
  const auto larger = [&](std::int32_t a, std::int32_t b) {
    return z[std::size_t(a)] > z[std::size_t(b)] || (z[std::size_t(a)] == z[std::size_t(b)] && a < b);
  };
  if (o.temperature == 0) return *std::min_element(order.begin(), order.end(), larger);
  const std::size_t k =
      o.top_k > 0 ? std::min(order.size(), std::size_t(o.top_k)) : order.size();
  std::partial_sort(order.begin(), order.begin() + std::ptrdiff_t(k), order.end(), larger);
  // Softmax of the k largest at z / temperature, shifted by the largest.
  const double top = z[std::size_t(order[0])];
  std::vector<double> p(k);
  for (std::size_t i = 0; i < k; ++i)
    p[i] = std::exp((double(z[std::size_t(order[i])]) - top) / o.temperature);
  const double total = std::accumulate(p.begin(), p.end(), 0.0);
  double u = uniform01(rng) * total;
  for (std::size_t i = 0; i < k; ++i) {
    if (u < p[i]) return order[i];
    u -= p[i];
  }
  return order[k - 1];  // u landed on the rounding of the last sum
}

std::vector<std::vector<std::int32_t>> generate_batch(
    FsdpModel& model, const Communicator& world,
    const std::vector<std::vector<std::int32_t>>& prompts, const GenerateOptions& o,
    const std::function<void(std::size_t, std::int32_t)>& on_token) {
  // Checked alike on every rank before anything collective runs.
  if (prompts.empty()) throw Error("generate_batch with no prompts", "at least one prompt");
  for (const auto& p : prompts) {
    check_options(p, o);
    if (p.size() != prompts[0].size())
      throw Error("generate_batch with prompts of " + std::to_string(prompts[0].size()) + " and " +
                      std::to_string(p.size()) + " tokens",
                  "prompts of equal length (one row each of the batch)");
  }
  const std::int64_t batch = std::int64_t(prompts.size());
  std::vector<std::vector<std::int32_t>> seqs = prompts, out(prompts.size());
  std::vector<std::mt19937_64> rngs;
  for (std::int64_t b = 0; b < batch; ++b) rngs.emplace_back(o.seed + std::uint64_t(b));
  // Tokens per sequence a step's forward sees: the last `context` ones.
  const auto window = [&](std::size_t len) {
    return o.context > 0 ? std::min<std::int64_t>(o.context, std::int64_t(len)) : std::int64_t(len);
  };
  const std::int64_t longest = window(prompts[0].size() + std::size_t(o.new_tokens));
  const bool cached = o.kv_cache && model.can_decode();
  std::optional<KvCache> cache;
  if (cached && o.new_tokens > 0) cache.emplace(batch, longest);
  std::int64_t cache_start = 0;  // the sequence index of the cache's first token
  // The ids of one step in ONE device buffer, sized for the longest window
  // once: no allocation per generated token.
  const Kokkos::View<std::int32_t*> ids_buf(
      Kokkos::view_alloc("kshard.generate.ids", Kokkos::WithoutInitializing),
      std::size_t(batch * longest));
  const auto ids_h = Kokkos::create_mirror_view(ids_buf);
  std::vector<float> logits;  // [batch, vocab] of this step
  std::int64_t vocab = 0;
  const auto read_rows = [&](Kokkos::View<const float*> src, std::int64_t first_row,
                             std::int64_t rows, std::int64_t width, std::int64_t b) {
    // rows [first_row, first_row + rows) of src (width each) to sequence b's logits.
    vocab = width;
    logits.resize(std::size_t(batch * vocab));
    Kokkos::View<float*, Kokkos::HostSpace, Kokkos::MemoryUnmanaged> h(
        logits.data() + b * vocab, std::size_t(rows * vocab));
    Kokkos::deep_copy(h, Kokkos::subview(src, std::make_pair(first_row * width,
                                                             (first_row + rows) * width)));
  };
  for (int step = 0; step < o.new_tokens; ++step) {
    const std::int64_t len = std::int64_t(seqs[0].size());
    const std::int64_t start = len - window(std::size_t(len));  // the window's first token
    // The tokens this step runs: with the cache, those after the cached ones
    // (the prompt, then one), or the whole window again once it has moved.
    std::int64_t first = start;
    if (cached) {
      if (step == 0 || start != cache_start) {
        cache->clear();
        cache_start = start;
      }
      first = cache_start + cache->length();
    }
    const std::int64_t n = len - first;
    for (std::int64_t b = 0; b < batch; ++b)
      std::copy(seqs[std::size_t(b)].begin() + first, seqs[std::size_t(b)].end(),
                ids_h.data() + b * n);
    const auto ids = Kokkos::subview(ids_buf, std::make_pair(std::int64_t(0), batch * n));
    Kokkos::deep_copy(ids, Kokkos::subview(ids_h, std::make_pair(std::int64_t(0), batch * n)));
    if (cached) {
      const Kokkos::View<const float*> z = model.decode(*cache, ids, ActShape{batch, n, 1});
      read_rows(z, 0, batch, std::int64_t(z.extent(0)) / batch, 0);
    } else {
      // Only the chunks that hold a sequence's last row are read, and only those rows.
      model.forward_chunks(ids, ActShape{batch, n, 1},
                           [&](std::int64_t r0, std::int64_t rows, Kokkos::View<const float*> c) {
                             const std::int64_t width = std::int64_t(c.extent(0)) / rows;
                             for (std::int64_t b = 0; b < batch; ++b) {
                               const std::int64_t r = b * n + n - 1;
                               if (r >= r0 && r < r0 + rows) read_rows(c, r - r0, 1, width, b);
                             }
                           });
    }
    // Every rank draws (the generators stay in step); rank 0's tokens are
    // taken everywhere, so ranks cannot drift apart on a rounding.
    std::vector<std::int64_t> chosen(std::size_t(batch), -1);
    for (std::int64_t b = 0; b < batch; ++b) {
      const std::vector<float> row(logits.begin() + b * vocab, logits.begin() + (b + 1) * vocab);
      const std::int32_t mine = pick_token(row, o, rngs[std::size_t(b)]);
      if (world.rank() == 0) chosen[std::size_t(b)] = mine;
    }
    host_all_reduce(world, chosen, ReduceOp::max);
    for (std::int64_t b = 0; b < batch; ++b) {
      const auto token = std::int32_t(chosen[std::size_t(b)]);
      seqs[std::size_t(b)].push_back(token);
      out[std::size_t(b)].push_back(token);
      if (on_token) on_token(std::size_t(b), token);
    }
  }
  return out;
}

std::vector<std::int32_t> generate(FsdpModel& model, const Communicator& world,
                                   const std::vector<std::int32_t>& prompt,
                                   const GenerateOptions& o,
                                   const std::function<void(std::int32_t)>& on_token) {
  // A batch of one: sequence 0 draws with a generator seeded by `seed`.
  std::function<void(std::size_t, std::int32_t)> each;
  if (on_token) each = [&](std::size_t, std::int32_t t) { on_token(t); };
  return generate_batch(model, world, {prompt}, o, each).front();
}

}  // namespace kshard
