// kshard-train: a small GPT-style model, every layer one FSDP unit, trained
// by a kshard::Trainer (FusedAdam, LR schedule, loss scaling, divergence
// guard) on a file of token ids (--data) or on a built-in synthetic language.
//
//   mpiexec -n 2 kshard-train                       # 1-D mesh over both ranks, fp32
//   mpiexec -n 4 kshard-train --mesh 2x2 --recipe bf16 --accum 2
//   mpiexec -n 2 kshard-train --data train.bin --val-data val.bin --vocab 50304 \
//       --eval-every 100 --lr-schedule cosine --warmup 100 --min-lr 3e-4
//   mpiexec -n 2 kshard-train --save-dir ckpt --save-every 100 --resume ckpt   # restartable
//   mpiexec -n 4 kshard-train --init-from model.safetensors --val-data val.bin --eval-only
//
// Checkpoints: --save-dir DIR saves DIR/step-<N> (kshard::Trainer::save: the
// sharded tensors plus the TrainerState as JSON) every --save-every steps and
// after the last step, keeping --keep of them; --resume PATH continues from a
// step-N checkpoint (Trainer::load) or the newest of a save directory
// (Trainer::resume); the loop runs from trainer.step_count() to
// --steps, the run's total. --init-from loads weights only, before the
// Trainer exists (a checkpoint directory through the model-only
// load_checkpoint, a .safetensors file through import_safetensors);
// --export writes the final weights as safetensors. --async-save saves with
// Trainer::save_async (the files written on a background thread, committed
// at a later step) and waits for the last save before the summary, so a
// failed write still ends the run with an error.
//
// Rank 0 prints one line per step (loss averaged over ranks, gradient norm,
// LR, tokens/s, peak memory of the worst rank, whether the optimizer skipped
// the step, elapsed time and ETA), eval_loss lines, and a summary that
// compares the per-rank persistent memory with the ZeRO-3 bound.
// Exit codes, the same on every rank: 2 for a bad command line or a
// kshard::Error (bad data file, a run that does not fit in memory), 3 when
// training diverged (--max-skipped steps skipped in a row, or a non-finite
// final loss).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <Kokkos_Core.hpp>

#include "kshard/checkpoint/checkpoint.hpp"
#include "kshard/checkpoint/hf_export.hpp"
#include "kshard/checkpoint/hf_import.hpp"
#include "kshard/checkpoint/safetensors.hpp"
#include "kshard/engine/nn/attention.hpp"
#include "kshard/engine/nn/embedding.hpp"
#include "kshard/engine/fsdp/fsdp_model.hpp"
#include "kshard/kernels/gemm.hpp"
#include "kshard/engine/nn/layer_norm.hpp"
#include "kshard/engine/nn/linear.hpp"
#include "kshard/engine/nn/llama_layer.hpp"
#include "kshard/engine/nn/rms_norm.hpp"
#include "kshard/train/generate.hpp"
#include "kshard/optim/loss_scaler.hpp"
#include "kshard/engine/fsdp/recipe.hpp"
#include "kshard/engine/nn/transformer_layer.hpp"
#include "kshard/error.hpp"
#include "kshard/mesh/agree.hpp"
#include "kshard/mesh/device_mesh.hpp"
#include "kshard/core/memory_tracker.hpp"
#include "kshard/mesh/session.hpp"
#include "kshard/optim/fused_adam.hpp"
#include "kshard/train/memory_estimate.hpp"
#include "kshard/train/profiler_range.hpp"
#include "kshard/train/token_file.hpp"
#include "kshard/train/trainer.hpp"
#include "markov_task.hpp"
#include "train_options.hpp"

namespace {

using kshard_train::TrainOptions;
using Clock = std::chrono::steady_clock;

std::string mib(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3f MiB", bytes / (1024.0 * 1024.0));
  return buf;
}

std::string shape_text(const std::vector<int>& s) {
  std::string t = "[";
  for (std::size_t i = 0; i < s.size(); ++i) t += (i ? ", " : "") + std::to_string(s[i]);
  return t + "]";
}

// The MLP's hidden width: --ffn-hidden, else 4d (GPT-2) or Llama's rule
// (8d/3, rounded up to a multiple of 256: d 2048 -> 5632, d 4096 -> 11008).
std::int64_t ffn_hidden(const TrainOptions& o) {
  if (o.ffn_hidden > 0) return o.ffn_hidden;
  if (o.arch == "gpt2") return 4 * std::int64_t(o.width);
  const std::int64_t h = 8 * std::int64_t(o.width) / 3;
  return (h + 255) / 256 * 256;
}

std::vector<kshard::LayerDef> model_layers(const TrainOptions& o) {
  // Described once; the model builds the layers in the recipe's compute dtype.
  std::vector<kshard::LayerDef> layers;
  const std::int64_t d = o.width, vocab = o.vocab;
  if (o.arch == "llama") {
    // Token embedding only (positions come from the rotary embeddings),
    // L Llama blocks, the final RMSNorm and a head without bias.
    layers.push_back(kshard::layer<kshard::Embedding>(vocab, d));
    kshard::LlamaBlockConfig c;
    c.d_model = d;
    c.heads = o.heads;
    c.kv_heads = o.kv_heads;
    c.ffn = ffn_hidden(o);
    c.rope_theta = o.rope_theta;
    c.norm_eps = o.norm_eps;
    for (int l = 0; l < o.layers; ++l) layers.push_back(kshard::layer<kshard::LlamaLayer>(c));
    layers.push_back(kshard::layer<kshard::RMSNorm>(d, o.norm_eps));
    layers.push_back(kshard::layer<kshard::Linear>(d, vocab, false));
    return layers;
  }
  layers.push_back(kshard::layer<kshard::Embedding>(vocab, d, std::int64_t(o.seq)));
  for (int l = 0; l < o.layers; ++l)
    layers.push_back(kshard::layer<kshard::TransformerLayer>(d, std::int64_t(o.heads),
                                                             ffn_hidden(o), o.norm_eps));
  layers.push_back(kshard::layer<kshard::LayerNorm>(d, o.norm_eps));
  // GPT-2's tied head has no bias (the table is the whole head).
  layers.push_back(kshard::layer<kshard::Linear>(d, vocab, !o.tie_embeddings));
  return layers;
}

/// Bytes of Adam's moments over all groups on this rank.
std::size_t optimizer_state_bytes(const kshard::FusedAdam& adam) {
  std::size_t b = 0;
  for (int g = 0; g < adam.num_groups(); ++g) {
    const auto& s = adam.state(g);
    b += (s.exp_avg.span() + s.exp_avg_sq.span()) * sizeof(float);
    b += (s.exp_avg_bf16.span() + s.exp_avg_sq_bf16.span()) * 2;
  }
  return b;
}

/// Small reductions of host numbers over the ranks (kshard/mesh/agree.hpp:
/// on the host, no device round trip).
class Reducer {
 public:
  explicit Reducer(const kshard::Communicator& comm) : comm_(comm) {}
  std::vector<double> run(std::vector<double> v, kshard::ReduceOp op) const {
    kshard::host_all_reduce(comm_, v, op);
    return v;
  }

 private:
  kshard::Communicator comm_;
};

/// NaN without its sign bit, so that printf says "nan" (not "-nan").
double unsigned_nan(double x) { return std::isnan(x) ? std::fabs(x) : x; }

std::string duration_text(double s) {
  char buf[32];
  if (!std::isfinite(s) || s < 0) return "?";
  if (s < 60)
    std::snprintf(buf, sizeof buf, "%.1fs", s);
  else if (s < 3600)
    std::snprintf(buf, sizeof buf, "%dm%02ds", int(s) / 60, int(s) % 60);
  else
    std::snprintf(buf, sizeof buf, "%dh%02dm", int(s) / 3600, (int(s) % 3600) / 60);
  return buf;
}

kshard::TrainerOptions trainer_options(const TrainOptions& o) {
  kshard::TrainerOptions t;
  t.batch = o.batch;
  t.seq = o.seq;
  t.accum = o.accum;
  t.adam.weight_decay = float(o.weight_decay);
  t.schedule.kind = kshard::LrSchedule::parse_kind(o.lr_schedule);
  t.schedule.lr = o.lr;
  t.schedule.min_lr = o.min_lr;
  t.schedule.warmup = o.warmup;
  t.schedule.total_steps = o.steps;
  t.clip = o.clip;
  t.data_seed = o.seed;
  t.max_skipped = o.max_skipped;
  return t;
}

std::string schedule_text(const kshard::LrScheduleConfig& c) {
  std::ostringstream t;
  t << kshard::LrSchedule::kind_name(c.kind) << " lr " << c.lr << " min_lr " << c.min_lr
    << " warmup " << c.warmup << " total_steps " << c.total_steps;
  return t.str();
}

/// The Hugging Face config of the model the flags build (--export-hf,
/// --init-from DIR).
kshard::HfConfig hf_config(const TrainOptions& o) {
  kshard::HfConfig c;
  c.model_type = o.arch;
  c.vocab = o.vocab;
  c.hidden = o.width;
  c.layers = o.layers;
  c.heads = o.heads;
  c.kv_heads = o.arch == "llama" ? (o.kv_heads ? o.kv_heads : o.heads) : 0;
  c.intermediate = ffn_hidden(o);
  c.max_positions = o.seq;
  c.rope_theta = o.rope_theta;
  c.norm_eps = o.norm_eps;
  c.tie_word_embeddings = o.tie_embeddings;
  return c;
}

/// --init-from: a checkpoint's step-N directory (weights through the
/// model-only load_checkpoint), a Hugging Face model directory (config.json
/// beside the weights: import_hf, its config checked against the flags) or a
/// safetensors file (import_safetensors). Which one is decided from what
/// every rank sees and agreed, so that no two ranks enter different loaders.
/// A path that is none of them (missing) goes to the loader its name
/// suggests, which reports it on every rank.
void init_from(kshard::FsdpModel& model, const TrainOptions& o, bool root) {
  namespace fs = std::filesystem;
  const std::string& path = o.init_from;
  std::error_code ec;
  const bool dir = fs::is_directory(path, ec);
  const bool hf = dir && fs::exists(fs::path(path) / "config.json", ec);
  const bool safetensors =
      !dir && (fs::is_regular_file(path, ec) ||
               (path.size() >= 12 && path.compare(path.size() - 12, 12, ".safetensors") == 0));
  kshard::agree_same(model.mesh().world(), "--init-from '" + path + "'",
                     {{"is a file (1) or not (0)", safetensors ? 1 : 0},
                      {"is a Hugging Face directory (1) or not (0)", hf ? 1 : 0}},
                     "a path that every rank sees alike");
  const auto t0 = Clock::now();
  std::string what;
  if (hf) {
    kshard::import_hf(model, hf_config(o), path);
    what = std::string("Hugging Face ") + (o.arch == "llama" ? "LlamaForCausalLM" : "GPT2LMHeadModel");
  } else if (safetensors) {
    kshard::import_safetensors(model, path);
    what = "safetensors";
  } else {
    const kshard::LoadInfo li = kshard::load_checkpoint(path, model);
    what = "checkpoint step " + std::to_string(li.step) + ", weights only";
    if (li.recipe_changed) what += ", saved under " + li.saved_recipe;
    if (li.resharded)
      what += ", saved on " + std::to_string(li.saved_world_size) + " ranks mesh " +
              shape_text(li.saved_mesh);
  }
  if (root) {
    std::printf("initialised from %s  (%s)  seconds %.3f\n", path.c_str(), what.c_str(),
                std::chrono::duration<double>(Clock::now() - t0).count());
    std::fflush(stdout);
  }
}

int run(kshard::Session& session, int argc, char** argv) {
  const int rank = session.rank(), world_size = session.size();
  const kshard_train::ParsedOptions parsed = kshard_train::parse_options(argc, argv, world_size);
  if (parsed.help) {
    if (rank == 0) std::printf("%s", parsed.help_text.c_str());
    return 0;
  }
  const TrainOptions& o = parsed.options;
  const bool root = rank == 0;
  const kshard::Communicator& world = session.world();
  // The shape may come from --init-from's config.json, read by every rank:
  // ranks that saw different files must not build different models.
  kshard::agree_same(world, "the model's shape (flags, or --init-from's config.json)",
                     {{"--arch llama", o.arch == "llama"}, {"--vocab", o.vocab}, {"--width", o.width},
                      {"--layers", o.layers}, {"--heads", o.heads}, {"--kv-heads", o.kv_heads},
                      {"--ffn-hidden", o.ffn_hidden}, {"--tie-embeddings", o.tie_embeddings}},
                     "one model on every rank (the same flags and files everywhere)");

  std::vector<std::string> names =
      o.mesh.size() == 2 ? std::vector<std::string>{"replicate", "shard"}
                         : std::vector<std::string>{"shard"};
  kshard::DeviceMesh mesh(world, o.mesh, names);
  const int shard_n = mesh.shard_size();

  kshard::set_allow_tf32(o.tf32);
  kshard::set_attention_impl(o.attention == "fused"       ? kshard::AttentionImpl::fused
                             : o.attention == "unfused"   ? kshard::AttentionImpl::unfused
                             : o.attention == "recompute" ? kshard::AttentionImpl::recompute
                                                          : kshard::AttentionImpl::automatic);
  // Data first: a bad file is reported before anything large is allocated.
  const kshard::TokenDType dtype = kshard::TokenFile::parse_dtype(o.data_dtype);
  std::unique_ptr<kshard::TokenSource> data;
  std::unique_ptr<kshard_train::MarkovTask> markov;
  if (!o.data.empty()) {
    data = std::make_unique<kshard::TokenFile>(
        kshard::TokenFile::open(world, o.data, dtype, o.vocab, std::int64_t(o.seq) + 1));
  } else {
    markov = std::make_unique<kshard_train::MarkovTask>(o.vocab, o.seed);
  }
  std::unique_ptr<kshard::TokenFile> val;
  if (!o.val_data.empty())
    // The evaluation reads batches x batch windows of seq + 1 consecutive
    // tokens overlapping by one: check that they are there before training.
    val = std::make_unique<kshard::TokenFile>(kshard::TokenFile::open(
        world, o.val_data, dtype, o.vocab,
        std::int64_t(o.eval_batches) * o.batch * o.seq + 1));
  const kshard::TokenSource& source = data ? *data : *markov;

  // Does it fit? Estimated from the model description, before allocating.
  const std::vector<kshard::LayerDef> defs = model_layers(o);
  kshard::Recipe recipe = kshard::Recipe::parse(o.recipe, o.fp8_init);
  recipe.fp8_compute.amax_history_len = o.fp8_amax_history;
  recipe.fp8_compute.amax_algo =
      o.fp8_amax_algo == "max" ? kshard::Fp8AmaxAlgo::max : kshard::Fp8AmaxAlgo::most_recent;
  kshard::FsdpOptions fo;
  fo.reshard_after_forward = o.reshard_after_forward;
  fo.keep_low_precision_shard = o.keep_lp_shard;
  fo.loss_chunk_bytes = std::size_t(o.loss_chunk_mib) << 20;
  fo.tie_word_embeddings = o.tie_embeddings;
  const kshard::MemoryEstimate estimate =
      kshard::MemoryEstimate::of(defs, recipe, shard_n, o.batch, o.seq, fo);
  kshard::check_memory_fits(world, estimate);

  kshard::FsdpModel built(mesh, defs, recipe, fo);
  built.init_parameters(o.seed);
  const Reducer reducer(world);
  // Weights only, before the Trainer (and its optimizer) exists: a new run
  // from step 0 with fresh moments.
  if (!o.init_from.empty()) init_from(built, o, root);
  kshard::Trainer trainer(std::move(built), trainer_options(o));
  // The snapshot's host memory now, not inside the first save.
  if (o.async_save) trainer.reserve_async_save();
  const kshard::FsdpModel& model = trainer.model();
  const bool loss_scaling = model.recipe().loss_scaling;

  const std::int64_t rows = std::int64_t(o.batch) * o.seq;
  const std::int64_t params = model.num_parameters();
  const double tokens_per_step = double(rows) * o.accum * world_size;
  const double floor = markov ? markov->entropy_floor() : 0.0;
  if (root) {
    std::printf(
        "kshard-train: %d ranks, mesh %s, recipe %s%s, %d x %s(d=%d, heads=%d%s, "
        "ff=%lld), vocab %d, seq %d, batch %d/rank x %d micro-batches, %lld params, %s\n",
        world_size, kshard::DeviceMesh::describe(o.mesh, names).c_str(),
        model.recipe().describe().c_str(),
        o.reshard_after_forward ? "" : ", no reshard-after-forward", o.layers,
        o.arch == "llama" ? "LlamaLayer" : "TransformerLayer", o.width, o.heads,
        o.arch == "llama" ? (", kv_heads=" + std::to_string(o.kv_heads ? o.kv_heads : o.heads) +
                             ", rope_theta=" + std::to_string(std::int64_t(o.rope_theta)))
                                .c_str()
                          : "",
        (long long)ffn_hidden(o), o.vocab, o.seq, o.batch, o.accum, (long long)params,
        kshard::Session::current().default_backend() == kshard::Backend::nccl ? "nccl" : "mpi");
    if (markov)
      std::printf("task: Markov chain, 2 successors per token (p 0.8/0.2): uniform guess %.3f "
                  "nats, floor %.3f nats\n",
                  std::log(double(o.vocab)), floor);
    else
      std::printf("data: %s; uniform guess %.3f nats\n", source.describe().c_str(),
                  std::log(double(o.vocab)));
    if (val) std::printf("eval: %s, %d x %d windows\n", val->describe().c_str(), o.eval_batches, o.batch);
    std::printf("optimizer: AdamW lr %g (%s, warmup %d, min %g), weight decay %g, clip %g; "
                "memory estimate %s per rank\n",
                o.lr, o.lr_schedule.c_str(), o.warmup, o.min_lr, o.weight_decay, o.clip,
                estimate.describe().c_str());
    std::fflush(stdout);
  }

  auto evaluate = [&]() {
    const kshard::EvalResult e = trainer.evaluate(*val, o.eval_batches);
    if (root) {
      std::printf("eval_loss %.6f  step %lld  tokens %lld\n", e.loss,
                  (long long)trainer.step_count(), (long long)e.tokens);
      std::fflush(stdout);
    }
    return e.loss;
  };
  // --resume: the newest checkpoint of --save-dir, tensors and TrainerState
  // (step, optimizer step count, loss scale, data position, LR schedule).
  std::int64_t last_saved = -1;  // the step of the newest checkpoint of this run
  if (!o.resume.empty()) {
    // A step-N directory (it has a manifest) is loaded as is; anything else is
    // a save directory whose newest complete checkpoint is taken. Every rank
    // must take the same branch (both are collective): agreed first.
    const bool is_step_dir =
        std::filesystem::exists(std::filesystem::path(o.resume) / "manifest.json");
    kshard::agree_same(world, "--resume " + o.resume,
                       {{"holds a checkpoint's manifest.json (1) or not (0)", is_step_dir ? 1 : 0}},
                       "the same file system view on every rank");
    std::optional<kshard::LoadInfo> loaded;
    if (is_step_dir)
      loaded = trainer.load(o.resume);
    else
      loaded = trainer.resume(o.resume);
    if (const auto& info = loaded) {
      last_saved = info->step;
      if (root) {
        std::printf("resumed from %s step %lld  bytes %llu  seconds %.3f\n",
                    info->path.string().c_str(), (long long)info->step,
                    (unsigned long long)info->bytes_read, info->seconds);
        if (info->resharded)
          std::printf("note: the checkpoint was saved on %d ranks, mesh %s: resharded\n",
                      info->saved_world_size, shape_text(info->saved_mesh).c_str());
        if (info->recipe_changed)
          std::printf("note: the checkpoint was saved under recipe %s\n",
                      info->saved_recipe.c_str());
        // The schedule is part of the run's state: changing it halfway would
        // make the resumed run another run. The checkpoint's wins.
        const kshard::TrainerOptions asked = trainer_options(o);
        if (trainer.schedule().config() != asked.schedule)
          std::printf("warning: the checkpoint's LR schedule (%s) differs from the command "
                      "line's (%s); continuing with the checkpoint's\n",
                      schedule_text(trainer.schedule().config()).c_str(),
                      schedule_text(asked.schedule).c_str());
        if (trainer.state().data_seed != asked.data_seed)
          std::printf("warning: the checkpoint's data seed %llu differs from --seed %llu; "
                      "continuing with the checkpoint's data stream\n",
                      (unsigned long long)trainer.state().data_seed,
                      (unsigned long long)asked.data_seed);
        if (trainer.step_count() >= o.steps)
          std::printf("note: the checkpoint is at step %lld, --steps is %d: nothing to train\n",
                      (long long)trainer.step_count(), o.steps);
      }
    } else if (root) {
      std::printf("resume: no checkpoint in %s; starting fresh at step 0\n", o.resume.c_str());
    }
    if (root) std::fflush(stdout);
  }
  // --sample N: what the model says after the prompt (kshard::generate; every
  // rank computes it, rank 0 prints). On the Markov task the chain itself says
  // how well it was learnt: a greedy continuation should take the likely
  // successor (p = 0.8) at every step, a sampled one ~80 % of the time.
  auto sample = [&]() {
    if (o.sample == 0) return;
    kshard::GenerateOptions g;
    g.new_tokens = o.sample;
    g.temperature = o.temperature;
    g.top_k = o.top_k;
    g.seed = o.seed;
    g.context = o.seq;
    const std::vector<std::int32_t> out = kshard::generate(trainer.model(), world, o.prompt, g);
    if (!root) return;
    std::string ids, text;
    for (std::int32_t t : out) {
      ids += (ids.empty() ? "" : ",") + std::to_string(t);
      // One line of text: printable ASCII as it is, a newline as \n, any
      // other byte as \xNN (whatever an untrained model emits).
      if (o.prompt_is_text) {
        if (t >= 0x20 && t < 0x7f && t != '\\') {
          text += char(t);
        } else if (t == '\n') {
          text += "\\n";
        } else {
          char esc[8];
          std::snprintf(esc, sizeof esc, "\\x%02x", unsigned(t & 0xff));
          text += esc;
        }
      }
    }
    std::printf("sample: %d tokens after a prompt of %zu (%s): %s\n", o.sample, o.prompt.size(),
                o.temperature == 0 ? "greedy"
                                   : ("temperature " + std::to_string(o.temperature) +
                                      (o.top_k ? ", top-k " + std::to_string(o.top_k) : ""))
                                         .c_str(),
                ids.c_str());
    if (o.prompt_is_text) std::printf("sample text: %s\n", text.c_str());
    if (markov) {
      int likely = 0, chain = 0;
      std::int32_t prev = o.prompt.back();
      for (std::int32_t t : out) {
        likely += t == markov->likely_successor(prev);
        chain += t == markov->likely_successor(prev) || t == markov->unlikely_successor(prev);
        prev = t;
      }
      std::printf("sample: the Markov chain's likely successor %d of %d, a successor %d of %d\n",
                  likely, o.sample, chain, o.sample);
    }
    std::fflush(stdout);
  };
  // --eval-only: the initialised, --init-from or --resume model.
  if (o.eval_only) {
    if (val) evaluate();  // --eval-only --sample N needs no --val-data
    sample();
    return 0;
  }
  kshard::SaveOptions save_options;
  save_options.keep_last = o.keep;
  // Committed saves: count, the time they blocked training (sync: all of it;
  // async: snapshot, commit checks, waits) and rank 0's data file writes.
  int saves_done = 0;
  double save_blocked = 0, save_write = 0;
  auto saved = [&](const kshard::SaveInfo& si) {
    ++saves_done;
    save_blocked += si.blocked_seconds;
    save_write += si.write_seconds;
    if (root) {
      std::printf("checkpoint saved %s step %lld bytes %llu seconds %.3f blocked %.3f write %.3f\n",
                  si.path.string().c_str(), (long long)si.step,
                  (unsigned long long)si.total_bytes, si.seconds, si.blocked_seconds,
                  si.write_seconds);
      std::fflush(stdout);
    }
  };
  auto save = [&]() {
    last_saved = trainer.step_count();
    if (!o.async_save) {
      saved(trainer.save(o.save_dir, save_options));
      return;
    }
    // A save still pending is committed first (and reported).
    if (const auto prev = trainer.wait_for_save()) saved(*prev);
    trainer.save_async(o.save_dir, save_options);
  };

  // Fault injection for the tests: this rank alone fails at the first step,
  // while the others go on into a collective (see all_ranks_failed).
  const char* inject = std::getenv("KSHARD_TRAIN_INJECT_ERROR");
  const bool inject_here = inject && std::atoi(inject) == rank;

  double first_loss = 0, last_loss = 0, tps_sum = 0, peak_max = 0, live_between = 0;
  int tps_count = 0, skipped_steps = 0;
  std::vector<double> tps_all;
  const auto run_start = Clock::now();
  // --steps is the run's total: a resumed run continues from its saved step.
  const int first_step = int(trainer.step_count());
  for (int step = first_step; step < o.steps; ++step) {
    Kokkos::fence();
    live_between = std::max(live_between, double(kshard::memory::stats().live_bytes));
    kshard::memory::reset_peak();
    const auto t0 = Clock::now();
    if (inject_here)
      throw kshard::Error("injected failure (KSHARD_TRAIN_INJECT_ERROR) at step 1",
                          "no KSHARD_TRAIN_INJECT_ERROR in a real run");
    kshard::ProfilerRange profiled;
    if (step + 1 == o.profile_step) profiled.start();
    kshard::StepReport r;
    bool diverged = false;
    std::unique_ptr<kshard::TrainingDiverged> stop;
    try {
      r = trainer.step(source);
    } catch (const kshard::TrainingDiverged& e) {
      // Log the step that tripped the guard, then end like any error.
      r = e.report();
      stop = std::make_unique<kshard::TrainingDiverged>(e);
      diverged = true;
    }
    Kokkos::fence();
    const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    profiled.stop();
    // Library workspaces (cuBLAS / cuBLASLt) are kept outside peak_bytes; a step
    // needs them, so they count (as in torch.cuda.max_memory_allocated).
    const auto mem_now = kshard::memory::stats();
    const double peak = double(mem_now.peak_bytes + mem_now.workspace_bytes);

    const auto mx = reducer.run({seconds, peak}, kshard::ReduceOp::max);
    const double tps = tokens_per_step / mx[0];
    if (step == first_step) first_loss = r.loss;
    last_loss = r.loss;
    // The first step pays for first-use allocations: leave it out of the mean.
    if (step > first_step || o.steps - first_step == 1) {
      tps_sum += tps;
      ++tps_count;
      tps_all.push_back(tps);
    }
    peak_max = std::max(peak_max, mx[1]);
    skipped_steps += r.optimizer.skipped ? 1 : 0;
    const double elapsed = std::chrono::duration<double>(Clock::now() - run_start).count();
    const int done = step + 1 - first_step;
    const double eta = elapsed / done * (o.steps - step - 1);
    if (root) {
      std::printf("step %4d/%d  loss %.6f  grad_norm %.3f  lr %.3e  tokens/s %10.0f  peak/rank %s  "
                  "%s",
                  step + 1, o.steps, unsigned_nan(r.loss), unsigned_nan(r.optimizer.grad_norm),
                  r.lr, tps, mib(mx[1]).c_str(),
                  r.optimizer.skipped ? "SKIPPED (inf/nan gradient)" : "stepped");
      if (loss_scaling) std::printf("  loss_scale %g", double(r.loss_scale));
      std::printf("  elapsed %s  eta %s\n", duration_text(elapsed).c_str(),
                  duration_text(eta).c_str());
      std::fflush(stdout);
    }
    if (r.committed_save) saved(*r.committed_save);
    if (diverged) throw *stop;
    if (val && o.eval_every > 0 && ((step + 1) % o.eval_every == 0 || step + 1 == o.steps))
      evaluate();
    if (!o.save_dir.empty() && o.save_every > 0 && (step + 1) % o.save_every == 0) save();
  }
  if (!std::isfinite(last_loss))
    throw kshard::TrainingDiverged(
        "training ended with a non-finite loss (" + std::to_string(unsigned_nan(last_loss)) +
            ") after " +
            std::to_string(o.steps) + " steps, " + std::to_string(skipped_steps) + " skipped",
        "a finite loss: a lower --lr, or --max-skipped to stop at the first skipped steps");
  // After the last step: a checkpoint (unless this step's is already there)
  // and the exported weights.
  if (!o.save_dir.empty() && last_saved != trainer.step_count()) save();
  // The last asynchronous save is written while the export runs.
  if (!o.export_path.empty()) {
    const auto t0 = Clock::now();
    kshard::export_safetensors(trainer.model(), o.export_path,
                               o.export_dtype == "bf16" ? kshard::DType::bf16 : kshard::DType::f32,
                               {{"kshard.train.step", std::to_string(trainer.step_count())}});
    if (root) {
      std::error_code ec;
      const auto bytes = std::filesystem::file_size(o.export_path, ec);
      std::printf("exported %s step %lld dtype %s bytes %llu seconds %.3f\n",
                  o.export_path.c_str(), (long long)trainer.step_count(), o.export_dtype.c_str(),
                  (unsigned long long)(ec ? 0 : bytes),
                  std::chrono::duration<double>(Clock::now() - t0).count());
      std::fflush(stdout);
    }
  }

  if (!o.export_hf.empty()) {
    const kshard::HfConfig c = hf_config(o);
    kshard::export_hf(trainer.model(), c, o.export_hf,
                      o.export_dtype == "bf16" ? kshard::DType::bf16 : kshard::DType::f32);
    if (root) {
      std::printf("exported %s (Hugging Face %s) step %lld dtype %s\n", o.export_hf.c_str(),
                  o.arch == "llama" ? "LlamaForCausalLM" : "GPT2LMHeadModel",
                  (long long)trainer.step_count(), o.export_dtype.c_str());
      std::fflush(stdout);
    }
  }

  // Before the summary and exit: commit the pending save, or fail with its
  // error on every rank (the Trainer's destructor would only wait).
  if (o.async_save)
    if (const auto si = trainer.wait_for_save()) saved(*si);

  const kshard::FusedAdam& adam = trainer.optimizer();
  const kshard::MemoryFootprint footprint = model.memory_footprint();
  const double persistent = double(footprint.persistent_bytes);
  const double optimizer = double(optimizer_state_bytes(adam));
  const auto mem = reducer.run({persistent, optimizer, persistent + optimizer, live_between},
                               kshard::ReduceOp::max);
  const double unit = double(footprint.max_unit_bytes);
  const double sharded = 16.0 * double(params) / shard_n;
  const double bound = sharded + unit;
  const double tps_mean = tps_count ? tps_sum / tps_count : 0;
  std::sort(tps_all.begin(), tps_all.end());
  const double tps_median = tps_all.empty() ? 0 : tps_all[tps_all.size() / 2];
  if (root) {
    std::printf("summary: first_loss=%.4f last_loss=%.4f (uniform %.3f, floor %.3f) steps=%d "
                "skipped=%d\n",
                first_loss, last_loss, std::log(double(o.vocab)), floor, o.steps,
                skipped_steps);
    std::printf("summary: tokens/s mean %.0f median %.0f (steps 2..%d, %.0f tokens per step over "
                "%d ranks)\n",
                tps_mean, tps_median, std::max(o.steps, 2), tokens_per_step, world_size);
    std::printf("summary: params=%lld  shard dimension %d  unit max %s unsharded\n",
                (long long)params, shard_n, mib(unit).c_str());
    std::printf("summary: persistent per rank %s (params+grads %s, optimizer %s) vs ZeRO-3 bound "
                "16 B x %lld / %d + one unit = %s: ratio %.3f (%.3f to 16 B/param/N alone)\n",
                mib(mem[2]).c_str(), mib(mem[0]).c_str(), mib(mem[1]).c_str(), (long long)params,
                shard_n, mib(bound).c_str(), mem[2] / bound, mem[2] / sharded);
    std::printf("summary: peak per rank %s (live between steps %s): ratio %.3f to the bound "
                "(activations and workspaces are outside it)\n",
                mib(peak_max).c_str(), mib(mem[3]).c_str(), peak_max / bound);
    std::printf("summary: wall %s for %d steps\n",
                duration_text(std::chrono::duration<double>(Clock::now() - run_start).count()).c_str(),
                o.steps - first_step);
    if (!o.save_dir.empty()) {
      std::printf("summary: checkpoints in %s (newest %s)\n", o.save_dir.c_str(),
                  kshard::checkpoint_path(o.save_dir, last_saved).string().c_str());
      // Async: blocked (snapshot, commit, waits) beside the background write
      // time shows how much of the saving training no longer waits for.
      std::printf("summary: checkpoint: %d saves (%s), blocked %.3f s, %s %.3f s\n", saves_done,
                  o.async_save ? "async" : "sync", save_blocked,
                  o.async_save ? "background write" : "write (within blocked)", save_write);
    }
    if (!o.export_path.empty())
      std::printf("summary: weights exported to %s (%s)\n", o.export_path.c_str(),
                  o.export_dtype.c_str());
    if (o.bench) {
      std::ostringstream j;
      j.precision(10);
      j << "BENCH {\"ranks\": " << world_size << ", \"mesh\": \"" << shape_text(o.mesh)
        << "\", \"recipe\": \"" << model.recipe().describe() << "\", \"params\": " << params
        << ", \"shard_size\": " << shard_n << ", \"steps\": " << o.steps
        << ", \"tokens_per_step\": " << tokens_per_step << ", \"tokens_per_s\": " << tps_mean
        << ", \"tokens_per_s_median\": " << tps_median
        << ", \"persistent_bytes\": " << mem[0] << ", \"optimizer_bytes\": " << mem[1]
        << ", \"state_bytes\": " << mem[2] << ", \"peak_bytes\": " << peak_max
        << ", \"live_between_steps_bytes\": " << mem[3]
        << ", \"max_unit_bytes\": " << unit << ", \"bound_bytes\": " << bound
        << ", \"first_loss\": " << first_loss << ", \"last_loss\": " << last_loss << "}";
      std::printf("%s\n", j.str().c_str());
    }
    std::fflush(stdout);
  }
  sample();
  return 0;
}

void report(int rank, const char* what) {
  std::fprintf(stderr, "[rank %d] kshard-train: error: %s\n", rank, what);
  std::fflush(stderr);
}

}  // namespace

int main(int argc, char** argv) {
  std::unique_ptr<kshard::Session> session;
  try {
    session = std::make_unique<kshard::Session>(argc, argv);
  } catch (const std::exception& e) {
    // E.g. an unknown KSHARD_BACKEND: the same on every rank, so every rank
    // gets here, and Session has undone what it set up (MPI included).
    report(kshard::error_rank(), e.what());
    return 2;
  }
  const int rank = session->rank();
  int rc = 0;
  try {
    rc = run(*session, argc, argv);
  } catch (const kshard_train::OptionError& e) {
    report(rank, e.what());
    rc = 2;
  } catch (const kshard::TrainingDiverged& e) {
    report(rank, e.what());
    rc = 3;
  } catch (const kshard::Error& e) {
    report(rank, e.what());
    rc = 2;
  } catch (const std::exception& e) {
    report(rank, e.what());
    rc = 1;
  }
  // Every rank leaves with the same code; a rank that failed alone aborts
  // the job rather than leave the others waiting in a collective.
  rc = session->agreed_exit_code(rc);
  session.reset();
  return rc;
}
