// kshard-bench-generate: text generation speed of kshard::generate_batch on
// a model in Hugging Face's format (import_hf), greedy, one BENCH json line
// per batch size. bench/generate/compare_generate.py runs it beside
// transformers' generate() on the same folder.
//
//   kshard-bench-generate --hf DIR [--recipe bf16] [--batch 1,16] [--prompt-len 128]
//                         [--new 128] [--repeats 3] [--no-kv-cache] [--no-keep-shard]
//
// Each figure is the median over --repeats calls after one warm-up call;
// Kokkos::fence() around each. tokens_per_s = batch x new / seconds (the
// prompt's prefill included, as transformers' generate is timed);
// prefill_s is a call that generates one token (the prefill and one step);
// decode_tokens_per_s = batch x (new - 1) / (seconds - prefill_s) (-1 where
// noise makes prefill_s the larger, as on a loaded host). The
// prompts are fixed pseudo-random ids, the same as compare_generate.py's.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include <Kokkos_Core.hpp>
#include <boost/program_options.hpp>
#include <nlohmann/json.hpp>

#include "kshard/checkpoint/hf_config.hpp"
#include "kshard/checkpoint/hf_import.hpp"
#include "kshard/checkpoint/hf_layers.hpp"
#include "kshard/engine/fsdp/fsdp_model.hpp"
#include "kshard/error.hpp"
#include "kshard/mesh/device_mesh.hpp"
#include "kshard/mesh/session.hpp"
#include "kshard/train/generate.hpp"

namespace po = boost::program_options;
using Clock = std::chrono::steady_clock;

namespace {

/// Row b of the prompts: ids (b * 7919 + i * 104729 + 17) mod vocab.
std::vector<std::vector<std::int32_t>> prompts(int batch, int len, std::int64_t vocab) {
  std::vector<std::vector<std::int32_t>> p(static_cast<std::size_t>(batch));
  for (int b = 0; b < batch; ++b)
    for (int i = 0; i < len; ++i)
      p[std::size_t(b)].push_back(std::int32_t((std::int64_t(b) * 7919 + std::int64_t(i) * 104729 + 17) % vocab));
  return p;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  kshard::Session session(argc, argv);
  std::string dir, recipe = "bf16", batches = "1,16";
  int prompt_len = 128, new_tokens = 128, repeats = 3;
  bool no_cache = false, no_keep = false;
  po::options_description desc("kshard-bench-generate");
  desc.add_options()("help", "this text")("hf", po::value(&dir)->required(), "Hugging Face model folder")(
      "recipe", po::value(&recipe)->default_value(recipe), "fp32 | bf16 (the compute dtype)")(
      "batch", po::value(&batches)->default_value(batches), "comma-separated batch sizes")(
      "prompt-len", po::value(&prompt_len)->default_value(prompt_len), "prompt tokens per sequence")(
      "new", po::value(&new_tokens)->default_value(new_tokens), "generated tokens per sequence")(
      "repeats", po::value(&repeats)->default_value(repeats), "timed calls per batch size")(
      "no-kv-cache", po::bool_switch(&no_cache), "recompute the window for every token")(
      "no-keep-shard", po::bool_switch(&no_keep),
      "cast the f32 master to the compute dtype at every unshard (default: keep the 16-bit copy, "
      "FsdpOptions::keep_low_precision_shard, as an inference server would)");
  try {
    po::variables_map vm;
    po::store(po::parse_command_line(argc, argv, desc), vm);
    if (vm.count("help")) {
      if (session.rank() == 0) std::cout << desc << "\n";
      return 0;
    }
    po::notify(vm);
    if (prompt_len < 1 || new_tokens < 2 || repeats < 1)
      throw kshard::Error("--prompt-len " + std::to_string(prompt_len) + " --new " + std::to_string(new_tokens) +
                              " --repeats " + std::to_string(repeats),
                          "a prompt, at least 2 new tokens and 1 repeat");
    const kshard::Communicator& world = session.world();
    kshard::HfConfig c = kshard::read_hf_config(dir);
    c.max_positions = prompt_len + new_tokens;  // the window: every token sees the whole sequence
    kshard::FsdpOptions o;
    o.tie_word_embeddings = c.tie_word_embeddings;
    // Generation reads every weight once per token: a cast of the f32 master
    // per unshard would cost more than the step itself at batch 1.
    o.keep_low_precision_shard = !no_keep && recipe != "fp32";
    kshard::DeviceMesh mesh(world, {world.size()}, {"shard"});
    kshard::FsdpModel model(mesh, kshard::hf_layers(c), kshard::Recipe::parse(recipe), o);
    const auto t_load = Clock::now();
    kshard::import_hf(model, c, dir);
    const double load_s = std::chrono::duration<double>(Clock::now() - t_load).count();
    std::stringstream ss(batches);
    std::string item;
    while (std::getline(ss, item, ',')) {
      const int batch = std::stoi(item);
      const auto p = prompts(batch, prompt_len, c.vocab);
      kshard::GenerateOptions g;
      g.context = prompt_len + new_tokens;
      g.kv_cache = !no_cache;
      const auto timed = [&](int n) {
        g.new_tokens = n;
        Kokkos::fence();
        const auto t0 = Clock::now();
        auto out = kshard::generate_batch(model, world, p, g);
        Kokkos::fence();
        return std::make_pair(std::chrono::duration<double>(Clock::now() - t0).count(), out);
      };
      timed(4);  // warm-up: workspaces, cuBLAS handles, the cache
      std::vector<double> full, prefill;
      std::vector<std::int32_t> first;
      for (int r = 0; r < repeats; ++r) {
        auto [s, out] = timed(new_tokens);
        full.push_back(s);
        first.assign(out[0].begin(), out[0].begin() + std::min<std::size_t>(16, out[0].size()));
        prefill.push_back(timed(1).first);
      }
      const double s = median(full), pre = median(prefill);
      nlohmann::json j = {{"side", "kshard"},
                          {"recipe", recipe},
                          {"kv_cache", !no_cache},
                          {"keep_shard", o.keep_low_precision_shard},
                          {"batch", batch},
                          {"prompt", prompt_len},
                          {"new", new_tokens},
                          {"seconds", s},
                          {"tokens_per_s", batch * new_tokens / s},
                          {"prefill_s", pre},
                          {"decode_tokens_per_s", s > pre ? batch * (new_tokens - 1) / (s - pre) : -1.0},  // -1: noise
                          {"load_s", load_s},
                          {"first_tokens", first}};
      if (session.rank() == 0) std::printf("BENCH %s\n", j.dump().c_str());
      std::fflush(stdout);
    }
  } catch (const po::error& e) {
    if (session.rank() == 0) std::fprintf(stderr, "kshard-bench-generate: %s\n%s", e.what(), "see --help\n");
    return 2;
  } catch (const kshard::Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 2;
  }
  return 0;
}
