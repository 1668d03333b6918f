// The watchdog: a thread per rank that ends the launch when a test runs past
// its timeout. It cannot ask other ranks anything (they may be stuck or dead),
// so each rank reports for itself — test, phase, and its communicators' last
// collectives — then waits a moment so that the other ranks' watchdogs, which
// fire at about the same time, can report too, and exits non-zero; mpiexec
// then ends the whole launch.
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <thread>

#include "kshard/mesh/trace.hpp"
#include "run_state.hpp"

namespace kshard::testing::detail {
namespace {

std::thread g_thread;
std::mutex g_mu;
std::condition_variable g_cv;
bool g_stop = false;

constexpr int kWatchdogExit = 124;

void fire(const std::string& test, const std::string& phase, double ran, double limit) {
  RunState& s = state();
  char head[512];
  std::snprintf(head, sizeof head,
                "[kshard watchdog] rank %d: test '%s' exceeded its timeout of %.1f s "
                "(running %.1f s, in %s). Last collectives of this rank:\n",
                s.rank, test.c_str(), limit, ran, phase.c_str());
  const std::string report = head + kshard::format_all_traces() +
                             "[kshard watchdog] rank " + std::to_string(s.rank) +
                             ": ending the launch (exit " + std::to_string(kWatchdogExit) + ")\n";
  (void)!::write(2, report.data(), report.size());
  append_diag(report);
  write_status("watchdog: test " + test + " exceeded " + std::to_string(int(limit)) + " s in " + phase);
  std::fflush(nullptr);
  // Give the other ranks' watchdogs time to speak before mpiexec kills them.
  std::this_thread::sleep_for(std::chrono::milliseconds(3000));
  ::_exit(kWatchdogExit);
}

void loop() {
  RunState& s = state();
  std::unique_lock<std::mutex> lk(g_mu);
  while (!g_stop) {
    g_cv.wait_for(lk, std::chrono::milliseconds(100));
    if (g_stop) break;
    std::string test, phase;
    double ran = 0, limit = 0;
    {
      std::lock_guard<std::mutex> lock(s.mu);
      if (s.current.empty()) continue;
      ran = std::chrono::duration<double>(std::chrono::steady_clock::now() - s.started).count();
      limit = s.timeout_s;
      if (ran <= limit) continue;
      test = s.current;
      phase = s.phase;
    }
    fire(test, phase, ran, limit);
  }
}

}  // namespace

void start_watchdog() {
  g_stop = false;
  g_thread = std::thread(loop);
}

void stop_watchdog() {
  {
    std::lock_guard<std::mutex> lk(g_mu);
    g_stop = true;
  }
  g_cv.notify_all();
  if (g_thread.joinable()) g_thread.join();
}

}  // namespace kshard::testing::detail
