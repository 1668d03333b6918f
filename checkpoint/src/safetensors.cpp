// safetensors: 8-byte little-endian header length N, N bytes of JSON
// {name: {"dtype", "shape", "data_offsets": [begin, end)}, "__metadata__":
// {str: str}}, then the data section (offsets relative to its start). The
// header is padded with spaces so that the data starts 8-byte aligned, and
// tensors follow each other without gaps (what the reference implementation
// checks), so every tensor starts aligned to its element size.
#include "kshard/checkpoint/safetensors.hpp"

#include <algorithm>
#include <cstring>
#include <optional>
#include <system_error>

#include <nlohmann/json.hpp>

#include "kshard/mesh/agree.hpp"
#include "file_io.hpp"
#include "safetensors_layout.hpp"
#include "kshard/error.hpp"
#include "kshard/numeric/convert.hpp"

namespace kshard {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

struct StDType {
  const char* name;
  DType dtype;
};
constexpr StDType kDTypes[] = {{"F32", DType::f32},   {"F64", DType::f64},      {"BF16", DType::bf16},
                               {"F16", DType::f16},   {"I32", DType::i32},      {"I64", DType::i64},
                               {"U8", DType::u8},     {"F8_E4M3", DType::e4m3}, {"F8_E5M2", DType::e5m2}};

const char* st_name(DType t) { return detail::safetensors_dtype_name(t); }

std::optional<DType> st_dtype(const std::string& s) {
  for (const auto& d : kDTypes)
    if (s == d.name) return d.dtype;
  return std::nullopt;
}

std::string tensor_name(const ShardedGroup& g, std::size_t i) {
  return g.name() + "." + g.index().entry(i).name;
}

/// Little-endian on every platform kshard targets (x86-64, aarch64).
void put_u64_le(unsigned char* p, std::uint64_t v) {
  for (int k = 0; k < 8; ++k) p[k] = static_cast<unsigned char>(v >> (8 * k));
}
std::uint64_t get_u64_le(const unsigned char* p) {
  std::uint64_t v = 0;
  for (int k = 7; k >= 0; --k) v = (v << 8) | p[k];
  return v;
}

/// f32 master values -> bytes of the export dtype.
void encode(const float* src, std::int64_t n, DType dtype, std::vector<char>& out) {
  out.resize(std::size_t(n) * dtype_size(dtype));
  if (dtype == DType::f32) {
    std::memcpy(out.data(), src, out.size());
    return;
  }
  for (std::int64_t k = 0; k < n; ++k) {
    const bfloat16_t b = from_float<bfloat16_t>(src[k]);
    std::memcpy(out.data() + 2 * k, &b.bits, 2);
  }
}

[[noreturn]] void st_fail(const std::string& what, const std::string& expected) {
  throw Error(what, expected);
}

}  // namespace

const char* detail::safetensors_dtype_name(DType t) {
  for (const auto& d : kDTypes)
    if (d.dtype == t) return d.name;
  return "?";
}

void detail::decode_to_f32(const char* src, DType dtype, std::int64_t n, float* dst) {
  for (std::int64_t k = 0; k < n; ++k) {
    switch (dtype) {
      case DType::f32: std::memcpy(dst + k, src + 4 * k, 4); break;
      case DType::f64: {
        double d;
        std::memcpy(&d, src + 8 * k, 8);
        dst[k] = float(d);
        break;
      }
      case DType::bf16: {
        bfloat16_t b;
        std::memcpy(&b.bits, src + 2 * k, 2);
        dst[k] = to_float(b);
        break;
      }
      default: {
        float16_t h;
        std::memcpy(&h.bits, src + 2 * k, 2);
        dst[k] = to_float(h);
        break;
      }
    }
  }
}

std::vector<std::vector<float>> detail::read_shards(const FsdpModel& model, const ShardFill& fill) {
  std::vector<std::vector<float>> staging(model.num_units());
  for (std::size_t u = 0; u < model.num_units(); ++u) {
    const ShardedGroup& g = model.group(u);
    const ParamIndex& idx = g.index();
    const std::int64_t first = idx.shard_range(g.shard_rank()).first;
    staging[u].assign(std::size_t(idx.shard_numel()), 0.f);
    for (std::size_t i = 0; i < idx.size(); ++i)
      for (const auto& pc : idx.pieces_in_shard(i, g.shard_rank()))
        fill(u, i, pc, staging[u].data() + (pc.flat_begin - first));
  }
  return staging;
}

void detail::set_master_shards(FsdpModel& model, const std::vector<std::vector<float>>& staging) {
  for (std::size_t u = 0; u < model.num_units(); ++u) {
    ShardedGroup& g = model.group(u);
    Kokkos::View<const float*, Kokkos::HostSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>> hv(
        staging[u].data(), staging[u].size());
    Kokkos::deep_copy(g.master(), hv);
    g.refresh_low_precision();
  }
  Kokkos::fence();
}

const SafetensorsTensor* SafetensorsHeader::find(const std::string& name) const {
  for (const auto& t : tensors)
    if (t.name == name) return &t;
  return nullptr;
}

SafetensorsHeader read_safetensors_header(const fs::path& file) {
  const std::string src = "safetensors file '" + file.string() + "'";
  const std::string expected = "a safetensors file (8-byte header length, JSON header, data)";
  auto bad = [&](const std::string& what) { st_fail(src + " " + what, expected); };
  detail::File f = detail::File::open_read(file);
  SafetensorsHeader h;
  h.file_bytes = f.size();
  if (h.file_bytes < 8) bad("is " + std::to_string(h.file_bytes) + " bytes, shorter than the 8-byte header length");
  unsigned char len_bytes[8];
  f.pread_all(len_bytes, 8, 0);
  const std::uint64_t n = get_u64_le(len_bytes);
  // The reference implementation refuses headers over 100 MB.
  if (n > 100'000'000ull || std::int64_t(8 + n) > h.file_bytes)
    bad("declares a header of " + std::to_string(n) + " bytes in a file of " +
        std::to_string(h.file_bytes) + " (truncated or not safetensors)");
  std::string text(std::size_t(n), '\0');
  f.pread_all(text.data(), std::size_t(n), 8);
  h.data_start = std::int64_t(8 + n);
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    bad(std::string("has a header that is not valid JSON (") + e.what() + ")");
  }
  if (!j.is_object()) bad("has a header that is not a JSON object");
  const std::int64_t data_bytes = h.file_bytes - h.data_start;
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& name = it.key();
    const json& v = it.value();
    if (name == "__metadata__") {
      if (!v.is_object()) bad("has a __metadata__ that is not an object");
      for (auto m = v.begin(); m != v.end(); ++m) {
        if (!m.value().is_string()) bad("has a __metadata__ value '" + m.key() + "' that is not a string");
        h.metadata[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    const std::string w = "tensor '" + name + "'";
    if (!v.is_object() || !v.contains("dtype") || !v.contains("shape") || !v.contains("data_offsets"))
      bad(w + " lacks dtype, shape or data_offsets");
    SafetensorsTensor t;
    t.name = name;
    const json& dt = v["dtype"];
    const auto d = dt.is_string() ? st_dtype(dt.get<std::string>()) : std::nullopt;
    if (!d) bad(w + " has an unknown dtype " + dt.dump());
    t.dtype = *d;
    std::int64_t numel = 1;
    if (!v["shape"].is_array()) bad(w + " has a shape that is not an array");
    for (const auto& s : v["shape"]) {
      if (!s.is_number_integer() || s.get<std::int64_t>() < 0) bad(w + " has a bad shape " + v["shape"].dump());
      t.shape.push_back(s.get<std::int64_t>());
      numel *= t.shape.back();
    }
    const json& off = v["data_offsets"];
    if (!off.is_array() || off.size() != 2 || !off[0].is_number_integer() || !off[1].is_number_integer())
      bad(w + " has data_offsets that are not two integers");
    t.begin = off[0].get<std::int64_t>();
    t.end = off[1].get<std::int64_t>();
    if (t.begin < 0 || t.end < t.begin || t.end > data_bytes)
      bad(w + " has data_offsets [" + std::to_string(t.begin) + ", " + std::to_string(t.end) +
          ") outside the " + std::to_string(data_bytes) + " data bytes (truncated?)");
    if (t.end - t.begin != numel * std::int64_t(dtype_size(t.dtype)))
      bad(w + " has " + std::to_string(t.end - t.begin) + " bytes for shape " + shape_text(t.shape) +
          " of " + dt.get<std::string>());
    h.tensors.push_back(std::move(t));
  }
  std::sort(h.tensors.begin(), h.tensors.end(),
            [](const SafetensorsTensor& a, const SafetensorsTensor& b) { return a.begin < b.begin; });
  return h;
}

void detail::write_safetensors(FsdpModel& model, const fs::path& file, DType dtype,
                               const std::map<std::string, std::string>& metadata,
                               const ExportLayout& layout) {
  const Communicator& world = model.mesh().world();
  const bool root = world.rank() == 0;
  const fs::path tmp = fs::path(file.string() + ".partial");

  // The header, identical on every rank (from the model's layout).
  json header = json::object();
  json meta = json::object();
  meta["format"] = "pt";  // what Hugging Face's loaders look for; the layout is plain row-major
  meta["kshard.format"] = "kshard-safetensors-1";
  meta["kshard.recipe"] = model.recipe().describe();
  std::string kinds;
  for (std::size_t u = 0; u < model.num_units(); ++u) kinds += (u ? "," : "") + model.layer_kind(u);
  meta["kshard.layers"] = kinds;
  for (const auto& [k, v] : metadata) meta[k] = v;
  header["__metadata__"] = meta;
  struct Placed {
    std::size_t entry;
    ExportPiece piece;
    std::int64_t offset;
  };
  std::vector<std::vector<Placed>> placed(model.num_units());
  std::int64_t data_bytes = 0;
  std::optional<detail::File> out;
  run_agreed(world, [&] {
    if (dtype != DType::f32 && dtype != DType::bf16)
      throw Error(std::string("export_safetensors in ") + dtype_name(dtype), "DType::f32 or DType::bf16");
    for (std::size_t u = 0; u < model.num_units(); ++u) {
      const ShardedGroup& g = model.group(u);
      for (std::size_t i = 0; i < g.index().size(); ++i) {
        const ParamEntry& e = g.index().entry(i);
        for (ExportPiece& p : layout(u, e)) {
          const std::int64_t rows = e.shape.empty() ? 1 : e.shape[0];
          const std::int64_t cols = rows ? e.numel / rows : 0;
          std::int64_t n = 1;
          for (std::int64_t x : p.shape) n *= x;
          if (p.row_begin < 0 || p.row_end > rows || p.row_begin > p.row_end ||
              n != (p.row_end - p.row_begin) * cols || header.contains(p.name))
            throw Error("export layout: tensor '" + p.name + "' " + shape_text(p.shape) +
                            " from rows [" + std::to_string(p.row_begin) + ", " +
                            std::to_string(p.row_end) + ") of " + tensor_name(g, i) + " " +
                            shape_text(e.shape),
                        "a row range inside the tensor, as many elements as the shape, a new name");
          const std::int64_t bytes = n * std::int64_t(dtype_size(dtype));
          header[p.name] = {{"dtype", st_name(dtype)},
                            {"shape", p.shape},
                            {"data_offsets", {data_bytes, data_bytes + bytes}}};
          placed[u].push_back({i, std::move(p), data_bytes});
          data_bytes += bytes;
        }
      }
    }
  });
  std::string text = header.dump();
  text.append((8 - (8 + text.size()) % 8) % 8, ' ');
  const std::int64_t data_start = std::int64_t(8 + text.size());

  run_agreed(world, [&] {
    if (root) {
      out.emplace(detail::File::create(tmp));
      unsigned char len[8];
      put_u64_le(len, text.size());
      out->pwrite_all(len, 8, 0);
      out->pwrite_all(text.data(), text.size(), 8);
    }
  });
  auto cleanup = [&](const std::optional<Error>& err) {
    try {
      agree_ok(world, err);
    } catch (...) {
      out.reset();
      std::error_code ec;
      if (root) fs::remove(tmp, ec);
      throw;
    }
  };

  // One unit unsharded at a time; rank 0 writes it. A write error on rank 0
  // is kept until every unit's all-gather is done (the others are in them).
  std::optional<Error> err;
  std::vector<char> bytes;
  std::vector<float> t;
  for (std::size_t u = 0; u < model.num_units(); ++u) {
    const ShardedGroup& g = model.group(u);
    if (placed[u].empty()) continue;  // nothing of it in this file (alike on every rank)
    const std::vector<float> full = g.gather_master();
    if (!root || err) continue;
    err = run_local([&] {
      for (const Placed& pl : placed[u]) {
        const ParamEntry& e = g.index().entry(pl.entry);
        const std::int64_t rows = e.shape.empty() ? 1 : e.shape[0];
        const std::int64_t cols = rows ? e.numel / rows : 0;
        const std::int64_t r0 = pl.piece.row_begin, nr = pl.piece.row_end - r0;
        const float* src = full.data() + e.offset + r0 * cols;
        if (pl.piece.transpose) {
          t.resize(std::size_t(nr * cols));
          for (std::int64_t r = 0; r < nr; ++r)
            for (std::int64_t c = 0; c < cols; ++c) t[std::size_t(c * nr + r)] = src[r * cols + c];
          src = t.data();
        }
        encode(src, nr * cols, dtype, bytes);
        out->pwrite_all(bytes.data(), bytes.size(), data_start + pl.offset);
      }
    });
  }
  cleanup(err);
  cleanup(run_local([&] {
    if (!root) return;
    out->sync();
    out->close();
    fs::rename(tmp, file);
    detail::fsync_directory(fs::absolute(file).parent_path());
  }));
}

void export_safetensors(FsdpModel& model, const fs::path& file, DType dtype,
                        const std::map<std::string, std::string>& metadata) {
  // kshard's own names and shapes, every tensor whole.
  detail::write_safetensors(model, file, dtype, metadata,
                            [&](std::size_t u, const ParamEntry& e) {
                              const std::int64_t rows = e.shape.empty() ? 1 : e.shape[0];
                              return std::vector<detail::ExportPiece>{
                                  {model.group(u).name() + "." + e.name, e.shape, 0, rows, false}};
                            });
}

void import_safetensors(FsdpModel& model, const fs::path& file) {
  const Communicator& world = model.mesh().world();
  SafetensorsHeader h;
  run_agreed(world, [&] {
    h = read_safetensors_header(file);
    std::size_t expected_count = 0;
    for (std::size_t u = 0; u < model.num_units(); ++u) {
      const ShardedGroup& g = model.group(u);
      for (std::size_t i = 0; i < g.index().size(); ++i) {
        ++expected_count;
        const std::string name = tensor_name(g, i);
        const ParamEntry& e = g.index().entry(i);
        const SafetensorsTensor* t = h.find(name);
        if (!t)
          throw Error("safetensors file '" + file.string() + "' has no tensor '" + name + "'",
                      "every parameter of the model (names in docs/CHECKPOINTS.md)");
        if (t->shape != e.shape)
          throw Error("safetensors file '" + file.string() + "': tensor '" + name + "' has shape " +
                          shape_text(t->shape) + " but the model's is " + shape_text(e.shape),
                      "a file of a model with the same layers");
        if (t->dtype != DType::f32 && t->dtype != DType::bf16 && t->dtype != DType::f16 &&
            t->dtype != DType::f64)
          throw Error("safetensors file '" + file.string() + "': tensor '" + name + "' is " +
                          st_name(t->dtype),
                      "F32, BF16, F16 or F64 parameters");
      }
    }
    if (h.tensors.size() != expected_count)
      for (const auto& t : h.tensors) {
        bool known = false;
        for (std::size_t u = 0; u < model.num_units() && !known; ++u)
          for (std::size_t i = 0; i < model.group(u).index().size() && !known; ++i)
            known = tensor_name(model.group(u), i) == t.name;
        if (!known)
          throw Error("safetensors file '" + file.string() + "' has tensor '" + t.name +
                          "', which the model does not have",
                      "exactly the model's parameters");
      }
  });

  std::vector<std::vector<float>> staging;
  run_agreed(world, [&] {
    detail::File f = detail::File::open_read(file);
    std::vector<char> buf;
    staging = detail::read_shards(model, [&](std::size_t u, std::size_t i, const ParamIndex::Piece& pc, float* dst) {
      const SafetensorsTensor& t = *h.find(tensor_name(model.group(u), i));
      const std::int64_t es = std::int64_t(dtype_size(t.dtype));
      buf.resize(std::size_t(pc.count * es));
      f.pread_all(buf.data(), buf.size(), h.data_start + t.begin + pc.param_begin * es);
      detail::decode_to_f32(buf.data(), t.dtype, pc.count, dst);
    });
  });

  detail::set_master_shards(model, staging);
}

}  // namespace kshard
