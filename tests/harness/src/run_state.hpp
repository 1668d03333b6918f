#pragma once
// Private: the harness' per-process state, shared by the observer, the
// fixtures and the watchdog thread.
#include <mpi.h>

#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "kshard/mesh/session.hpp"

namespace kshard::testing::detail {

struct TestOutcome {
  std::vector<int> failing_ranks;
  std::string skip_reason;
  bool expected_failures = false;  // declared with expected_failures(n)
};

struct RunState {
  // Fixed once main has started.
  int rank = 0;
  int size = 1;
  std::string suite;
  std::string log_dir;
  std::string status_path;
  MPI_Comm comm = MPI_COMM_NULL;
  double default_timeout_s = 60;
  std::unique_ptr<kshard::Session> session;

  // The running test; guarded by mu (the watchdog reads it).
  std::mutex mu;
  std::string current;
  std::chrono::steady_clock::time_point started;
  double timeout_s = 60;
  std::string phase;  // "body", "set-up sync", "tear-down sync"
  std::atomic<int> failures_in_test{0};
  // Failures raised by collective checks: seen on every rank, so they say
  // nothing about this rank; their origin ranks are kept instead.
  int collective_failures_in_test = 0;
  std::vector<int> collective_origins;

  // Results, identical on all ranks (they come from collective exchanges).
  std::vector<std::string> order;
  std::map<std::string, TestOutcome> outcomes;
};

RunState& state();
/// The outcome record of test `name`, created (in run order) on first use.
TestOutcome& outcome(const std::string& name);
/// Rewrites this rank's status file: one line the launcher reads post mortem.
void write_status(const std::string& line);
/// Appends to this rank's diagnostics file (used by the watchdog).
void append_diag(const std::string& text);
void set_phase(const char* phase);
/// World ranks where `flag` is true, identical on every rank (one
/// all-gather on the harness communicator; no bookkeeping).
std::vector<int> ranks_where(bool flag);

void start_watchdog();
void stop_watchdog();

}  // namespace kshard::testing::detail
