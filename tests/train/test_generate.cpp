// kshard::generate and pick_token.
//
// pick_token against closed forms: greedy is the first index of the largest
// finite logit; top-k 1 is greedy at any temperature; sampling draws token i
// with probability softmax(z / T)_i over the k largest (frequencies over 40000
// seeded draws within 0.012 of it: over 5 binomial standard deviations, so a
// wrong distribution fails and a right one, on a fixed seed, never does).
// generate against an independent loop: the same model's forward() (kept
// logits, the whole window, argmax by hand) token by token, greedy, on the
// world mesh and on each rank alone (the same tokens everywhere); bad
// arguments are an error on every rank.
#include <kshard/testing/harness.hpp>

#include <cmath>
#include <map>

#include <kshard/train/generate.hpp>

#include "train_test_util.hpp"

namespace kt = kshard::testing;
using namespace train_test;

namespace {

std::vector<float> logits_of(const std::vector<double>& p) {
  std::vector<float> z;
  for (double x : p) z.push_back(float(std::log(x)));
  return z;
}

// Frequencies of n draws.
std::vector<double> frequencies(const std::vector<float>& z, const kshard::GenerateOptions& o,
                                int n) {
  std::mt19937_64 rng(o.seed);
  std::vector<double> f(z.size(), 0.0);
  for (int i = 0; i < n; ++i) f[std::size_t(kshard::pick_token(z, o, rng))] += 1.0 / n;
  return f;
}

// The reference: forward() over the whole window (logits kept, no chunks),
// argmax of the last row by hand.
std::vector<std::int32_t> greedy_by_hand(kshard::FsdpModel& model, std::vector<std::int32_t> seq,
                                         int n, std::int64_t context) {
  std::vector<std::int32_t> out;
  for (int i = 0; i < n; ++i) {
    const std::int64_t w = std::min<std::int64_t>(context, std::int64_t(seq.size()));
    Kokkos::View<std::int32_t*> ids("ids", std::size_t(w));
    auto h = Kokkos::create_mirror_view(ids);
    for (std::int64_t t = 0; t < w; ++t) h(t) = seq[seq.size() - std::size_t(w) + std::size_t(t)];
    Kokkos::deep_copy(ids, h);
    auto logits = Kokkos::create_mirror_view_and_copy(
        Kokkos::HostSpace(), model.forward(ids, kshard::ActShape{1, w, 1}));
    const std::int64_t v = std::int64_t(logits.extent(0)) / w;
    std::int64_t best = 0;
    for (std::int64_t j = 1; j < v; ++j)
      if (logits((w - 1) * v + j) > logits((w - 1) * v + best)) best = j;
    seq.push_back(std::int32_t(best));
    out.push_back(std::int32_t(best));
  }
  return out;
}

}  // namespace

KSHARD_TEST_SUITE(generation)

BOOST_AUTO_TEST_CASE(pick_token_greedy_topk_and_sampling) {
  kshard::GenerateOptions o;
  std::mt19937_64 rng(1);
  // Greedy: the first of the largest; NaN and inf are skipped.
  KSHARD_CHECK_ALL(kshard::pick_token({0.f, 2.f, 2.f, -1.f}, o, rng) == 1);
  KSHARD_CHECK_ALL(kshard::pick_token({NAN, -INFINITY, 3.f, 1.f}, o, rng) == 2);
  bool threw = false;
  try {
    kshard::pick_token({NAN, INFINITY}, o, rng);
  } catch (const kshard::Error& e) {
    threw = std::string(e.what()).find("no finite value") != std::string::npos;
  }
  KSHARD_CHECK_ALL(threw);
  // top-k 1 is greedy whatever the temperature.
  o.temperature = 5.0;
  o.top_k = 1;
  KSHARD_CHECK_ALL(kshard::pick_token({0.f, 1.f, 3.f, 3.f}, o, rng) == 2);
  // Sampling at T = 1 draws by the softmax; at T = 2 by p^(1/2) renormalised;
  // top-k 2 renormalises the two largest.
  const std::vector<double> p = {0.5, 0.3, 0.15, 0.05};
  const std::vector<float> z = logits_of(p);
  const int n = 40000;
  const double tol = 0.012;
  o.top_k = 0;
  o.temperature = 1.0;
  std::vector<double> f = frequencies(z, o, n);
  for (std::size_t i = 0; i < p.size(); ++i) KSHARD_CHECK_ALL(std::fabs(f[i] - p[i]) <= tol);
  o.temperature = 2.0;
  f = frequencies(z, o, n);
  double s = 0;
  for (double x : p) s += std::sqrt(x);
  for (std::size_t i = 0; i < p.size(); ++i)
    KSHARD_CHECK_ALL(std::fabs(f[i] - std::sqrt(p[i]) / s) <= tol);
  o.temperature = 1.0;
  o.top_k = 2;
  f = frequencies(z, o, n);
  KSHARD_CHECK_ALL(std::fabs(f[0] - 0.625) <= tol);
  KSHARD_CHECK_ALL(std::fabs(f[1] - 0.375) <= tol);
  KSHARD_CHECK_ALL(f[2] == 0.0 && f[3] == 0.0);
  // The same seed draws the same tokens.
  KSHARD_CHECK_ALL(frequencies(z, o, 100) == frequencies(z, o, 100));
}

// generate (forward_chunks, one row read per step, rank 0's choice
// broadcast) against the by-hand loop, with a context shorter than the
// output (the window slides) on the world mesh and on this rank alone.
BOOST_AUTO_TEST_CASE(greedy_generation_equals_argmax_of_the_forward) {
  const auto& world = kt::world();
  const auto self = world.split(world.rank(), 0, "self");
  kshard::GenerateOptions o;
  o.new_tokens = 12;
  o.context = kSeq;
  const std::vector<std::int32_t> prompt = {3, 17, 5};
  std::vector<std::int32_t> on_world;
  for (const kshard::Communicator* c : {&world, &self}) {
    const kshard::DeviceMesh mesh(*c, {c->size()});
    kshard::FsdpModel model(mesh, tiny_lm(), kshard::Recipe::parse("fp32"));
    model.init_parameters(5);
    std::vector<std::int32_t> seen;
    const std::vector<std::int32_t> got =
        kshard::generate(model, *c, prompt, o, [&](std::int32_t t) { seen.push_back(t); });
    const std::vector<std::int32_t> want = greedy_by_hand(model, prompt, o.new_tokens, o.context);
    KSHARD_CHECK_ALL(got == want);
    KSHARD_CHECK_ALL(seen == got);
    KSHARD_CHECK_ALL(got.size() == std::size_t(o.new_tokens));
    if (c == &world) on_world = got;
    else KSHARD_CHECK_ALL(got == on_world);  // the same weights (same seed), any world size
  }
}

BOOST_AUTO_TEST_CASE(bad_generation_arguments_are_errors_on_every_rank) {
  const auto& world = kt::world();
  const kshard::DeviceMesh mesh(world, {world.size()});
  kshard::FsdpModel model(mesh, tiny_lm(), kshard::Recipe::parse("fp32"));
  model.init_parameters(5);
  const auto error_of = [&](std::vector<std::int32_t> prompt, kshard::GenerateOptions o) {
    try {
      kshard::generate(model, world, prompt, o);
    } catch (const kshard::Error& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  kshard::GenerateOptions o;
  KSHARD_CHECK_ALL(error_of({}, o).find("empty prompt") != std::string::npos);
  o.temperature = -1;
  KSHARD_CHECK_ALL(error_of({1}, o).find("temperature") != std::string::npos);
  o = {};
  o.top_k = -2;
  KSHARD_CHECK_ALL(error_of({1}, o).find("top_k") != std::string::npos);
  o = {};
  o.new_tokens = -1;
  KSHARD_CHECK_ALL(error_of({1}, o).find("new tokens") != std::string::npos);
  o = {};
  o.new_tokens = 1;
  // A token id outside the vocabulary: the embedding's own check.
  KSHARD_CHECK_ALL(error_of({int(kVocab)}, o).find("(no error)") == std::string::npos);
}

KSHARD_TEST_SUITE_END()
