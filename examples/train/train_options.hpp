#pragma once
// TrainOptions: kshard-train's command line (Boost.Program_options) and its
// validation.
//
//   kshard_train::ParsedOptions p = kshard_train::parse_options(argc, argv, world_size);
//   if (p.help) { print p.help_text on rank 0; exit 0 }
//   // p.options is valid; or parse_options threw OptionError
//
// Parsing and validation are local and deterministic: every rank sees the
// same argv and the same world size, so every rank reaches the same verdict
// without communicating. That is what lets a bad option end every rank with
// the same message and exit code before any collective could hang.
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace kshard_train {

/// A bad command line; what() names the option and what was expected.
class OptionError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct TrainOptions {
  std::vector<int> mesh;  ///< resolved shape: [N] or [replicate, shard]
  std::string recipe = "fp32";
  bool fp8_init = false;
  int fp8_amax_history = 1024;
  std::string fp8_amax_algo = "max";
  bool tf32 = false;
  bool keep_lp_shard = false;
  std::string attention = "auto";
  std::string arch = "gpt2";  ///< gpt2 (LayerNorm, GELU MLP, learned positions, biases) or llama
  int kv_heads = 0;           ///< llama: key/value heads (0: --heads)
  bool tie_embeddings = false;  ///< the LM head's weight is the embedding table
  int ffn_hidden = 0;         ///< MLP hidden width (0: 4 d for gpt2, Llama's 8d/3 rounded up to 256)
  double rope_theta = 10000.0;
  double norm_eps = 1e-5;
  int layers = 2;
  int width = 64;
  int heads = 4;
  int vocab = 64;
  int seq = 32;
  int batch = 8;  ///< sequences per rank per micro-batch
  int steps = 40;
  int accum = 1;  ///< micro-batches per optimizer step
  double lr = 3e-3;  ///< peak learning rate of the schedule
  double clip = 1.0;  ///< max global grad norm, 0 = off
  double weight_decay = 0.0;  ///< AdamW's decoupled weight decay
  std::string lr_schedule = "constant";  ///< constant | linear | cosine
  int warmup = 0;        ///< linear warmup steps
  double min_lr = 0.0;   ///< end of the linear / cosine decay
  int max_skipped = 20;  ///< divergence guard: skipped steps in a row (0: off)
  // Data: a token file (nanoGPT's train.bin convention) or the Markov task.
  std::string data;                    ///< empty: the built-in Markov task
  std::string data_dtype = "uint16";   ///< uint16 | uint32
  std::string val_data;                ///< evaluation file (same dtype)
  int eval_every = 0;                  ///< evaluate every N steps and at the end (0: never)
  int eval_batches = 8;                ///< K: evaluation over K x batch windows
  bool eval_only = false;              ///< evaluate the initial model and exit
  // Checkpoints (kshard::Trainer::save / resume, kshard::checkpoint).
  std::string save_dir;       ///< save checkpoints here (empty: never)
  int save_every = 0;         ///< also every N steps (0: only after the last step)
  int keep = 0;               ///< keep the newest K checkpoints (0: all)
  bool async_save = false;    ///< write checkpoints on a background thread (Trainer::save_async)
  std::string resume;         ///< a step-N checkpoint, or a save dir (its newest checkpoint)
  std::string init_from;      ///< weights only: a step-N directory or a .safetensors file
  std::string export_path;    ///< export the final model as safetensors (empty: no)
  std::string export_hf;      ///< export in Hugging Face's format into this directory (empty: no)
  std::string export_dtype = "f32";  ///< f32 | bf16 (--export and --export-hf)
  std::uint64_t seed = 1234;
  bool reshard_after_forward = true;
  /// MiB of logits per chunk of the LM head + loss (FsdpOptions::loss_chunk_bytes; 0: keep all)
  int loss_chunk_mib = 256;
  // Sampling after training (kshard::generate): --sample N new tokens from
  // --prompt (bytes as token ids) or --prompt-ids (default: token 0).
  int sample = 0;
  std::vector<std::int32_t> prompt;
  bool prompt_is_text = false;  ///< --prompt: print the continuation as text too
  double temperature = 0.0;     ///< 0: greedy
  int top_k = 0;                ///< 0: every token
  bool bench = false;  ///< also print one machine-readable "BENCH {json}" line
  int profile_step = 0;  ///< open a device profiler's window around this step (1-based; 0: none)
};

struct ParsedOptions {
  bool help = false;
  std::string help_text;
  TrainOptions options;
};

/// Throws OptionError for anything that is not a valid run on world_size ranks.
ParsedOptions parse_options(int argc, char** argv, int world_size);

/// "2x2" -> {2, 2}; "4" -> {4}. Throws OptionError.
std::vector<int> parse_mesh(const std::string& text);

}  // namespace kshard_train
