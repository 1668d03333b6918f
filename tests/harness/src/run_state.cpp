#include "run_state.hpp"

#include <fcntl.h>
#include <unistd.h>

#include "kshard/testing/context.hpp"

namespace kshard::testing {
namespace detail {

RunState& state() {
  static RunState* s = new RunState;  // outlives static destruction: the watchdog may read it
  return *s;
}

TestOutcome& outcome(const std::string& name) {
  RunState& s = state();
  auto it = s.outcomes.find(name);
  if (it == s.outcomes.end()) {
    s.order.push_back(name);
    it = s.outcomes.emplace(name, TestOutcome{}).first;
  }
  return it->second;
}

namespace {
void write_file(const std::string& path, const std::string& text, int flags) {
  const int fd = ::open(path.c_str(), flags | O_WRONLY | O_CREAT, 0644);
  if (fd < 0) return;
  ssize_t off = 0;
  while (off < ssize_t(text.size())) {
    const ssize_t n = ::write(fd, text.data() + off, text.size() - off);
    if (n <= 0) break;
    off += n;
  }
  ::close(fd);
}
}  // namespace

void write_status(const std::string& line) {
  write_file(state().status_path, line + "\n", O_TRUNC);
}

void append_diag(const std::string& text) {
  RunState& s = state();
  write_file(s.log_dir + "/" + s.suite + ".rank" + std::to_string(s.rank) + ".watchdog.txt", text,
             O_APPEND);
}

std::vector<int> ranks_where(bool flag) {
  RunState& s = state();
  std::vector<int> flags(s.size, 0);
  int mine = flag ? 1 : 0;
  MPI_Allgather(&mine, 1, MPI_INT, flags.data(), 1, MPI_INT, s.comm);
  std::vector<int> out;
  for (int r = 0; r < s.size; ++r)
    if (flags[r]) out.push_back(r);
  return out;
}

void set_phase(const char* phase) {
  RunState& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  s.phase = phase;
}

}  // namespace detail

kshard::Session& session() {
  auto& s = detail::state();
  if (!s.session)
    throw kshard::Error("kshard::testing::session() called outside the suite's run",
                        "a call from a test case (the global fixture owns the Session)");
  return *s.session;
}
const kshard::Communicator& world() { return session().world(); }
int world_rank() noexcept { return detail::state().rank; }
int world_size() noexcept { return detail::state().size; }
MPI_Comm harness_comm() noexcept { return detail::state().comm; }
std::string current_test() {
  auto& s = detail::state();
  std::lock_guard<std::mutex> lock(s.mu);
  return s.current;
}

}  // namespace kshard::testing
