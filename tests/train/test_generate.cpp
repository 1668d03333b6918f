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
//
// The KV cache (GenerateOptions::kv_cache, FsdpModel::decode) against the
// full recompute, on GPT-2 (learned positions) and Llama (RoPE at theta 1000,
// GQA with 2 kv heads of 4) stacks, tied and untied heads, at every world
// size the launch gives (world and each rank alone; an HSDP mesh; without
// reshard-after-forward and prefetch): each step's logits within 1e-5 of the
// largest |logit| (measured: 5.2e-7, the f32 summation orders of the fused
// attention and the cached kernel) and the same greedy tokens, with the
// context crossed (the window re-prefilled); batches of different prompts
// equal each prompt alone; bf16 greedy tokens equal the uncached path's;
// unequal prompt lengths are an error on every rank.
#include <kshard/testing/harness.hpp>

#include <algorithm>
#include <cmath>
#include <map>

#include <kshard/engine/nn/llama_layer.hpp>
#include <kshard/engine/nn/rms_norm.hpp>
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

// The decode tests' models: two blocks, a final norm and a head.
constexpr std::int64_t kDecVocab = 48, kDecWidth = 32, kDecContext = 8;

struct DecodeModel {
  const char* name;
  bool llama, tied;
};
const DecodeModel kDecodeModels[] = {
    {"gpt2 untied", false, false}, {"gpt2 tied", false, true},
    {"llama untied", true, false}, {"llama tied", true, true}};

std::vector<kshard::LayerDef> decode_model_layers(const DecodeModel& m) {
  std::vector<kshard::LayerDef> l;
  if (m.llama) {
    kshard::LlamaBlockConfig c;
    c.d_model = kDecWidth;
    c.heads = 4;
    c.kv_heads = 2;
    c.ffn = 48;
    c.rope_theta = 1000.0;  // not the default 10000: the angles must follow it
    l.push_back(kshard::layer<kshard::Embedding>(kDecVocab, kDecWidth));
    for (int i = 0; i < 2; ++i) l.push_back(kshard::layer<kshard::LlamaLayer>(c));
    l.push_back(kshard::layer<kshard::RMSNorm>(kDecWidth));
    l.push_back(kshard::layer<kshard::Linear>(kDecWidth, kDecVocab, false));
  } else {
    l.push_back(kshard::layer<kshard::Embedding>(kDecVocab, kDecWidth, kDecContext));
    for (int i = 0; i < 2; ++i)
      l.push_back(kshard::layer<kshard::TransformerLayer>(kDecWidth, 4, 4 * kDecWidth));
    l.push_back(kshard::layer<kshard::LayerNorm>(kDecWidth));
    l.push_back(kshard::layer<kshard::Linear>(kDecWidth, kDecVocab, !m.tied));
  }
  return l;
}

kshard::FsdpModel decode_model(const kshard::Communicator& c, const DecodeModel& m,
                               const char* recipe = "fp32", std::vector<int> mesh_shape = {},
                               kshard::FsdpOptions o = {}) {
  o.tie_word_embeddings = m.tied;
  if (mesh_shape.empty()) mesh_shape = {c.size()};
  kshard::FsdpModel model(kshard::DeviceMesh(c, mesh_shape), decode_model_layers(m),
                          kshard::Recipe::parse(recipe), o);
  model.init_parameters(11);
  return model;
}

Kokkos::View<std::int32_t*> device_ids(const std::vector<std::int32_t>& v) {
  Kokkos::View<std::int32_t*> ids("ids", v.size());
  auto h = Kokkos::create_mirror_view(ids);
  std::copy(v.begin(), v.end(), h.data());
  Kokkos::deep_copy(ids, h);
  return ids;
}

std::vector<float> host_copy(Kokkos::View<const float*> v, std::int64_t first, std::int64_t n) {
  std::vector<float> out(std::size_t(n), 0.f);
  Kokkos::View<float*, Kokkos::HostSpace, Kokkos::MemoryUnmanaged> h(out.data(), out.size());
  Kokkos::deep_copy(h, Kokkos::subview(v, std::make_pair(first, first + n)));
  return out;
}

std::int32_t argmax(const std::vector<float>& z) {
  return std::int32_t(std::max_element(z.begin(), z.end()) - z.begin());
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

// Step by step, the same tokens fed to both: FsdpModel::decode on a KvCache
// (prefill, one-token steps, a re-prefill of the window once the sequence
// passes the context) against forward()'s last row over the window. Then
// generate with and without the cache gives the same tokens.
BOOST_AUTO_TEST_CASE(kv_cache_logits_equal_the_full_recompute) {
  const auto& world = kt::world();
  const auto self = world.split(world.rank(), 0, "self");
  const std::vector<std::int32_t> prompt = {3, 17, 5, 40, 22};
  const int steps = 10;  // 5 + 10 tokens > the context of 8
  double worst = 0;
  for (const DecodeModel& m : kDecodeModels) {
    for (const kshard::Communicator* c : {&world, &self}) {
      kshard::FsdpModel model = decode_model(*c, m);
      kshard::KvCache cache(1, kDecContext);
      std::vector<std::int32_t> seq = prompt;
      std::int64_t cache_start = 0;
      bool same_tokens = true;
      double err = 0;
      for (int step = 0; step < steps; ++step) {
        const std::int64_t len = std::int64_t(seq.size());
        const std::int64_t start = std::max<std::int64_t>(0, len - kDecContext);
        const std::int64_t w = len - start;
        const std::vector<std::int32_t> win(seq.begin() + start, seq.end());
        const std::vector<float> want =
            host_copy(model.forward(device_ids(win), kshard::ActShape{1, w, 1}),
                      (w - 1) * kDecVocab, kDecVocab);
        if (step == 0 || start != cache_start) {
          cache.clear();
          cache_start = start;
        }
        const std::int64_t first = cache_start + cache.length();
        const std::vector<std::int32_t> fresh(seq.begin() + first, seq.end());
        const std::vector<float> got = host_copy(
            model.decode(cache, device_ids(fresh), kshard::ActShape{1, len - first, 1}), 0,
            kDecVocab);
        float top = 0;
        for (float z : want) top = std::max(top, std::fabs(z));
        for (std::int64_t j = 0; j < kDecVocab; ++j)
          err = std::max(err, double(std::fabs(got[std::size_t(j)] - want[std::size_t(j)])) / top);
        same_tokens = same_tokens && argmax(got) == argmax(want);
        seq.push_back(argmax(want));
      }
      KSHARD_CHECK_ALL_MSG(err <= 1e-5, m.name << ": cached logits off by " << err
                                               << " of the largest |logit|");
      KSHARD_CHECK_ALL_MSG(same_tokens, m.name << ": greedy tokens differ");
      worst = std::max(worst, err);
      // generate: cached, uncached and the by-hand loop agree.
      kshard::GenerateOptions o;
      o.new_tokens = steps;
      o.context = kDecContext;
      const auto cached = kshard::generate(model, *c, prompt, o);
      o.kv_cache = false;
      const auto full = kshard::generate(model, *c, prompt, o);
      KSHARD_CHECK_ALL_MSG(cached == full, m.name << ": generate with and without the cache");
      KSHARD_CHECK_ALL(cached == greedy_by_hand(model, prompt, steps, kDecContext));
      // Sampling draws the same tokens from (nearly) the same logits.
      o.temperature = 0.9;
      o.top_k = 12;
      o.seed = 3;
      const auto sampled_full = kshard::generate(model, *c, prompt, o);
      o.kv_cache = true;
      KSHARD_CHECK_ALL_MSG(kshard::generate(model, *c, prompt, o) == sampled_full,
                           m.name << ": sampled tokens with and without the cache");
      // No context limit: the cache holds the whole sequence (at most the
      // position table's 8 tokens for GPT-2; RoPE has no limit).
      o = {};
      o.new_tokens = m.llama ? steps : int(kDecContext - prompt.size());
      const auto unbounded = kshard::generate(model, *c, prompt, o);
      o.kv_cache = false;
      KSHARD_CHECK_ALL(unbounded == kshard::generate(model, *c, prompt, o));
    }
  }
  BOOST_TEST_MESSAGE("kv cache: largest logit difference " << worst << " of the largest |logit|");
}

// The cached path on an HSDP mesh (2 x world/2) and with the schedule's
// options off (no reshard after forward, no prefetch): the tokens of one
// rank alone, with and without the cache.
BOOST_AUTO_TEST_CASE(kv_cache_on_any_mesh_and_schedule) {
  const auto& world = kt::world();
  const auto self = world.split(world.rank(), 0, "self");
  const DecodeModel& m = kDecodeModels[3];  // llama, tied
  kshard::GenerateOptions o;
  o.new_tokens = 10;
  o.context = kDecContext;
  const std::vector<std::int32_t> prompt = {7, 8, 9};
  kshard::FsdpModel alone = decode_model(self, m);
  const auto want = kshard::generate(alone, self, prompt, o);
  std::vector<std::vector<int>> meshes = {{world.size()}};
  if (world.size() % 2 == 0 && world.size() >= 4) meshes.push_back({2, world.size() / 2});
  kshard::FsdpOptions lazy;
  lazy.reshard_after_forward = false;
  lazy.prefetch = false;
  for (const auto& shape : meshes) {
    for (const kshard::FsdpOptions& fo : {kshard::FsdpOptions{}, lazy}) {
      kshard::FsdpModel model = decode_model(world, m, "fp32", shape, fo);
      o.kv_cache = true;
      const auto cached = kshard::generate(model, world, prompt, o);
      o.kv_cache = false;
      KSHARD_CHECK_ALL_MSG(cached == want && kshard::generate(model, world, prompt, o) == want,
                           "mesh " << kshard::DeviceMesh::describe(shape) << ", reshard "
                                   << fo.reshard_after_forward);
    }
  }
}

// A batch of three different prompts equals each prompt alone, with the
// cache and without (and the two paths agree), past the context.
BOOST_AUTO_TEST_CASE(batched_generation_equals_each_prompt_alone) {
  const auto& world = kt::world();
  const std::vector<std::vector<std::int32_t>> prompts = {
      {3, 17, 5, 40}, {1, 2, 3, 4}, {47, 0, 30, 9}};
  for (const DecodeModel& m : kDecodeModels) {
    kshard::FsdpModel model = decode_model(world, m);
    for (bool kv : {true, false}) {
      kshard::GenerateOptions o;
      o.new_tokens = 9;
      o.context = kDecContext;
      o.kv_cache = kv;
      std::vector<std::vector<std::int32_t>> seen(prompts.size());
      const auto batch = kshard::generate_batch(
          model, world, prompts, o, [&](std::size_t b, std::int32_t t) { seen[b].push_back(t); });
      KSHARD_CHECK_ALL(batch.size() == prompts.size());
      KSHARD_CHECK_ALL(seen == batch);
      for (std::size_t b = 0; b < prompts.size(); ++b)
        KSHARD_CHECK_ALL_MSG(batch[b] == kshard::generate(model, world, prompts[b], o),
                             m.name << (kv ? " cached" : " uncached") << ": sequence " << b);
      o.kv_cache = !kv;
      KSHARD_CHECK_ALL(batch == kshard::generate_batch(model, world, prompts, o));
    }
  }
}

// bf16 compute: the cached path's greedy tokens equal the uncached path's
// over a short run (the two sum in different orders, but at this size no
// step's top two logits are within bf16 rounding of each other).
BOOST_AUTO_TEST_CASE(bf16_kv_cache_greedy_tokens_equal_the_recompute) {
  const auto& world = kt::world();
  for (const DecodeModel& m : kDecodeModels) {
    kshard::FsdpModel model = decode_model(world, m, "bf16");
    {
      // The prefill's logits against the forward's last row: measured equal on
      // the host (both accumulate in f32 and round the context once); 1/32 of
      // the largest |logit| (a few bf16 roundings) leaves room for the other
      // summation orders of CUDA's kernels.
      const std::vector<std::int32_t> p = {3, 17, 5, 40, 22, 9};
      const std::int64_t n = std::int64_t(p.size());
      const auto want = host_copy(model.forward(device_ids(p), kshard::ActShape{1, n, 1}),
                                  (n - 1) * kDecVocab, kDecVocab);
      kshard::KvCache cache(1, kDecContext);
      const auto got = host_copy(model.decode(cache, device_ids(p), kshard::ActShape{1, n, 1}), 0,
                                 kDecVocab);
      float top = 0, diff = 0;
      for (std::int64_t j = 0; j < kDecVocab; ++j) {
        top = std::max(top, std::fabs(want[std::size_t(j)]));
        diff = std::max(diff, std::fabs(got[std::size_t(j)] - want[std::size_t(j)]));
      }
      KSHARD_CHECK_ALL_MSG(diff <= top / 32, "bf16 " << m.name << ": prefill logits differ by "
                                                      << diff / top << " of the largest |logit|");
    }
    kshard::GenerateOptions o;
    o.new_tokens = 6;
    o.context = kDecContext;
    const auto cached = kshard::generate(model, world, {3, 17, 5}, o);
    o.kv_cache = false;
    KSHARD_CHECK_ALL_MSG(cached == kshard::generate(model, world, {3, 17, 5}, o), m.name);
  }
}

// Sampling in the middle of training (as nanoGPT-style loops do every N
// steps) leaves nothing behind: a training step after generate (cached and
// uncached) gives the loss and gradient shards of one without it, bitwise.
BOOST_AUTO_TEST_CASE(training_continues_after_generate) {
  const auto& world = kt::world();
  std::vector<std::int32_t> ids, next;
  for (int i = 0; i < 2 * int(kDecContext); ++i) ids.push_back((i * 7 + 3) % int(kDecVocab));
  for (std::size_t i = 0; i < ids.size(); ++i) next.push_back(ids[(i + 1) % ids.size()]);
  for (const DecodeModel& m : kDecodeModels) {
    std::vector<double> losses;
    std::vector<std::vector<float>> grads;
    for (int mode = 0; mode < 3; ++mode) {  // no generate, cached, uncached
      kshard::FsdpModel model = decode_model(world, m);
      if (mode > 0) {
        kshard::GenerateOptions g;
        g.new_tokens = 5;
        g.context = kDecContext;
        g.kv_cache = mode == 1;
        kshard::generate(model, world, {3, 17, 5}, g);
      }
      model.zero_grad();
      losses.push_back(model.forward_backward_ce(device_ids(ids), {2, kDecContext, 1}, device_ids(next)));
      model.prepare_optimizer_step();  // settles every gradient shard
      std::vector<float> all;
      for (std::size_t u = 0; u < model.num_units(); ++u) {
        auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), model.group(u).grad());
        all.insert(all.end(), h.data(), h.data() + h.extent(0));
      }
      grads.push_back(all);
    }
    KSHARD_CHECK_ALL_MSG(losses[1] == losses[0] && losses[2] == losses[0] && grads[1] == grads[0] &&
                             grads[2] == grads[0],
                         std::string(m.name) + ": a step after generate differs from one without");
  }
}

BOOST_AUTO_TEST_CASE(bad_kv_cache_use_is_an_error_on_every_rank) {
  const auto& world = kt::world();
  kshard::FsdpModel model = decode_model(world, kDecodeModels[0]);
  const auto error_of = [](const auto& f) {
    try {
      f();
    } catch (const kshard::Error& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  KSHARD_CHECK_ALL(error_of([&] {
                     kshard::generate_batch(model, world, {{1, 2, 3}, {4, 5}},
                                            kshard::GenerateOptions{});
                   }).find("equal length") != std::string::npos);
  // Past the cache's capacity, a batch other than the cache's, an empty cache.
  kshard::KvCache cache(1, 4);
  KSHARD_CHECK_ALL(error_of([&] {
                     model.decode(cache, device_ids({1, 2, 3, 4, 5}), kshard::ActShape{1, 5, 1});
                   }).find("capacity") != std::string::npos);
  KSHARD_CHECK_ALL(error_of([&] {
                     model.decode(cache, device_ids({1, 2}), kshard::ActShape{2, 1, 1});
                   }).find("batch") != std::string::npos);
  KSHARD_CHECK_ALL(error_of([] { kshard::KvCache(0, 4); }).find("KvCache") != std::string::npos);
  // A model of features (no Embedding) cannot decode; generate would not take it either.
  kshard::FsdpModel features(kshard::DeviceMesh(world, {world.size()}),
                             {kshard::layer<kshard::Linear>(4, 4)}, kshard::Recipe::parse("fp32"));
  KSHARD_CHECK_ALL(!features.can_decode() && model.can_decode());
  KSHARD_CHECK_ALL(error_of([&] {
                     features.decode(cache, device_ids({1}), kshard::ActShape{1, 1, 1});
                   }).find("Embedding first") != std::string::npos);
  // The model is usable afterwards (no collective was left half done).
  kshard::GenerateOptions o;
  o.new_tokens = 3;
  KSHARD_CHECK_ALL(kshard::generate_batch(model, world, {{1, 2}, {3, 4}}, o).size() == 2);
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
