// main() of every distributed suite, the global fixture that owns the
// kshard::Session, and the Boost.Test observer that tracks the running test.
//
// MPI is initialised here, before Boost.Test parses anything, so that the
// per-rank log and JUnit files can be named after the real MPI rank and so
// that delayed datasets may depend on the world size. The Session (Kokkos,
// device selection, communicators) is created by the global fixture and
// adopts the running MPI.
#include <mpi.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include <boost/test/results_collector.hpp>
#include <boost/test/tree/observer.hpp>
#include <boost/test/unit_test.hpp>

#include "kshard/testing/harness.hpp"
#include "run_state.hpp"

namespace kshard::testing::detail {
namespace {

namespace utf = boost::unit_test;

double parse_timeout_label(const utf::test_unit& tu, double fallback) {
  for (const std::string& l : tu.p_labels.get()) {
    if (l.rfind("kshard_timeout_", 0) == 0) return std::atof(l.c_str() + 15);
  }
  return fallback;
}

class Observer final : public utf::test_observer {
 public:
  void test_unit_start(const utf::test_unit& tu) override {
    if (tu.p_type != utf::TUT_CASE) return;
    RunState& s = state();
    {
      std::lock_guard<std::mutex> lock(s.mu);
      s.current = tu.full_name();
      s.started = std::chrono::steady_clock::now();
      s.timeout_s = parse_timeout_label(tu, s.default_timeout_s);
      s.phase = "set-up";
    }
    s.failures_in_test = 0;
    s.collective_failures_in_test = 0;
    s.collective_origins.clear();
    write_status("running " + tu.full_name());
  }
  void test_unit_finish(const utf::test_unit& tu, unsigned long) override {
    if (tu.p_type != utf::TUT_CASE) return;
    RunState& s = state();
    std::string name;
    {
      std::lock_guard<std::mutex> lock(s.mu);
      name.swap(s.current);
    }
    write_status("between tests (last: " + name + ")");
  }
  void assertion_result(utf::assertion_result ar) override {
    if (ar == utf::AR_FAILED) ++state().failures_in_test;
  }
  void exception_caught(const boost::execution_exception&) override { ++state().failures_in_test; }
  int priority() override { return 1; }
};

Observer g_observer;

void mkdirs(const std::string& path) {
  std::string cur;
  for (std::size_t i = 0; i <= path.size(); ++i) {
    if (i == path.size() || path[i] == '/') {
      if (!cur.empty()) ::mkdir(cur.c_str(), 0755);
    }
    if (i < path.size()) cur += path[i];
  }
}

std::string join_sizes(const std::vector<int>& sizes) {
  std::string out;
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    if (i) out += i + 1 == sizes.size() ? " or " : ", ";
    out += std::to_string(sizes[i]);
  }
  return out;
}

}  // namespace

/// A suite launched at a world size it does not declare runs no case: every
/// rank says so once (and the barrier keeps any rank from leaving before all
/// have written it), instead of each case failing on its own.
bool world_size_supported(const RunState& s) {
  bool declared = false;
  const std::vector<int> sizes = suite_world_sizes(&declared);
  if (!declared || std::find(sizes.begin(), sizes.end(), s.size) != sizes.end()) return true;
  const bool one = sizes.size() == 1 && sizes[0] == 1;
  char what[512];
  std::snprintf(what, sizeof what,
                "%s: this suite runs at %s rank%s (KSHARD_SUITE_WORLD_SIZES), launched at %d; "
                "no test case was run",
                s.suite.c_str(), sizes.empty() ? "no" : join_sizes(sizes).c_str(), one ? "" : "s",
                s.size);
  // The status file too: kshard-run-suite prints it whatever the launcher
  // did with the ranks' output.
  write_status(what);
  std::fprintf(stderr, "[rank %d] %s\n", s.rank, what);
  std::fflush(stderr);
  MPI_Barrier(s.comm);
  return false;
}

struct GlobalFixture {
  GlobalFixture() {
    RunState& s = state();
    auto& master = utf::framework::master_test_suite();
    int argc = master.argc;
    char** argv = master.argv;
    s.session = std::make_unique<kshard::Session>(argc, argv);
    utf::framework::register_observer(g_observer);
    start_watchdog();
    if (s.rank == 0) {
      std::printf("[kshard] suite %s: %d ranks, backend %s, session start %.2f s, logs in %s\n",
                  s.suite.c_str(), s.size, backend_name(s.session->default_backend()),
                  s.session->init_seconds(), s.log_dir.c_str());
      std::fflush(stdout);
    }
  }

  ~GlobalFixture() {
    RunState& s = state();
    stop_watchdog();
    utf::framework::deregister_observer(g_observer);
    if (s.rank == 0) print_summary(s);
    write_status("finished");
    s.session.reset();
  }

  static void print_summary(RunState& s) {
    int failed = 0, skipped = 0, xfail = 0;
    for (const auto& name : s.order) {
      const TestOutcome& o = s.outcomes[name];
      const bool f = !o.failing_ranks.empty();
      failed += f && !o.expected_failures;
      xfail += f && o.expected_failures;
      skipped += !o.skip_reason.empty();
    }
    std::printf("[kshard] ===== summary of %s on %d ranks: %zu test cases, %d failed, "
                "%d with expected failures, %d skipped =====\n",
                s.suite.c_str(), s.size, s.order.size(), failed, xfail, skipped);
    for (const auto& name : s.order) {
      const TestOutcome& o = s.outcomes[name];
      if (!o.failing_ranks.empty())
        std::printf("[kshard] %s  %s  on ranks %s\n", o.expected_failures ? "XFAIL " : "FAILED",
                    name.c_str(), format_ranks(o.failing_ranks).c_str());
    }
    for (const auto& name : s.order) {
      const TestOutcome& o = s.outcomes[name];
      if (!o.skip_reason.empty())
        std::printf("[kshard] SKIPPED %s: %s\n", name.c_str(), o.skip_reason.c_str());
    }
    std::fflush(stdout);
  }
};

}  // namespace kshard::testing::detail

using KshardGlobalFixture = kshard::testing::detail::GlobalFixture;
BOOST_TEST_GLOBAL_FIXTURE(KshardGlobalFixture);

// Boost.Test's dynamic-library main needs an init function; test cases
// register themselves statically.
static bool kshard_init_unit_test() {
  boost::unit_test::framework::master_test_suite().p_name.value =
      kshard::testing::detail::state().suite;
  return true;
}

int main(int argc, char** argv) {
  using namespace kshard::testing::detail;
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
  RunState& s = state();
  MPI_Comm_rank(MPI_COMM_WORLD, &s.rank);
  MPI_Comm_size(MPI_COMM_WORLD, &s.size);
  MPI_Comm_dup(MPI_COMM_WORLD, &s.comm);
  kshard::set_error_rank(s.rank);

  std::string exe = argv[0];
  s.suite = exe.substr(exe.find_last_of('/') + 1);
  const char* dir = std::getenv("KSHARD_TEST_LOG_DIR");
  s.log_dir = dir && *dir ? dir : "kshard-test-logs";
  mkdirs(s.log_dir);
  const std::string base = s.log_dir + "/" + s.suite + ".rank" + std::to_string(s.rank);
  s.status_path = base + ".status";
  if (const char* t = std::getenv("KSHARD_TEST_TIMEOUT")) s.default_timeout_s = std::atof(t);
  if (s.default_timeout_s <= 0) s.default_timeout_s = 60;
  std::remove((base + ".watchdog.txt").c_str());
  write_status("starting");
  if (!world_size_supported(s)) {
    MPI_Comm_free(&s.comm);
    MPI_Finalize();
    return 2;
  }

  // Per-rank log + JUnit files (unless the caller chose loggers), and the
  // report: rank 0 to stdout, the others to their own file.
  std::vector<std::string> args(argv, argv + argc);
  bool has_logger = false, has_report = false;
  for (const auto& a : args) {
    has_logger |= a.rfind("--logger", 0) == 0 || a.rfind("--log_", 0) == 0;
    has_report |= a.rfind("--report", 0) == 0;
  }
  if (!has_logger)
    args.push_back("--logger=HRF,test_suite," + base + ".log:JUNIT,all," + base + ".junit.xml");
  if (!has_report) {
    args.push_back("--report_level=short");
    if (s.rank == 0)
      args.push_back("--report_sink=stdout");
    else
      args.push_back("--report_sink=" + base + ".report.txt");
  }
  std::vector<char*> cargs;
  for (auto& a : args) cargs.push_back(a.data());
  cargs.push_back(nullptr);

  int rc = boost::unit_test::unit_test_main(&kshard_init_unit_test, int(args.size()), cargs.data());

  // Every rank exits with the same verdict.
  int worst = rc;
  MPI_Allreduce(MPI_IN_PLACE, &worst, 1, MPI_INT, MPI_MAX, s.comm);
  MPI_Comm_free(&s.comm);
  MPI_Finalize();
  return worst;
}
