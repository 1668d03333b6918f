#include "save_dir.hpp"

#include <algorithm>
#include <cstdio>
#include <string>
#include <system_error>
#include <vector>

#include "kshard/checkpoint/checkpoint.hpp"
#include "kshard/checkpoint/manifest.hpp"

namespace kshard {
namespace fs = std::filesystem;

namespace {
constexpr const char* kPrefix = "step-";
constexpr const char* kTmpPrefix = ".tmp-";
}  // namespace

fs::path checkpoint_path(const fs::path& save_dir, std::int64_t step) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "%s%010lld", kPrefix, static_cast<long long>(step));
  return save_dir / buf;
}

namespace detail {

fs::path temporary_path(const fs::path& save_dir, std::int64_t step) {
  return save_dir / (kTmpPrefix + checkpoint_path(save_dir, step).filename().string());
}

std::optional<std::int64_t> step_of(const fs::path& name) {
  const std::string s = name.filename().string();
  const std::string prefix = kPrefix;
  if (s.size() <= prefix.size() || s.compare(0, prefix.size(), prefix) != 0) return std::nullopt;
  std::int64_t step = 0;
  for (std::size_t i = prefix.size(); i < s.size(); ++i) {
    if (s[i] < '0' || s[i] > '9' || step > (INT64_MAX - 9) / 10) return std::nullopt;
    step = step * 10 + (s[i] - '0');
  }
  return step;
}

void prune(const fs::path& save_dir, int keep) {
  std::error_code ec;
  // Leftovers of interrupted saves: never complete, never loadable.
  for (const auto& e : fs::directory_iterator(save_dir, ec)) {
    const std::string n = e.path().filename().string();
    if (n.rfind(kTmpPrefix, 0) == 0 || n.rfind(".old-", 0) == 0) fs::remove_all(e.path(), ec);
  }
  if (keep <= 0) return;
  const auto all = list_checkpoints(save_dir);
  if (all.size() <= std::size_t(keep)) return;
  for (std::size_t i = 0; i + std::size_t(keep) < all.size(); ++i) fs::remove_all(all[i], ec);
}

}  // namespace detail

std::vector<fs::path> list_checkpoints(const fs::path& save_dir) {
  std::vector<std::pair<std::int64_t, fs::path>> found;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(save_dir, ec)) {
    const auto step = detail::step_of(e.path());
    if (!step || !e.is_directory(ec)) continue;
    // Complete = its manifest reads and validates (written last, before the
    // rename; data files are verified by load).
    try {
      read_manifest(e.path() / "manifest.json");
    } catch (const std::exception&) {
      continue;
    }
    found.emplace_back(*step, e.path());
  }
  std::sort(found.begin(), found.end());
  std::vector<fs::path> out;
  for (auto& f : found) out.push_back(std::move(f.second));
  return out;
}

std::optional<fs::path> latest_checkpoint(const fs::path& save_dir) {
  auto all = list_checkpoints(save_dir);
  if (all.empty()) return std::nullopt;
  return all.back();
}

}  // namespace kshard
