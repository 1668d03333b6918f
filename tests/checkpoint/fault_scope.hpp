#pragma once
// Test helpers shared by the checkpoint and trainer suites: the checkpoint
// writer's fault hook for one scope, and a file's bytes for byte-for-byte
// comparisons of checkpoints.
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

namespace ckpt_test {

/// Sets KSHARD_CHECKPOINT_TEST_FAULT for one scope, on every rank (read when
/// a save starts, never by an asynchronous save's writer thread).
struct FaultScope {
  explicit FaultScope(const std::string& spec) {
    ::setenv("KSHARD_CHECKPOINT_TEST_FAULT", spec.c_str(), 1);
  }
  ~FaultScope() { ::unsetenv("KSHARD_CHECKPOINT_TEST_FAULT"); }
  FaultScope(const FaultScope&) = delete;
  FaultScope& operator=(const FaultScope&) = delete;
};

inline std::string file_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}

}  // namespace ckpt_test
