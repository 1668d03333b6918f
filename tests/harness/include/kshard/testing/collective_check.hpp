#pragma once
// Collective assertions. Every rank evaluates the condition at the same
// point, the harness exchanges the outcomes, and every rank records the same
// result naming the ranks where it failed. An exception while evaluating
// counts as a failure on that rank (and is reported) instead of leaving the
// other ranks waiting.
//
// Plain BOOST_CHECKs stay per-rank; the per-test fixture still makes a test
// that failed on any rank fail on all of them (see test_fixture.hpp).
#include <sstream>
#include <string>
#include <vector>

#include <boost/test/unit_test.hpp>

namespace kshard::testing {

/// Ranks (of the world) where `failed` is true; identical on every rank.
std::vector<int> failing_ranks(bool failed);
/// "[1, 3]".
std::string format_ranks(const std::vector<int>& ranks);
/// True on every rank if `value` is true on any rank.
bool any_rank(bool value);

namespace detail {
void record_skip(const std::string& reason);
}
}  // namespace kshard::testing

#define KSHARD_DETAIL_EVAL(cond, ok, why)                                        \
  bool ok = false;                                                               \
  std::string why;                                                               \
  try {                                                                          \
    ok = static_cast<bool>(cond);                                                \
  } catch (const std::exception& e_) {                                           \
    why = std::string(" (threw: ") + e_.what() + ")";                            \
  } catch (...) {                                                                \
    why = " (threw a non-std exception)";                                        \
  }

/// Collective BOOST_CHECK: fails on every rank if `cond` is false on any.
#define KSHARD_CHECK_ALL(cond)                                                            \
  do {                                                                                    \
    KSHARD_DETAIL_EVAL(cond, kshard_ok_, kshard_why_)                                     \
    const auto kshard_ranks_ = ::kshard::testing::failing_ranks(!kshard_ok_);             \
    BOOST_CHECK_MESSAGE(kshard_ranks_.empty(),                                            \
                        "check " #cond " failed on ranks "                                \
                            << ::kshard::testing::format_ranks(kshard_ranks_) << kshard_why_); \
  } while (0)

/// Collective BOOST_CHECK_MESSAGE.
#define KSHARD_CHECK_ALL_MSG(cond, msg)                                                   \
  do {                                                                                    \
    KSHARD_DETAIL_EVAL(cond, kshard_ok_, kshard_why_)                                     \
    const auto kshard_ranks_ = ::kshard::testing::failing_ranks(!kshard_ok_);             \
    BOOST_CHECK_MESSAGE(kshard_ranks_.empty(),                                            \
                        msg << " [failed on ranks "                                       \
                            << ::kshard::testing::format_ranks(kshard_ranks_) << "]"      \
                            << kshard_why_);                                              \
  } while (0)

/// Collective BOOST_REQUIRE: every rank leaves the test together.
#define KSHARD_REQUIRE_ALL(cond)                                                          \
  do {                                                                                    \
    KSHARD_DETAIL_EVAL(cond, kshard_ok_, kshard_why_)                                     \
    const auto kshard_ranks_ = ::kshard::testing::failing_ranks(!kshard_ok_);             \
    BOOST_REQUIRE_MESSAGE(kshard_ranks_.empty(),                                          \
                          "requirement " #cond " failed on ranks "                        \
                              << ::kshard::testing::format_ranks(kshard_ranks_) << kshard_why_); \
  } while (0)

/// Collective BOOST_CHECK_THROW: `expr` must throw `Exc` on every rank.
#define KSHARD_CHECK_THROWS_ALL(expr, Exc)                                                \
  do {                                                                                    \
    bool kshard_threw_ = false;                                                           \
    std::string kshard_other_;                                                            \
    try {                                                                                 \
      (void)(expr);                                                                       \
    } catch (const Exc&) {                                                                \
      kshard_threw_ = true;                                                               \
    } catch (const std::exception& e_) {                                                  \
      kshard_other_ = std::string(" (threw another exception: ") + e_.what() + ")";       \
    }                                                                                     \
    const auto kshard_ranks_ = ::kshard::testing::failing_ranks(!kshard_threw_);          \
    BOOST_CHECK_MESSAGE(kshard_ranks_.empty(), #expr " did not throw " #Exc " on ranks "  \
                                                   << ::kshard::testing::format_ranks(kshard_ranks_) \
                                                   << kshard_other_);                     \
  } while (0)

/// Skips the rest of the test on every rank (if `cond` holds on any rank),
/// printing the reason once; the summary lists it.
#define KSHARD_SKIP_IF(cond, reason)                                                      \
  do {                                                                                    \
    if (::kshard::testing::any_rank(static_cast<bool>(cond))) {                           \
      std::ostringstream kshard_reason_;                                                  \
      kshard_reason_ << reason;                                                           \
      ::kshard::testing::detail::record_skip(kshard_reason_.str());                       \
      return;                                                                             \
    }                                                                                     \
  } while (0)
