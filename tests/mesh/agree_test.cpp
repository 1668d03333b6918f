// kshard/mesh/agree.hpp: one rank's failure becomes the same error on every
// rank, values that must match are checked, and the small host reductions
// give what a hand computation of the ranks' numbers gives.
#include <kshard/testing/harness.hpp>

#include <cstdint>
#include <exception>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <kshard/mesh/agree.hpp>

namespace kt = kshard::testing;
using kshard::ReduceOp;

namespace {

/// What agree_ok threw on this rank ("" when it returned).
template <class F>
std::string thrown(F&& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return {};
}

struct Special : std::runtime_error {
  using std::runtime_error::runtime_error;
};

}  // namespace

KSHARD_TEST_SUITE(agree)

BOOST_AUTO_TEST_CASE(no_failure_returns_everywhere) {
  const auto& world = kt::world();
  KSHARD_CHECK_ALL(thrown([&] { kshard::agree_ok(world, std::nullopt); }).empty());
  KSHARD_CHECK_ALL(thrown([&] { kshard::run_agreed(world, [] {}); }).empty());
  KSHARD_CHECK_ALL(thrown([&] { kshard::agree_ok(world, std::exception_ptr()); }).empty());
}

BOOST_AUTO_TEST_CASE(the_lowest_failing_rank_is_named_on_every_rank) {
  const auto& world = kt::world();
  const int P = world.size(), r = world.rank();
  // The upper half of the ranks fail, each with its own message; every rank
  // that did not fail gets the lowest failing rank's (its rank in it).
  const int first = P / 2;
  const std::string msg = thrown([&] {
    kshard::run_agreed(world, [&] {
      if (r >= first)
        throw kshard::Error("file " + std::to_string(r) + " is truncated", "a whole file");
    });
  });
  const std::string own = "file " + std::to_string(r) + " is truncated";
  const std::string lowest = "kshard error on rank " + std::to_string(first) + ": file " +
                             std::to_string(first) + " is truncated; expected a whole file";
  KSHARD_CHECK_ALL_MSG(r >= first ? msg.find(own) != std::string::npos : msg == lowest,
                       "rank " << r << " got: " << msg);
}

BOOST_AUTO_TEST_CASE(a_failing_rank_keeps_its_exception_type) {
  const auto& world = kt::world();
  const int P = world.size(), r = world.rank();
  std::exception_ptr local;
  if (r == P - 1) local = std::make_exception_ptr(Special("diverged"));
  bool special = false, error = false;
  std::string msg;
  try {
    kshard::agree_ok(world, local, "reading my file");
  } catch (const Special&) {
    special = true;
  } catch (const kshard::Error& e) {
    error = true;
    msg = e.what();
  }
  const bool ok = r == P - 1 ? special && !error
                             : error && msg.find("reading my file: diverged") != std::string::npos &&
                                   msg.find("rank " + std::to_string(P - 1)) != std::string::npos;
  KSHARD_CHECK_ALL_MSG(ok, "rank " << r << ": special " << special << ", error '" << msg << "'");
}

BOOST_AUTO_TEST_CASE(values_ride_along_and_come_back_as_the_maximum) {
  const auto& world = kt::world();
  const int P = world.size(), r = world.rank();
  std::vector<double> along = {double(r), -double(r), 0.5};
  kshard::agree_ok(world, std::nullopt, along);
  KSHARD_CHECK_ALL(along[0] == P - 1 && along[1] == 0 && along[2] == 0.5);
  // With a failure they do not matter, but every rank still throws.
  std::optional<kshard::Error> err;
  if (r == 0) err = kshard::Error("bad argument", "a good one");
  KSHARD_CHECK_THROWS_ALL(kshard::agree_ok(world, err, along), kshard::Error);
}

BOOST_AUTO_TEST_CASE(agree_same_names_the_field_that_differs) {
  const auto& world = kt::world();
  const int P = world.size(), r = world.rank();
  KSHARD_CHECK_ALL(kshard::disagreement(world, {{"the step", 7}, {"the size", 3}}).empty());
  const std::string d = kshard::disagreement(world, {{"the step", 7}, {"the size", r}});
  if (P == 1) {
    KSHARD_CHECK_ALL(d.empty());
    return;
  }
  const std::string want =
      "the size from 0 to " + std::to_string(P - 1) + " (this rank: " + std::to_string(r) + ")";
  KSHARD_CHECK_ALL_MSG(d == want, "got '" << d << "', want '" << want << "'");
  const std::string msg = thrown([&] {
    kshard::agree_same(world, "saving", {{"the step", r == 0 ? 5 : 6}}, "the same step");
  });
  KSHARD_CHECK_ALL_MSG(msg.find("saving: ranks disagree on the step from 5 to 6") != std::string::npos,
                       "got: " << msg);
}

BOOST_AUTO_TEST_CASE(host_reductions_match_a_hand_computation) {
  const auto& world = kt::world();
  const int P = world.size(), r = world.rank();
  std::vector<double> d = {double(r), 1.0};
  kshard::host_all_reduce(world, d, ReduceOp::sum);
  KSHARD_CHECK_ALL(d[0] == P * (P - 1) / 2.0 && d[1] == P);
  d = {double(r)};
  kshard::host_all_reduce(world, d, ReduceOp::avg);
  KSHARD_CHECK_ALL(d[0] == (P - 1) / 2.0);
  std::vector<std::int64_t> i = {r, -r, std::int64_t(1) << 40};
  kshard::host_all_reduce(world, i, ReduceOp::max);
  KSHARD_CHECK_ALL(i[0] == P - 1 && i[1] == 0 && i[2] == (std::int64_t(1) << 40));
  i = {r};
  kshard::host_all_reduce(world, i, ReduceOp::min);
  KSHARD_CHECK_ALL(i[0] == 0);
  // A mean of integers is refused before any message, on every rank alike.
  KSHARD_CHECK_THROWS_ALL(kshard::host_all_reduce(world, i, ReduceOp::avg), kshard::Error);
}

BOOST_AUTO_TEST_CASE(host_gather_collects_every_rank_in_order) {
  const auto& world = kt::world();
  const int P = world.size(), r = world.rank();
  const int root = P - 1;
  // Different lengths, one of them empty.
  const std::string mine = r == 0 ? std::string() : std::string(std::size_t(r) * 3, char('a' + r));
  const auto all = kshard::host_gather(world, mine, root);
  bool ok = int(all.size()) == (r == root ? P : 0);
  for (int q = 0; ok && q < int(all.size()); ++q)
    ok = all[std::size_t(q)] == (q == 0 ? std::string() : std::string(std::size_t(q) * 3, char('a' + q)));
  KSHARD_CHECK_ALL(ok);
  KSHARD_CHECK_THROWS_ALL(kshard::host_gather(world, mine, P), kshard::Error);
}

KSHARD_TEST_SUITE_END()
