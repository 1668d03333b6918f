#include "train_options.hpp"

#include "kshard/checkpoint/hf_config.hpp"

#include <cctype>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <sstream>

#include <boost/program_options.hpp>

namespace po = boost::program_options;

namespace kshard_train {
namespace {

std::string mesh_text(const std::vector<int>& shape) {
  std::string s;
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? "x" : "") + std::to_string(shape[i]);
  return s;
}

void check_range(const char* name, long long value, long long lo, long long hi) {
  if (value < lo || value > hi) {
    std::ostringstream m;
    m << "--" << name << " " << value << " is out of range; expected an integer in [" << lo
      << ", " << hi << "]";
    throw OptionError(m.str());
  }
}

std::uint64_t parse_seed(const std::string& s) {
  bool digits = !s.empty() && s.size() <= 19;
  for (char c : s) digits = digits && std::isdigit(static_cast<unsigned char>(c));
  if (!digits)
    throw OptionError("--seed '" + s + "' is not valid; expected a non-negative integer");
  return std::stoull(s);
}

}  // namespace

std::vector<int> parse_mesh(const std::string& text) {
  std::vector<int> shape;
  std::string cur;
  auto bad = [&]() {
    return OptionError("--mesh '" + text +
                       "' is not a mesh; expected N (1-D) or RxS (replicate x shard), "
                       "positive integers, e.g. 4 or 2x2");
  };
  for (std::size_t i = 0; i <= text.size(); ++i) {
    if (i == text.size() || text[i] == 'x' || text[i] == 'X') {
      if (cur.empty() || cur.size() > 6) throw bad();
      shape.push_back(std::stoi(cur));
      cur.clear();
    } else if (std::isdigit(static_cast<unsigned char>(text[i]))) {
      cur += text[i];
    } else {
      throw bad();
    }
  }
  if (shape.empty() || shape.size() > 2) throw bad();
  for (int d : shape)
    if (d < 1) throw bad();
  return shape;
}

ParsedOptions parse_options(int argc, char** argv, int world_size) {
  ParsedOptions out;
  TrainOptions& o = out.options;
  std::string mesh, seed = std::to_string(o.seed);
  bool no_reshard = false;

  po::options_description desc(
      "kshard-train: trains a small GPT-style model (Embedding -> L x TransformerLayer ->\n"
      "LayerNorm -> Linear head) with fully sharded data parallelism, on a file of token\n"
      "ids (--data) or on a built-in synthetic next-token language (a fixed random\n"
      "Markov chain, the default).\n\n"
      "Data (--data, --val-data): flat files of little-endian token ids, uint16 by default\n"
      "(nanoGPT's train.bin / val.bin) or uint32 (--data-dtype); every id < --vocab.\n"
      "Training sequence g of the run is the window of seq+1 tokens at offset\n"
      "splitmix64(seed, g) mod (tokens - seq): inputs its first seq tokens, targets the\n"
      "next token of each. Step s (0-based) of a run with W ranks uses sequences\n"
      "s*accum*W*batch ... + accum*W*batch - 1, rank r micro-batch m the batch starting at\n"
      "s*accum*W*batch + (m*W + r)*batch: the same global batch for any world size.\n\n"
      "Evaluation (--val-data with --eval-every N or --eval-only): the mean cross-entropy\n"
      "over the first K*batch windows of the file (K = --eval-batches), window j being\n"
      "tokens [j*seq, j*seq+seq] (inputs its first seq tokens, targets the next token of\n"
      "each), split over the ranks; the same number for any world size or mesh (up to\n"
      "the order of a double sum). Printed on rank 0 as one line: eval_loss <value>.\n\n"
      "LR schedule (step s = 0, 1, ..., T = --steps, W = --warmup): s < W: lr*(s+1)/(W+1);\n"
      "then constant lr, or linear / cosine decay from lr to --min-lr reached at step T-1.\n\n"
      "Checkpoints (--save-dir DIR): DIR/step-<N>, sharded (every rank writes its part; any\n"
      "world size or mesh loads them), saved every --save-every steps and after the last.\n"
      "--resume PATH continues from a step-N checkpoint or from the newest one of a save\n"
      "directory (same data stream and LR schedule; --steps is the run's total).\n"
      "--async-save writes them on a background thread while training goes on; the\n"
      "summary says how long saves blocked training. --init-from takes the weights only (a step-N directory or a\n"
      "safetensors file); --export writes the final weights as one safetensors file.\n\n"
      "Usage: mpiexec -n N kshard-train [options]\n\nOptions");
  std::string data_dtype = o.data_dtype;
  std::string prompt_text, prompt_ids;
  // clang-format off
  desc.add_options()
    ("help,h", "print this help and exit")
    ("mesh", po::value<std::string>(&mesh),
     "device mesh: N (1-D, FSDP) or RxS (HSDP: replicate x shard); product = world size "
     "(default: 1-D over all ranks)")
    ("recipe", po::value<std::string>(&o.recipe)->default_value(o.recipe),
     "mixed precision: fp32, bf16, fp16 (dynamic loss scaling), fp8 (fp8 all-gather, bf16 "
     "compute), fp8-current or fp8-delayed (bf16 all-gather, Linear GEMMs on fp8 tensor cores "
     "with per-tensor current or delayed scaling; GPUs of compute capability 8.9+), fp8-block "
     "(the same with 1x128 / 128x128 block scales; Hopper, Linears of multiples of 128)")
    ("fp8-amax-history", po::value<int>(&o.fp8_amax_history)->default_value(o.fp8_amax_history),
     "fp8-delayed: steps of amax history a scale is taken from")
    ("fp8-amax-algo", po::value<std::string>(&o.fp8_amax_algo)->default_value(o.fp8_amax_algo),
     "fp8-delayed: max (the largest amax of the history) or most_recent")
    ("sample", po::value<int>(&o.sample)->default_value(o.sample),
     "after training (or --eval-only), generate N tokens from --prompt / --prompt-ids and "
     "print them (no KV cache: each token runs the forward over the last --seq tokens)")
    ("prompt", po::value<std::string>(&prompt_text),
     "--sample's prompt as text, one token per byte (a byte-level vocabulary, --vocab >= the "
     "largest byte + 1); the continuation is printed as text too")
    ("prompt-ids", po::value<std::string>(&prompt_ids),
     "--sample's prompt as comma-separated token ids (default: 0)")
    ("temperature", po::value<double>(&o.temperature)->default_value(o.temperature, "0"),
     "--sample: softmax temperature (0: greedy, the most likely token)")
    ("top-k", po::value<int>(&o.top_k)->default_value(o.top_k),
     "--sample: draw among the k most likely tokens only (0: all)")
    ("tf32", po::bool_switch(&o.tf32), "let f32 GEMMs use TF32 tensor cores (CUDA; off by default)")
    ("keep-low-precision-shard", po::bool_switch(&o.keep_lp_shard),
     "bf16/fp16: keep a 16-bit copy of each shard, written by the optimizer (2 B/param more, "
     "no cast per all-gather)")
    ("attention", po::value<std::string>(&o.attention)->default_value(o.attention),
     "attention core: auto (fused where a fused kernel serves the shape, else recompute), fused (online softmax, no "
     "[B,H,T,T] buffer), unfused (the reference: probabilities kept for backward) or recompute "
     "(unfused kernels, probabilities computed again in backward)")
    ("fp8-init", po::bool_switch(&o.fp8_init), "keep the sharded parameters in fp8 (fp8 recipe only)")
    ("arch", po::value<std::string>(&o.arch)->default_value(o.arch),
     "block shape: gpt2 (LayerNorm, GELU MLP, learned positions, biases) or llama (RMSNorm, "
     "SwiGLU MLP, rotary embeddings, grouped-query attention, no biases)")
    ("kv-heads", po::value<int>(&o.kv_heads)->default_value(o.kv_heads),
     "llama: key/value heads, dividing --heads (0: as many as --heads)")
    ("ffn-hidden", po::value<int>(&o.ffn_hidden)->default_value(o.ffn_hidden),
     "MLP hidden width (0: 4 x width for gpt2; for llama 8 x width / 3 rounded up to a "
     "multiple of 256, Llama's rule)")
    ("tie-embeddings", po::bool_switch(&o.tie_embeddings),
     "one parameter for the token embedding and the LM head (the head has no bias then; "
     "Hugging Face's tie_word_embeddings)")
    ("rope-theta", po::value<double>(&o.rope_theta)->default_value(o.rope_theta, "10000"),
     "llama: base of the rotary embeddings' angles")
    ("norm-eps", po::value<double>(&o.norm_eps)->default_value(o.norm_eps, "1e-5"),
     "epsilon of the LayerNorms (gpt2) / RMSNorms (llama)")
    ("layers", po::value<int>(&o.layers)->default_value(o.layers), "transformer layers")
    ("width", po::value<int>(&o.width)->default_value(o.width), "model width d (MLP hidden 4d)")
    ("heads", po::value<int>(&o.heads)->default_value(o.heads), "attention heads (must divide width)")
    ("vocab", po::value<int>(&o.vocab)->default_value(o.vocab), "vocabulary size")
    ("seq", po::value<int>(&o.seq)->default_value(o.seq), "sequence length")
    ("batch", po::value<int>(&o.batch)->default_value(o.batch), "sequences per rank per micro-batch")
    ("steps", po::value<int>(&o.steps)->default_value(o.steps), "optimizer steps")
    ("accum", po::value<int>(&o.accum)->default_value(o.accum), "micro-batches per step (gradient accumulation)")
    ("lr", po::value<double>(&o.lr)->default_value(o.lr, "3e-3"), "AdamW learning rate")
    ("clip", po::value<double>(&o.clip)->default_value(o.clip), "max global gradient norm (0: no clipping)")
    ("weight-decay", po::value<double>(&o.weight_decay)->default_value(o.weight_decay),
     "AdamW decoupled weight decay")
    ("lr-schedule", po::value<std::string>(&o.lr_schedule)->default_value(o.lr_schedule),
     "learning-rate schedule after the warmup: constant, linear or cosine (decay to --min-lr at "
     "the last step)")
    ("warmup", po::value<int>(&o.warmup)->default_value(o.warmup),
     "linear warmup steps: lr*(s+1)/(warmup+1) at step s < warmup")
    ("min-lr", po::value<double>(&o.min_lr)->default_value(o.min_lr),
     "learning rate at the last step of a linear or cosine schedule")
    ("max-skipped", po::value<int>(&o.max_skipped)->default_value(o.max_skipped),
     "this many optimizer steps skipped in a row (inf/NaN gradients) end the run with an "
     "error (exit 3); 0: never")
    ("data", po::value<std::string>(&o.data),
     "training data: a flat file of little-endian token ids (default: the Markov task)")
    ("data-dtype", po::value<std::string>(&data_dtype)->default_value(data_dtype),
     "token id type of --data and --val-data: uint16 or uint32")
    ("val-data", po::value<std::string>(&o.val_data), "evaluation data (same format as --data)")
    ("eval-every", po::value<int>(&o.eval_every)->default_value(o.eval_every),
     "evaluate on --val-data every N steps and after the last one (0: never)")
    ("eval-batches", po::value<int>(&o.eval_batches)->default_value(o.eval_batches),
     "K: the evaluation covers the first K x --batch windows of --val-data")
    ("eval-only", po::bool_switch(&o.eval_only),
     "evaluate the model (initialised, --init-from or --resume) on --val-data, print "
     "eval_loss and exit")
    ("save-dir", po::value<std::string>(&o.save_dir),
     "save checkpoints in DIR/step-<N> (every --save-every steps and after the last step)")
    ("save-every", po::value<int>(&o.save_every)->default_value(o.save_every),
     "also save every N steps (0: only after the last step); needs --save-dir")
    ("keep", po::value<int>(&o.keep)->default_value(o.keep),
     "keep only the newest K checkpoints of --save-dir (0: all)")
    ("async-save", po::bool_switch(&o.async_save),
     "save asynchronously: training stops only while the state is copied to host memory, a "
     "background thread writes the files, and the checkpoint is committed at a later step "
     "(and before exit); needs --save-dir")
    ("resume", po::value<std::string>(&o.resume),
     "continue a run from PATH: a step-N checkpoint directory, or a save directory (its "
     "newest complete checkpoint; none yet: start fresh, with a note, so the same command "
     "restarts a job); --steps stays the run's total. With --eval-only: evaluate it and exit")
    ("init-from", po::value<std::string>(&o.init_from),
     "start from these weights only (no optimizer state, step 0): a checkpoint's step-N "
     "directory, a .safetensors file, or a Hugging Face model directory (config.json + "
     "model.safetensors, as --export-hf or transformers' save_pretrained write them; --arch "
     "and the size flags left out come from its config.json, those given must match it)")
    ("export", po::value<std::string>(&o.export_path),
     "after the last step, write the model as one safetensors file FILE")
    ("export-hf", po::value<std::string>(&o.export_hf),
     "export the final model in Hugging Face's format into DIR (config.json + "
     "model.safetensors: LlamaForCausalLM for --arch llama, GPT2LMHeadModel for --arch gpt2 "
     "with --tie-embeddings)")
    ("export-dtype", po::value<std::string>(&o.export_dtype)->default_value(o.export_dtype),
     "dtype of --export: f32 or bf16")
    ("seed", po::value<std::string>(&seed)->default_value(seed), "seed of the parameters and the data")
    ("no-reshard-after-forward", po::bool_switch(&no_reshard),
     "keep each unit's full parameters from forward until its backward (ZeRO-2 style)")
    ("loss-chunk-mib", po::value<int>(&o.loss_chunk_mib)->default_value(o.loss_chunk_mib),
     "run the LM head and the loss in row chunks of at most N MiB of logits, never keeping all "
     "of them (0: keep the whole logits)")
    ("bench", po::bool_switch(&o.bench), "also print a machine-readable BENCH {json} line")
    ("profile-step", po::value<int>(&o.profile_step)->default_value(o.profile_step),
     "profile step N alone (as printed, 1-based; 0: none): on CUDA the step is wrapped in "
     "cudaProfilerStart/Stop for `ncu --profile-from-start off` or `nsys profile "
     "--capture-range cudaProfilerApi`");
  // clang-format on

  po::variables_map vm;
  try {
    // No positional arguments: a stray word is an error, not silently ignored.
    po::store(po::command_line_parser(argc, argv)
                  .options(desc)
                  .positional(po::positional_options_description())
                  .run(),
              vm);
    po::notify(vm);
  } catch (const po::error& e) {
    throw OptionError(std::string(e.what()) + "; see --help");
  }
  if (vm.count("help")) {
    std::ostringstream h;
    h << desc;
    out.help = true;
    out.help_text = h.str();
    return out;
  }

  o.reshard_after_forward = !no_reshard;
  o.data_dtype = data_dtype;
  o.seed = parse_seed(seed);
  // --init-from a Hugging Face folder: the model's shape flags left out of
  // the command line come from its config.json, so fine-tuning a local model
  // needs only --init-from; flags given must agree (import_hf names the
  // field that does not). A config kshard cannot build is a kshard::Error.
  if (!o.init_from.empty() && std::filesystem::exists(std::filesystem::path(o.init_from) / "config.json")) {
    const kshard::HfConfig c = kshard::read_hf_config(o.init_from);
    const auto from_config = [&](const char* flag, auto& field, auto value) {
      if (vm[flag].defaulted()) field = static_cast<std::decay_t<decltype(field)>>(value);
    };
    from_config("arch", o.arch, c.model_type);
    from_config("vocab", o.vocab, c.vocab);
    from_config("width", o.width, c.hidden);
    from_config("layers", o.layers, c.layers);
    from_config("heads", o.heads, c.heads);
    from_config("ffn-hidden", o.ffn_hidden, c.intermediate);
    from_config("norm-eps", o.norm_eps, c.norm_eps);
    if (c.model_type == "llama" && o.arch == "llama") {  // not into an explicit --arch gpt2
      from_config("kv-heads", o.kv_heads, c.kv_heads);
      from_config("rope-theta", o.rope_theta, c.rope_theta);
    }
    from_config("tie-embeddings", o.tie_embeddings, c.tie_word_embeddings);
  }
  check_range("layers", o.layers, 1, 4096);
  check_range("width", o.width, 1, 1 << 16);
  check_range("heads", o.heads, 1, 1 << 16);
  // Token ids are int32 end to end; 2^24 is a sanity bound (the embedding
  // and the head are vocab x width each).
  check_range("vocab", o.vocab, 2, 1 << 24);
  check_range("seq", o.seq, 1, 1 << 16);
  check_range("loss-chunk-mib", o.loss_chunk_mib, 0, 1 << 20);
  check_range("batch", o.batch, 1, 1 << 20);
  check_range("steps", o.steps, 1, 100000000);
  check_range("accum", o.accum, 1, 1 << 20);
  if (o.arch != "gpt2" && o.arch != "llama")
    throw OptionError("--arch '" + o.arch + "' is not a block shape; expected gpt2 or llama");
  check_range("kv-heads", o.kv_heads, 0, 1 << 16);
  check_range("ffn-hidden", o.ffn_hidden, 0, 1 << 20);
  if (o.arch == "gpt2" && o.kv_heads != 0)
    throw OptionError("--kv-heads " + std::to_string(o.kv_heads) +
                      " with --arch gpt2; expected --arch llama (gpt2 attention has no "
                      "shared key/value heads)");
  if (o.kv_heads != 0 && o.heads % o.kv_heads != 0)
    throw OptionError("--kv-heads " + std::to_string(o.kv_heads) + " does not divide --heads " +
                      std::to_string(o.heads) + "; expected a divisor of --heads");
  if (!(o.rope_theta > 1.0) || !std::isfinite(o.rope_theta))
    throw OptionError("--rope-theta " + std::to_string(o.rope_theta) +
                      "; expected a finite base > 1");
  if (!(o.norm_eps > 0.0) || !std::isfinite(o.norm_eps))
    throw OptionError("--norm-eps " + std::to_string(o.norm_eps) + "; expected a finite eps > 0");
  if (o.width % o.heads != 0)
    throw OptionError("--width " + std::to_string(o.width) + " is not divisible by --heads " +
                      std::to_string(o.heads) +
                      "; expected a width that is a multiple of the number of heads");
  if (o.arch == "llama" && (o.width / o.heads) % 2 != 0)
    throw OptionError("--width / --heads = " + std::to_string(o.width / o.heads) +
                      " is odd; expected an even head dim (rotary embeddings rotate pairs)");
  const double rows = double(o.batch) * o.seq;
  if (rows * std::max<double>(o.vocab, 4.0 * o.width) > double(1LL << 31) ||
      rows * o.seq * o.heads > double(1LL << 31))
    throw OptionError("--batch x --seq x max(--vocab, 4 x --width) (or the attention scores) "
                      "exceed 2^31 elements per micro-batch; expected a smaller run");
  if (!(std::isfinite(o.lr) && o.lr > 0))
    throw OptionError("--lr " + std::to_string(o.lr) + " is not valid; expected a positive number");
  if (!(std::isfinite(o.clip) && o.clip >= 0))
    throw OptionError("--clip " + std::to_string(o.clip) +
                      " is not valid; expected a non-negative number (0: no clipping)");
  if (!(std::isfinite(o.weight_decay) && o.weight_decay >= 0))
    throw OptionError("--weight-decay " + std::to_string(o.weight_decay) +
                      " is not valid; expected a non-negative number");
  if (o.lr_schedule != "constant" && o.lr_schedule != "linear" && o.lr_schedule != "cosine")
    throw OptionError("--lr-schedule '" + o.lr_schedule +
                      "' is unknown; expected constant, linear or cosine");
  check_range("warmup", o.warmup, 0, 100000000);
  if (!(std::isfinite(o.min_lr) && o.min_lr >= 0 && o.min_lr <= o.lr))
    throw OptionError("--min-lr " + std::to_string(o.min_lr) +
                      " is not valid; expected a number in [0, --lr]");
  check_range("max-skipped", o.max_skipped, 0, 100000000);
  if (o.data_dtype != "uint16" && o.data_dtype != "uint32")
    throw OptionError("--data-dtype '" + o.data_dtype + "' is unknown; expected uint16 or uint32");
  check_range("eval-every", o.eval_every, 0, 100000000);
  check_range("profile-step", o.profile_step, 0, o.steps);
  check_range("eval-batches", o.eval_batches, 1, 1 << 20);
  if ((o.eval_every > 0 || (o.eval_only && o.sample == 0)) && o.val_data.empty())
    throw OptionError(std::string(o.eval_only ? "--eval-only" : "--eval-every") +
                      " without --val-data; expected --val-data PATH to evaluate on");
  check_range("save-every", o.save_every, 0, 100000000);
  check_range("keep", o.keep, 0, 1000000);
  if (o.save_dir.empty()) {
    const char* needs = !vm["save-every"].defaulted() ? "--save-every"
                        : !vm["keep"].defaulted()       ? "--keep"
                        : o.async_save                  ? "--async-save"
                                                        : nullptr;
    if (needs)
      throw OptionError(std::string(needs) +
                        " without --save-dir; expected --save-dir DIR, the checkpoint directory");
  }
  if (vm.count("resume") && o.resume.empty())
    throw OptionError("--resume ''; expected a step-N checkpoint directory or a save directory");
  if (!o.resume.empty() && !o.init_from.empty())
    throw OptionError("--init-from with --resume; expected one of them: --resume continues a "
                      "run from its checkpoint, --init-from starts a new run from weights");
  if (vm.count("init-from") && o.init_from.empty())
    throw OptionError("--init-from ''; expected a checkpoint's step-N directory, a "
                      ".safetensors file or a Hugging Face model directory");
  if (vm.count("save-dir") && o.save_dir.empty())
    throw OptionError("--save-dir ''; expected a directory");
  if (vm.count("export") && o.export_path.empty())
    throw OptionError("--export ''; expected a file name");
  if (o.export_dtype != "f32" && o.export_dtype != "bf16")
    throw OptionError("--export-dtype '" + o.export_dtype + "' is unknown; expected f32 or bf16");
  if (o.export_path.empty() && o.export_hf.empty() && !vm["export-dtype"].defaulted())
    throw OptionError("--export-dtype without --export; expected --export FILE or --export-hf DIR");
  if (vm.count("export-hf") && o.export_hf.empty())
    throw OptionError("--export-hf ''; expected a directory");
  if (!o.export_hf.empty() && o.arch == "gpt2" && !o.tie_embeddings)
    throw OptionError("--export-hf with --arch gpt2 but no --tie-embeddings; expected "
                      "--tie-embeddings (GPT2LMHeadModel's head is the token table)");
  if (o.eval_only && !o.export_hf.empty())
    throw OptionError("--export-hf with --eval-only; expected --eval-only alone (it trains "
                      "nothing, so it exports nothing)");
  if (o.eval_only && (!o.save_dir.empty() || !o.export_path.empty()))
    throw OptionError(std::string(o.save_dir.empty() ? "--export" : "--save-dir") +
                      " with --eval-only; expected --eval-only alone (it trains nothing, so it "
                      "saves nothing: evaluate a checkpoint with --init-from)");
  check_range("sample", o.sample, 0, 1 << 20);
  check_range("top-k", o.top_k, 0, 1 << 24);
  if (!(std::isfinite(o.temperature) && o.temperature >= 0))
    throw OptionError("--temperature " + std::to_string(o.temperature) +
                      " is not valid; expected a number >= 0 (0: greedy)");
  if (o.sample == 0)
    for (const char* opt : {"prompt", "prompt-ids", "temperature", "top-k"})
      if (vm.count(opt) && !vm[opt].defaulted())
        throw OptionError(std::string("--") + opt + " without --sample; expected --sample N");
  if (vm.count("prompt") && vm.count("prompt-ids"))
    throw OptionError("--prompt with --prompt-ids; expected one of them");
  o.prompt_is_text = vm.count("prompt") > 0;
  if (o.prompt_is_text) {
    for (unsigned char c : prompt_text) {
      if (int(c) >= o.vocab)
        throw OptionError("--prompt has the byte " + std::to_string(int(c)) + ", not below --vocab " +
                          std::to_string(o.vocab) +
                          "; expected a byte-level vocabulary (--vocab 256) for text prompts");
      o.prompt.push_back(std::int32_t(c));
    }
  } else if (vm.count("prompt-ids")) {
    std::string item;
    for (std::size_t i = 0; i <= prompt_ids.size(); ++i) {
      if (i < prompt_ids.size() && prompt_ids[i] != ',') {
        item += prompt_ids[i];
        continue;
      }
      char* end = nullptr;
      const long v = item.empty() ? -1 : std::strtol(item.c_str(), &end, 10);
      if (item.empty() || *end != '\0' || v < 0 || v >= o.vocab)
        throw OptionError("--prompt-ids '" + prompt_ids + "' has '" + item +
                          "'; expected comma-separated token ids in [0, --vocab " +
                          std::to_string(o.vocab) + ")");
      o.prompt.push_back(std::int32_t(v));
      item.clear();
    }
  } else {
    o.prompt = {0};
  }
  if (o.prompt.empty())
    throw OptionError("--prompt ''; expected at least one byte");
  if (o.recipe != "fp32" && o.recipe != "bf16" && o.recipe != "fp16" && o.recipe != "fp8" &&
      o.recipe != "fp8-current" && o.recipe != "fp8-delayed" && o.recipe != "fp8-block")
    throw OptionError("--recipe '" + o.recipe +
                      "' is unknown; expected one of fp32, bf16, fp16, fp8, fp8-current, "
                      "fp8-delayed, fp8-block");
  // fp8-block's GEMMs take whole 128-blocks: a Linear of other sizes would
  // quietly run in bf16, so the whole run would not be what was asked for.
  if (o.recipe == "fp8-block" &&
      (o.width % 128 != 0 || (std::int64_t(o.batch) * o.seq) % 128 != 0))
    throw OptionError("--recipe fp8-block with --width " + std::to_string(o.width) +
                      " and --batch x --seq = " + std::to_string(std::int64_t(o.batch) * o.seq) +
                      "; expected both multiples of 128 (fp8-block's 128-element blocks)");
  if (o.fp8_amax_algo != "max" && o.fp8_amax_algo != "most_recent")
    throw OptionError("--fp8-amax-algo '" + o.fp8_amax_algo + "' is unknown; expected max or "
                      "most_recent");
  if (o.fp8_amax_history < 1)
    throw OptionError("--fp8-amax-history " + std::to_string(o.fp8_amax_history) +
                      "; expected a length >= 1");
  if (o.recipe != "fp8-delayed" &&
      (!vm["fp8-amax-history"].defaulted() || !vm["fp8-amax-algo"].defaulted()))
    throw OptionError("--fp8-amax-history/--fp8-amax-algo with --recipe " + o.recipe +
                      "; expected them only with --recipe fp8-delayed");
  if (o.attention != "auto" && o.attention != "fused" && o.attention != "unfused" &&
      o.attention != "recompute")
    throw OptionError("--attention '" + o.attention +
                      "' is unknown; expected auto, fused, unfused or recompute");
  if (o.fp8_init && o.recipe != "fp8")
    throw OptionError("--fp8-init with --recipe " + o.recipe +
                      "; expected --fp8-init only with --recipe fp8");

  o.mesh = mesh.empty() ? std::vector<int>{world_size} : parse_mesh(mesh);
  long long product = 1;
  for (int d : o.mesh) product *= d;
  if (product != world_size)
    throw OptionError("--mesh " + mesh_text(o.mesh) + " has " + std::to_string(product) +
                      " ranks but the world has " + std::to_string(world_size) +
                      "; expected a mesh whose product is the world size");
  return out;
}

}  // namespace kshard_train
