#include "train_options.hpp"

#include <cctype>
#include <cmath>
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
      "LayerNorm -> Linear head) with fully sharded data parallelism on a built-in\n"
      "synthetic next-token language (a fixed random Markov chain).\n\n"
      "Usage: mpiexec -n N kshard-train [options]\n\nOptions");
  // clang-format off
  desc.add_options()
    ("help,h", "print this help and exit")
    ("mesh", po::value<std::string>(&mesh),
     "device mesh: N (1-D, FSDP) or RxS (HSDP: replicate x shard); product = world size "
     "(default: 1-D over all ranks)")
    ("recipe", po::value<std::string>(&o.recipe)->default_value(o.recipe),
     "mixed precision: fp32, bf16, fp16 (dynamic loss scaling) or fp8; sets the compute dtype "
     "(f32, bf16, f16, bf16)")
    ("tf32", po::bool_switch(&o.tf32), "let f32 GEMMs use TF32 tensor cores (CUDA; off by default)")
    ("keep-low-precision-shard", po::bool_switch(&o.keep_lp_shard),
     "bf16/fp16: keep a 16-bit copy of each shard, written by the optimizer (2 B/param more, "
     "no cast per all-gather)")
    ("attention", po::value<std::string>(&o.attention)->default_value(o.attention),
     "attention core: auto (fused; recompute for f32 on CUDA), fused (online softmax, no "
     "[B,H,T,T] buffer), unfused (the reference: probabilities kept for backward) or recompute "
     "(unfused kernels, probabilities computed again in backward)")
    ("fp8-init", po::bool_switch(&o.fp8_init), "keep the sharded parameters in fp8 (fp8 recipe only)")
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
    ("seed", po::value<std::string>(&seed)->default_value(seed), "seed of the parameters and the data")
    ("no-reshard-after-forward", po::bool_switch(&no_reshard),
     "keep each unit's full parameters from forward until its backward (ZeRO-2 style)")
    ("bench", po::bool_switch(&o.bench), "also print a machine-readable BENCH {json} line");
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
  o.seed = parse_seed(seed);
  check_range("layers", o.layers, 1, 4096);
  check_range("width", o.width, 1, 1 << 16);
  check_range("heads", o.heads, 1, 1 << 16);
  // Token ids travel as float through the Embedding: exact up to 2^24.
  check_range("vocab", o.vocab, 2, 1 << 24);
  check_range("seq", o.seq, 1, 1 << 16);
  check_range("batch", o.batch, 1, 1 << 20);
  check_range("steps", o.steps, 1, 100000000);
  check_range("accum", o.accum, 1, 1 << 20);
  if (o.width % o.heads != 0)
    throw OptionError("--width " + std::to_string(o.width) + " is not divisible by --heads " +
                      std::to_string(o.heads) +
                      "; expected a width that is a multiple of the number of heads");
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
  if (o.recipe != "fp32" && o.recipe != "bf16" && o.recipe != "fp16" && o.recipe != "fp8")
    throw OptionError("--recipe '" + o.recipe + "' is unknown; expected one of fp32, bf16, fp16, fp8");
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
