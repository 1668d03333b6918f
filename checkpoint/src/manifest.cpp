#include "kshard/checkpoint/manifest.hpp"

#include <algorithm>

#include "file_io.hpp"
#include "kshard/error.hpp"

namespace kshard {

using nlohmann::json;

const SavedTensor* SavedParam::tensor(const std::string& kind) const {
  for (const auto& t : tensors)
    if (t.kind == kind) return &t;
  return nullptr;
}

json Manifest::to_json() const {
  json j;
  j["format"] = format_name;
  j["format_version"] = format_version;
  j["complete"] = true;
  j["step"] = step;
  j["recipe"] = recipe;
  j["mesh"] = mesh;
  j["mesh_dims"] = mesh_dims;
  j["world_size"] = world_size;
  j["crc_block_bytes"] = crc_block_bytes;
  if (has_optimizer)
    j["optimizer"] = {{"step_count", optimizer_step}, {"moment_dtype", dtype_name(moment_dtype)}};
  else
    j["optimizer"] = nullptr;
  j["user_state"] = user_state;
  if (!fp8_state.empty()) j["fp8_state"] = fp8_state;  // floats print round-trip exact
  json files_j = json::array();
  for (const auto& f : files) files_j.push_back({{"name", f.name}, {"bytes", f.bytes}});
  j["files"] = std::move(files_j);
  json units_j = json::array();
  for (const auto& u : units) {
    json params_j = json::array();
    for (const auto& p : u.params) {
      json tensors_j = json::object();
      for (const auto& t : p.tensors) {
        json pieces_j = json::array();
        for (const auto& pc : t.pieces)
          pieces_j.push_back({{"start", pc.start},
                              {"count", pc.count},
                              {"file", pc.file},
                              {"offset", pc.offset},
                              {"crc32", pc.crc32}});
        tensors_j[t.kind] = {{"dtype", dtype_name(t.dtype)}, {"pieces", std::move(pieces_j)}};
      }
      params_j.push_back({{"name", p.name}, {"shape", p.shape}, {"tensors", std::move(tensors_j)}});
    }
    units_j.push_back({{"name", u.name}, {"kind", u.kind}, {"params", std::move(params_j)}});
  }
  j["units"] = std::move(units_j);
  return j;
}

namespace {

/// Field access with errors that name the manifest and the field's path.
class Reader {
 public:
  explicit Reader(std::string source) : source_(std::move(source)) {}

  static std::string join(const std::string& where, const char* key) {
    return where.empty() ? std::string(key) : where + "." + key;
  }
  [[noreturn]] void bad(const std::string& where, const std::string& what,
                        const std::string& expected = "a manifest written by kshard") const {
    throw Error("manifest '" + source_ + "': " + where + " " + what, expected);
  }
  const json& field(const json& obj, const std::string& where, const char* key) const {
    if (!obj.is_object()) bad(where, "is not a JSON object");
    auto it = obj.find(key);
    if (it == obj.end()) bad(join(where, key), "is missing");
    return *it;
  }
  std::int64_t integer(const json& obj, const std::string& where, const char* key,
                       std::int64_t min = 0) const {
    const json& v = field(obj, where, key);
    if (!v.is_number_integer()) bad(join(where, key), "is not an integer");
    const auto x = v.get<std::int64_t>();
    if (x < min) bad(join(where, key), "= " + std::to_string(x) + " is below " + std::to_string(min));
    return x;
  }
  std::string string(const json& obj, const std::string& where, const char* key) const {
    const json& v = field(obj, where, key);
    if (!v.is_string()) bad(join(where, key), "is not a string");
    return v.get<std::string>();
  }
  const json& array(const json& obj, const std::string& where, const char* key) const {
    const json& v = field(obj, where, key);
    if (!v.is_array()) bad(join(where, key), "is not an array");
    return v;
  }
  DType dtype(const json& obj, const std::string& where, const char* key) const {
    const std::string s = string(obj, where, key);
    try {
      return parse_dtype(s);
    } catch (const Error&) {
      bad(join(where, key), "= '" + s + "' is not a dtype");
    }
  }

 private:
  std::string source_;
};

}  // namespace

Manifest Manifest::from_json(const json& j, const std::string& source) {
  Reader r(source);
  Manifest m;
  const std::string format = r.string(j, "", "format");
  if (format != format_name) r.bad("format", "is '" + format + "'", std::string("'") + format_name + "'");
  const std::int64_t version = r.integer(j, "", "format_version");
  if (version != format_version)
    r.bad("format_version", "is " + std::to_string(version) + ", which this kshard cannot read",
          "format version " + std::to_string(format_version));
  const json& complete = r.field(j, "", "complete");
  if (!complete.is_boolean() || !complete.get<bool>())
    r.bad("complete", "is not true", "a completely written checkpoint");
  m.step = r.integer(j, "", "step");
  m.recipe = r.string(j, "", "recipe");
  for (const auto& d : r.array(j, "", "mesh")) {
    if (!d.is_number_integer() || d.get<int>() < 1) r.bad("mesh", "holds a non-positive size");
    m.mesh.push_back(d.get<int>());
  }
  for (const auto& d : r.array(j, "", "mesh_dims"))
    m.mesh_dims.push_back(d.is_string() ? d.get<std::string>() : std::string("?"));
  m.world_size = int(r.integer(j, "", "world_size", 1));
  m.crc_block_bytes = r.integer(j, "", "crc_block_bytes", 1);
  const json& opt = r.field(j, "", "optimizer");
  if (!opt.is_null()) {
    m.has_optimizer = true;
    m.optimizer_step = r.integer(opt, "optimizer", "step_count");
    m.moment_dtype = r.dtype(opt, "optimizer", "moment_dtype");
    if (m.moment_dtype != DType::f32 && m.moment_dtype != DType::bf16)
      r.bad("optimizer.moment_dtype", std::string("is ") + dtype_name(m.moment_dtype), "f32 or bf16");
  }
  m.user_state = r.field(j, "", "user_state");
  if (j.contains("fp8_state")) {
    for (const auto& v : r.array(j, "", "fp8_state")) {
      if (!v.is_number()) r.bad("fp8_state", "holds a value that is not a number");
      m.fp8_state.push_back(v.get<float>());
    }
  }

  const json& files = r.array(j, "", "files");
  for (std::size_t i = 0; i < files.size(); ++i) {
    const std::string w = "files[" + std::to_string(i) + "]";
    SavedFile f;
    f.name = r.string(files[i], w, "name");
    // Data files lie in the checkpoint directory itself: a name with a path
    // in it would read elsewhere.
    if (f.name.empty() || f.name.find('/') != std::string::npos || f.name == "." || f.name == "..")
      r.bad(w + ".name", "= '" + f.name + "' is not a plain file name");
    f.bytes = r.integer(files[i], w, "bytes");
    m.files.push_back(f);
  }

  const json& units = r.array(j, "", "units");
  for (std::size_t u = 0; u < units.size(); ++u) {
    const std::string wu = "units[" + std::to_string(u) + "]";
    SavedUnit su;
    su.name = r.string(units[u], wu, "name");
    su.kind = r.string(units[u], wu, "kind");
    const json& params = r.array(units[u], wu, "params");
    for (std::size_t p = 0; p < params.size(); ++p) {
      const std::string wp = wu + ".params[" + std::to_string(p) + "]";
      SavedParam sp;
      sp.name = r.string(params[p], wp, "name");
      sp.numel = 1;
      for (const auto& d : r.array(params[p], wp, "shape")) {
        if (!d.is_number_integer() || d.get<std::int64_t>() < 0) r.bad(wp + ".shape", "holds a negative size");
        sp.shape.push_back(d.get<std::int64_t>());
        sp.numel *= sp.shape.back();
      }
      const json& tensors = r.field(params[p], wp, "tensors");
      if (!tensors.is_object()) r.bad(wp + ".tensors", "is not an object");
      for (auto it = tensors.begin(); it != tensors.end(); ++it) {
        const std::string wt = wp + ".tensors." + it.key();
        SavedTensor t;
        t.kind = it.key();
        t.dtype = r.dtype(it.value(), wt, "dtype");
        const std::int64_t es = std::int64_t(dtype_size(t.dtype));
        std::int64_t next = 0;
        const json& pieces = r.array(it.value(), wt, "pieces");
        for (std::size_t k = 0; k < pieces.size(); ++k) {
          const std::string wk = wt + ".pieces[" + std::to_string(k) + "]";
          SavedPiece pc;
          pc.start = r.integer(pieces[k], wk, "start");
          pc.count = r.integer(pieces[k], wk, "count", 1);
          pc.file = int(r.integer(pieces[k], wk, "file"));
          pc.offset = r.integer(pieces[k], wk, "offset");
          // Pieces in order, without gaps or overlap: together exactly [0, numel).
          if (pc.start != next)
            r.bad(wk + ".start", "= " + std::to_string(pc.start) + " but the previous piece ends at " +
                                     std::to_string(next));
          next = pc.start + pc.count;
          if (next > sp.numel)
            r.bad(wk, "ends at element " + std::to_string(next) + " beyond the parameter's " +
                          std::to_string(sp.numel));
          if (pc.file >= int(m.files.size()))
            r.bad(wk + ".file", "= " + std::to_string(pc.file) + " is not a listed file");
          const std::int64_t bytes = pc.count * es;
          if (pc.offset + bytes > m.files[std::size_t(pc.file)].bytes)
            r.bad(wk, "lies beyond the end of '" + m.files[std::size_t(pc.file)].name + "'");
          for (const auto& c : r.array(pieces[k], wk, "crc32")) {
            if (!c.is_number_unsigned() || c.get<std::uint64_t>() > 0xFFFFFFFFull)
              r.bad(wk + ".crc32", "holds a value that is not a crc32");
            pc.crc32.push_back(c.get<std::uint32_t>());
          }
          const std::int64_t blocks = (bytes + m.crc_block_bytes - 1) / m.crc_block_bytes;
          if (std::int64_t(pc.crc32.size()) != blocks)
            r.bad(wk + ".crc32", "has " + std::to_string(pc.crc32.size()) + " checksums for " +
                                     std::to_string(blocks) + " blocks");
          t.pieces.push_back(std::move(pc));
        }
        if (next != sp.numel)
          r.bad(wt, "covers elements [0, " + std::to_string(next) + ") of " + std::to_string(sp.numel));
        sp.tensors.push_back(std::move(t));
      }
      const SavedTensor* master = sp.tensor("master");
      if (!master) r.bad(wp + ".tensors", "has no 'master'");
      if (master->dtype != DType::f32) r.bad(wp + ".tensors.master.dtype", "is not f32");
      if (m.has_optimizer)
        for (const char* kind : {"exp_avg", "exp_avg_sq"}) {
          const SavedTensor* t = sp.tensor(kind);
          if (!t) r.bad(wp + ".tensors", std::string("has no '") + kind + "' but the manifest has optimizer state");
          if (t->dtype != m.moment_dtype)
            r.bad(wp + ".tensors." + kind + ".dtype", std::string("is ") + dtype_name(t->dtype) +
                                                          ", not the moment dtype " + dtype_name(m.moment_dtype));
        }
      su.params.push_back(std::move(sp));
    }
    m.units.push_back(std::move(su));
  }
  return m;
}

Manifest read_manifest(const std::filesystem::path& file) {
  const std::string text = detail::read_text_file(file);
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    throw Error("manifest '" + file.string() + "' is not valid JSON (" + e.what() + ")",
                "a manifest written by kshard");
  }
  return Manifest::from_json(j, file.string());
}

}  // namespace kshard
