#include "kshard/train/generate.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>
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

std::vector<std::int32_t> generate(FsdpModel& model, const Communicator& world,
                                   const std::vector<std::int32_t>& prompt,
                                   const GenerateOptions& o,
                                   const std::function<void(std::int32_t)>& on_token) {
  check_options(prompt, o);
  std::vector<std::int32_t> seq = prompt, out;
  std::mt19937_64 rng(o.seed);
  std::vector<float> last;
  // The window (the last `context` tokens) in ONE device buffer, sized for the
  // longest window once: no allocation per generated token.
  const auto window = [&](std::size_t len) {
    return o.context > 0 ? std::min<std::int64_t>(o.context, std::int64_t(len)) : std::int64_t(len);
  };
  const Kokkos::View<std::int32_t*> ids_buf(
      Kokkos::view_alloc("kshard.generate.ids", Kokkos::WithoutInitializing),
      std::size_t(window(prompt.size() + std::size_t(o.new_tokens))));
  const auto ids_h = Kokkos::create_mirror_view(ids_buf);
  for (int step = 0; step < o.new_tokens; ++step) {
    const std::int64_t n = window(seq.size());
    const auto ids = Kokkos::subview(ids_buf, std::make_pair(std::int64_t(0), n));
    const auto ids_hn = Kokkos::subview(ids_h, std::make_pair(std::int64_t(0), n));
    std::copy(seq.end() - n, seq.end(), ids_hn.data());
    Kokkos::deep_copy(ids, ids_hn);
    // Only the chunk that holds the last row is read, and only that row.
    model.forward_chunks(ids, ActShape{1, n, 1},
                         [&](std::int64_t first, std::int64_t rows, Kokkos::View<const float*> c) {
                           if (first + rows != n) return;
                           const std::int64_t vocab = std::int64_t(c.extent(0)) / rows;
                           last.resize(std::size_t(vocab));
                           Kokkos::View<float*, Kokkos::HostSpace, Kokkos::MemoryUnmanaged> h(
                               last.data(), last.size());
                           Kokkos::deep_copy(
                               h, Kokkos::subview(c, std::make_pair((rows - 1) * vocab, rows * vocab)));
                         });
    // Every rank draws (the generators stay in step); rank 0's token is
    // taken everywhere, so ranks cannot drift apart on a rounding.
    const std::int32_t mine = pick_token(last, o, rng);
    std::vector<std::int64_t> chosen{world.rank() == 0 ? std::int64_t(mine) : std::int64_t(-1)};
    host_all_reduce(world, chosen, ReduceOp::max);
    const auto token = std::int32_t(chosen[0]);
    seq.push_back(token);
    out.push_back(token);
    if (on_token) on_token(token);
  }
  return out;
}

}  // namespace kshard
