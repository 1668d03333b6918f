#include "kshard/testing/timeout.hpp"

#include <mutex>
#include <set>
#include <string>

#include "run_state.hpp"

namespace kshard::testing {

boost::unit_test::decorator::label timeout(int seconds) {
  // Carried as a label so that --list_labels shows it and the observer can
  // read it when the test starts, before any of its code runs.
  // Boost's const_string does not own its characters: keep them alive.
  static std::mutex mu;
  static std::set<std::string> names;
  std::lock_guard<std::mutex> lock(mu);
  const std::string& name = *names.insert("kshard_timeout_" + std::to_string(seconds)).first;
  return boost::unit_test::decorator::label(boost::unit_test::const_string(name));
}

void set_test_timeout(double seconds) {
  auto& s = detail::state();
  std::lock_guard<std::mutex> lock(s.mu);
  s.timeout_s = seconds;
}

double test_timeout() {
  auto& s = detail::state();
  std::lock_guard<std::mutex> lock(s.mu);
  return s.timeout_s;
}

}  // namespace kshard::testing
