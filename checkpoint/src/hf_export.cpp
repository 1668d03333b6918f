#include "kshard/checkpoint/hf_export.hpp"

#include <cstdio>
#include <fstream>
#include <map>
#include <regex>
#include <set>

#include "hf_layout.hpp"
#include "kshard/error.hpp"
#include "kshard/mesh/agree.hpp"
#include "safetensors_layout.hpp"

namespace kshard {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr const char* kIndex = "model.safetensors.index.json";

/// Writes `text` to dir/name through "<name>.partial" and a rename.
void write_text(const fs::path& dir, const std::string& name, const std::string& text) {
  const fs::path tmp = dir / (name + ".partial");
  {
    std::ofstream f(tmp);
    f << text;
    if (!f.flush()) throw Error("cannot write " + tmp.string(), "a writable directory");
  }
  fs::rename(tmp, dir / name);
}

/// Weight files of an earlier export that this one did not write (so that
/// no index names a stale file and no stale file hides a new index).
void remove_old_weights(const fs::path& dir, const std::set<std::string>& written) {
  static const std::regex shard(R"(model-\d{5}-of-\d{5}\.safetensors)");
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string n = e.path().filename().string();
    if (!written.count(n) && (n == "model.safetensors" || n == kIndex || std::regex_match(n, shard)))
      fs::remove(e.path());
  }
}

}  // namespace

void export_hf(FsdpModel& model, const HfConfig& config, const fs::path& dir, DType dtype,
               std::int64_t max_shard_bytes) {
  const Communicator& world = model.mesh().world();
  const bool root = world.rank() == 0;
  const auto layout = [&](std::size_t u, const ParamEntry& e) { return detail::hf_pieces(config, u, e, "export_hf"); };
  // Which file each tensor goes to: the same on every rank (from the layout).
  std::map<std::string, int> file_of;
  int files = 1;
  std::int64_t total = 0;
  run_agreed(world, [&] {
    detail::check_hf_model(model, config, "export_hf");
    if (max_shard_bytes < 1)
      throw Error("export_hf: max_shard_bytes " + std::to_string(max_shard_bytes), "a positive size");
    std::int64_t in_file = 0;
    for (std::size_t u = 0; u < model.num_units(); ++u)
      for (std::size_t i = 0; i < model.group(u).index().size(); ++i)
        for (const detail::ExportPiece& p : layout(u, model.group(u).index().entry(i))) {
          std::int64_t bytes = std::int64_t(dtype_size(dtype));
          for (std::int64_t x : p.shape) bytes *= x;
          if (in_file > 0 && in_file + bytes > max_shard_bytes) {
            ++files;
            in_file = 0;
          }
          file_of[p.name] = files - 1;
          in_file += bytes;
          total += bytes;
        }
    if (root) fs::create_directories(dir);
  });
  const auto file_name = [&](int f) {
    if (files == 1) return std::string("model.safetensors");
    char b[64];
    std::snprintf(b, sizeof b, "model-%05d-of-%05d.safetensors", f + 1, files);
    return std::string(b);
  };
  for (int f = 0; f < files; ++f)
    detail::write_safetensors(model, dir / file_name(f), dtype, {{"kshard.hf_model_type", config.model_type}},
                              [&](std::size_t u, const ParamEntry& e) {
                                std::vector<detail::ExportPiece> mine;
                                for (detail::ExportPiece& p : layout(u, e))
                                  if (file_of.at(p.name) == f) mine.push_back(std::move(p));
                                return mine;
                              });
  agree_ok(world, run_local([&] {
    if (!root) return;
    std::set<std::string> written;
    for (int f = 0; f < files; ++f) written.insert(file_name(f));
    if (files > 1) written.insert(kIndex);
    remove_old_weights(dir, written);
    if (files > 1) {  // the index last: when it names a file, the file is complete
      json map = json::object();
      for (const auto& [name, f] : file_of) map[name] = file_name(f);
      write_text(dir, kIndex, json{{"metadata", {{"total_size", total}}}, {"weight_map", map}}.dump(2) + "\n");
    }
    write_text(dir, "config.json", detail::hf_config_json(config, dtype).dump(2) + "\n");
  }));
}

}  // namespace kshard
