#include "kshard/checkpoint/hf_import.hpp"

#include <cmath>
#include <fstream>
#include <map>
#include <set>

#include <nlohmann/json.hpp>

#include "file_io.hpp"
#include "hf_layout.hpp"
#include "kshard/checkpoint/safetensors.hpp"
#include "kshard/error.hpp"
#include "kshard/mesh/agree.hpp"

namespace kshard {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr const char* kWho = "import_hf";

// config.json against the shape the model was built with, field by field,
// under the names config.json gives them.
void compare_configs(const HfConfig& file, const HfConfig& want, const fs::path& dir) {
  const bool llama = want.model_type == "llama";
  const std::string src = "Hugging Face config '" + (dir / "config.json").string() + "'";
  const std::string expected = "the config of the model being built (kshard-train: the same --arch, sizes and flags)";
  const auto differ = [&](const std::string& field, const std::string& have, const std::string& model) {
    throw Error(src + ": " + field + " is " + have + " but the model's is " + model, expected);
  };
  if (file.model_type != want.model_type) differ("model_type", file.model_type, want.model_type);
  const auto count = [&](const char* llama_name, const char* gpt2_name, std::int64_t have, std::int64_t model) {
    if (have != model) differ(llama ? llama_name : gpt2_name, std::to_string(have), std::to_string(model));
  };
  count("vocab_size", "vocab_size", file.vocab, want.vocab);
  count("hidden_size", "n_embd", file.hidden, want.hidden);
  count("num_hidden_layers", "n_layer", file.layers, want.layers);
  count("num_attention_heads", "n_head", file.heads, want.heads);
  count("intermediate_size", "n_inner", file.intermediate, want.intermediate);
  if (llama) count("num_key_value_heads", "", file.kv_heads, want.kv_heads ? want.kv_heads : want.heads);
  const auto same = [](double a, double b) { return std::abs(a - b) <= 1e-12 * std::abs(b); };
  if (!same(file.norm_eps, want.norm_eps))
    differ(llama ? "rms_norm_eps" : "layer_norm_epsilon", json(file.norm_eps).dump(), json(want.norm_eps).dump());
  if (llama && !same(file.rope_theta, want.rope_theta))
    differ("rope_theta", json(file.rope_theta).dump(), json(want.rope_theta).dump());
  if (file.tie_word_embeddings != want.tie_word_embeddings)
    differ("tie_word_embeddings", file.tie_word_embeddings ? "true" : "false",
           want.tie_word_embeddings ? "true" : "false");
  if (!llama && file.max_positions < want.max_positions)
    differ("n_positions", std::to_string(file.max_positions),
           std::to_string(want.max_positions) + " positions (the sequence length)");
}

// Tensors transformers may have saved that kshard's model does not hold.
bool ignorable(const std::string& name, const SafetensorsTensor& t, const HfConfig& c) {
  const auto ends_with = [&](const std::string& s) {
    return name.size() >= s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0;
  };
  if (ends_with(".attn.bias") && c.model_type == "gpt2" && t.shape.size() == 4) return true;  // causal mask
  if (ends_with(".attn.masked_bias") || ends_with(".rotary_emb.inv_freq")) return true;
  // A tied head: transformers ties it to the token table on load.
  return name == "lm_head.weight" && c.tie_word_embeddings &&
         t.shape == std::vector<std::int64_t>{c.vocab, c.hidden};
}

struct WeightFile {
  fs::path path;
  SafetensorsHeader header;
};

// model.safetensors, or model.safetensors.index.json's shards.
std::vector<WeightFile> weight_files(const fs::path& dir) {
  const fs::path single = dir / "model.safetensors", index = dir / "model.safetensors.index.json";
  std::vector<fs::path> paths;
  if (fs::exists(index)) {
    json j;
    try {
      std::ifstream in(index);
      j = json::parse(in);
    } catch (const json::exception& e) {
      throw Error("'" + index.string() + "' is not valid JSON (" + e.what() + ")",
                  "a safetensors index as transformers writes it");
    }
    if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
      throw Error("'" + index.string() + "' has no weight_map object",
                  "{\"weight_map\": {tensor name: file name}}");
    std::set<std::string> names;
    for (const auto& [tensor, file] : j["weight_map"].items()) {
      if (!file.is_string() || fs::path(file.get<std::string>()).has_parent_path())
        throw Error("'" + index.string() + "' maps '" + tensor + "' to " + file.dump(),
                    "the name of a file beside the index");
      names.insert(file.get<std::string>());
    }
    for (const auto& n : names) paths.push_back(dir / n);
  } else if (fs::exists(single)) {
    paths.push_back(single);
  } else {
    throw Error("Hugging Face model '" + dir.string() + "' has no model.safetensors or model.safetensors.index.json",
                "the weights beside config.json (transformers' save_pretrained with safetensors)");
  }
  std::vector<WeightFile> files;
  for (const auto& p : paths) files.push_back({p, read_safetensors_header(p)});
  return files;
}

struct Source {
  const WeightFile* file;
  const SafetensorsTensor* tensor;
};

// One tensor of the file for one kshard tensor: the piece and where it is.
struct Placed {
  detail::ExportPiece piece;
  Source src;
};

}  // namespace

void import_hf(FsdpModel& model, const HfConfig& config, const fs::path& dir) {
  const Communicator& world = model.mesh().world();
  std::vector<WeightFile> files;
  std::map<std::string, Source> tensors;
  // placed[u][i]: the file's tensors that make up kshard tensor i of unit u.
  std::vector<std::vector<std::vector<Placed>>> placed(model.num_units());
  run_agreed(world, [&] {
    detail::check_hf_model(model, config, kWho);
    compare_configs(read_hf_config(dir), config, dir);
    files = weight_files(dir);
    for (const WeightFile& f : files)
      for (const SafetensorsTensor& t : f.header.tensors)
        if (!tensors.emplace(t.name, Source{&f, &t}).second)
          throw Error("Hugging Face model '" + dir.string() + "' has tensor '" + t.name + "' twice",
                      "each tensor in one file");
    std::set<std::string> used;
    const std::string arch = config.model_type == "llama" ? "LlamaForCausalLM" : "GPT2LMHeadModel";
    for (std::size_t u = 0; u < model.num_units(); ++u) {
      const ParamIndex& idx = model.group(u).index();
      placed[u].resize(idx.size());
      for (std::size_t i = 0; i < idx.size(); ++i)
        for (detail::ExportPiece& p : detail::hf_pieces(config, u, idx.entry(i), kWho)) {
          const auto it = tensors.find(p.name);
          if (it == tensors.end())
            throw Error("Hugging Face model '" + dir.string() + "' has no tensor '" + p.name + "'",
                        "every tensor of a " + arch + " of config.json's shape");
          const SafetensorsTensor& t = *it->second.tensor;
          // GPT-2's position table may have more rows than the model's.
          const bool prefix = p.name == "transformer.wpe.weight" && t.shape.size() == 2 &&
                              p.shape.size() == 2 && t.shape[1] == p.shape[1] && t.shape[0] >= p.shape[0];
          if (t.shape != p.shape && !prefix)
            throw Error("Hugging Face model '" + dir.string() + "': tensor '" + p.name + "' is " +
                            shape_text(t.shape),
                        shape_text(p.shape) + " (config.json's shape)");
          if (t.dtype != DType::f32 && t.dtype != DType::bf16 && t.dtype != DType::f16 && t.dtype != DType::f64)
            throw Error("Hugging Face model '" + dir.string() + "': tensor '" + p.name + "' is " +
                            detail::safetensors_dtype_name(t.dtype),
                        "F32, BF16, F16 or F64 weights");
          used.insert(p.name);
          placed[u][i].push_back({std::move(p), it->second});
        }
    }
    for (const auto& [name, src] : tensors)
      if (!used.count(name) && !ignorable(name, *src.tensor, config))
        throw Error("Hugging Face model '" + dir.string() + "' has tensor '" + name + "' " +
                        shape_text(src.tensor->shape) + ", which kshard's " + config.model_type +
                        " model has no place for",
                    "the tensors of a " + arch + " (docs/CHECKPOINTS.md)");
  });

  // Every rank reads the elements of its own shards; nothing is set before
  // all of them are read.
  std::vector<std::vector<float>> staging;
  run_agreed(world, [&] {
    std::map<const WeightFile*, detail::File> open;
    for (const WeightFile& f : files) open.emplace(&f, detail::File::open_read(f.path));
    std::vector<char> buf;
    std::vector<float> whole;
    staging = detail::read_shards(model, [&](std::size_t u, std::size_t i, const ParamIndex::Piece& pc, float* dst) {
      const ParamEntry& e = model.group(u).index().entry(i);
      const std::int64_t rows = e.shape.empty() ? 1 : e.shape[0];
      const std::int64_t cols = rows ? e.numel / rows : 0;
      for (const Placed& pl : placed[u][i]) {
        const SafetensorsTensor& t = *pl.src.tensor;
        detail::File& f = open.at(pl.src.file);
        const std::int64_t es = std::int64_t(dtype_size(t.dtype));
        const std::int64_t base = pl.src.file->header.data_start + t.begin;
        const std::int64_t p0 = pl.piece.row_begin * cols, p1 = pl.piece.row_end * cols;
        const std::int64_t lo = std::max(p0, pc.param_begin), hi = std::min(p1, pc.param_begin + pc.count);
        if (lo >= hi) continue;
        if (!pl.piece.transpose) {  // the same row-major order: one contiguous read
          buf.resize(std::size_t((hi - lo) * es));
          f.pread_all(buf.data(), buf.size(), base + (lo - p0) * es);
          detail::decode_to_f32(buf.data(), t.dtype, hi - lo, dst + (lo - pc.param_begin));
          continue;
        }
        // A Conv1D weight [in = cols, out = nr]: read whole, pick (r, c) at c * nr + r.
        const std::int64_t nr = pl.piece.row_end - pl.piece.row_begin, n = nr * cols;
        buf.resize(std::size_t(n * es));
        f.pread_all(buf.data(), buf.size(), base);
        whole.resize(std::size_t(n));
        detail::decode_to_f32(buf.data(), t.dtype, n, whole.data());
        for (std::int64_t k = lo; k < hi; ++k) {
          const std::int64_t r = k / cols - pl.piece.row_begin, c = k % cols;
          dst[k - pc.param_begin] = whole[std::size_t(c * nr + r)];
        }
      }
    });
  });
  detail::set_master_shards(model, staging);
}

}  // namespace kshard
