// Token files: the windows a Trainer trains on are the documented ones, the
// same global batch for any world size; bad files are kshard::Error on every
// rank (no hang), naming the file.
#include <kshard/testing/harness.hpp>

#include <algorithm>
#include <map>
#include <set>
#include <sstream>

#include <kshard/train/token_file.hpp>
#include <kshard/train/trainer.hpp>

#include "train_test_util.hpp"

namespace kt = kshard::testing;
using namespace train_test;

namespace {

/// Passes a TokenFile through, recording the ids of every sequence it hands
/// out, keyed by global sequence number.
class Recorder final : public kshard::TokenSource {
 public:
  explicit Recorder(const kshard::TokenFile& f) : f_(f) {}
  void fill(std::uint64_t seed, std::int64_t first, std::int64_t count, std::int64_t seq,
            std::int32_t* ids, std::int32_t* targets) const override {
    f_.fill(seed, first, count, seq, ids, targets);
    for (std::int64_t i = 0; i < count; ++i) {
      seen[first + i] = std::vector<std::int32_t>(ids + i * seq, ids + (i + 1) * seq);
      seen_targets[first + i] = std::vector<std::int32_t>(targets + i * seq, targets + (i + 1) * seq);
    }
  }
  std::string describe() const override { return f_.describe(); }
  mutable std::map<std::int64_t, std::vector<std::int32_t>> seen, seen_targets;

 private:
  const kshard::TokenFile& f_;
};

/// Global sequences used by `steps` Trainer steps on the first `n` ranks with
/// `batch` sequences per rank and `accum` micro-batches, gathered to every rank:
/// (sequence number -> its ids), checked against the file's bytes.
struct Windows {
  std::set<std::int64_t> numbers;  // union over the ranks
  std::string problem;             // first mismatch against the file, if any
};

Windows train_windows(int n, std::int64_t batch, int accum, int steps, std::uint64_t seed,
                      const std::string& path, const std::vector<std::uint32_t>& tokens) {
  const auto& world = kt::world();
  const kshard::Communicator comm = first_ranks(world, n);
  Windows w;
  std::vector<double> mine;
  if (world.rank() < n) {
    const kshard::DeviceMesh mesh(comm, {n});
    const kshard::TokenFile file = kshard::TokenFile::open(comm, path, kshard::TokenDType::u16, kVocab, kSeq + 1);
    const Recorder rec(file);
    kshard::TrainerOptions o;
    o.batch = batch;
    o.seq = kSeq;
    o.accum = accum;
    o.data_seed = seed;
    kshard::FsdpModel model(mesh, tiny_lm(), kshard::Recipe::parse("fp32"));
    model.init_parameters(1);
    kshard::Trainer trainer(std::move(model), o);
    for (int s = 0; s < steps; ++s) trainer.step(rec);
    for (const auto& [g, ids] : rec.seen) {
      mine.push_back(double(g));
      // The documented window: offset splitmix64(seed, g) mod (N - seq),
      // read here from the test's own copy of the tokens.
      const std::int64_t off = file.window_offset(seed, g, kSeq);
      for (std::int64_t k = 0; k < kSeq; ++k)
        if (ids[std::size_t(k)] != std::int32_t(tokens[std::size_t(off + k)]) ||
            rec.seen_targets[g][std::size_t(k)] != std::int32_t(tokens[std::size_t(off + k + 1)])) {
          if (w.problem.empty())
            w.problem = "sequence " + std::to_string(g) + " is not the window at " + std::to_string(off);
        }
      if ((off < 0 || off + kSeq >= std::int64_t(tokens.size())) && w.problem.empty())
        w.problem = "offset " + std::to_string(off) + " out of range";
    }
  }
  // Gather the sequence numbers of every rank (same count on every rank of the run).
  const std::size_t per_rank = std::size_t(steps * accum) * std::size_t(batch);
  std::vector<double> all(per_rank * std::size_t(world.size()), -1.0);
  mine.resize(per_rank, -1.0);
  Kokkos::View<double*, Kokkos::HostSpace> send(mine.data(), per_rank), recv(all.data(), all.size());
  world.all_gather(send, recv);
  for (double g : all)
    if (g >= 0) w.numbers.insert(std::int64_t(g));
  return w;
}

}  // namespace

KSHARD_TEST_SUITE(token_data)

// The same global batches (sequence numbers 0 .. steps x 8 - 1, each the
// documented window) at 1 rank x 8, 2 x 4, 4 x 2 and 2 x 2 x 2 micro-batches.
BOOST_AUTO_TEST_CASE(windows_are_the_same_for_any_world_size) {
  const auto& world = kt::world();
  KSHARD_SKIP_IF(world.size() < 4, "needs 4 ranks, have " << world.size());
  const auto tokens = make_tokens(3000, 11);
  const TempTokenFile f("windows", world.rank(), tokens);
  std::set<std::int64_t> want;
  for (std::int64_t g = 0; g < 3 * 8; ++g) want.insert(g);
  struct Run { int n; std::int64_t batch; int accum; };
  for (const Run r : {Run{1, 8, 1}, Run{2, 4, 1}, Run{4, 2, 1}, Run{2, 2, 2}}) {
    const Windows w = train_windows(r.n, r.batch, r.accum, 3, 42, f.path(), tokens);
    KSHARD_CHECK_ALL_MSG(w.problem.empty(), r.n << " ranks: " << w.problem);
    KSHARD_CHECK_ALL_MSG(w.numbers == want, r.n << " ranks x " << r.batch << " x " << r.accum
                                                << ": other sequence numbers");
  }
}

// Offsets: a pure function of (seed, sequence number), spread over the file.
BOOST_AUTO_TEST_CASE(offsets_are_deterministic_and_seeded) {
  const auto& world = kt::world();
  const auto tokens = make_tokens(5000, 12);
  const TempTokenFile f("offsets", world.rank(), tokens);
  const kshard::TokenFile a(f.path(), kshard::TokenDType::u16, kVocab, kSeq + 1);
  const kshard::TokenFile b(f.path(), kshard::TokenDType::u16, kVocab, kSeq + 1);
  bool same = true, in_range = true;
  int differ = 0;
  std::set<std::int64_t> distinct;
  for (std::int64_t g = 0; g < 200; ++g) {
    const std::int64_t o = a.window_offset(1, g, kSeq);
    same = same && o == b.window_offset(1, g, kSeq);
    in_range = in_range && o >= 0 && o + kSeq < 5000;
    differ += o != a.window_offset(2, g, kSeq);
    distinct.insert(o);
  }
  KSHARD_CHECK_ALL(same && in_range);
  KSHARD_CHECK_ALL(differ > 190);           // another seed, another stream
  KSHARD_CHECK_ALL(distinct.size() > 190);  // no clumping on a few offsets
  // uint32 files read the same ids.
  const TempTokenFile f32("u32", world.rank(), tokens, 4);
  const kshard::TokenFile c(f32.path(), kshard::TokenDType::u32, kVocab, kSeq + 1);
  std::vector<std::int32_t> x(100), y(100);
  a.read(1234, 100, x.data());
  c.read(1234, 100, y.data());
  KSHARD_CHECK_ALL(x == y && c.num_tokens() == 5000);
}

// Every kind of bad file is a kshard::Error on every rank, naming the file.
BOOST_AUTO_TEST_CASE(bad_files_fail_on_every_rank) {
  const auto& world = kt::world();
  const auto tokens = make_tokens(2000, 13);
  const TempTokenFile odd("odd", world.rank(), tokens, 2, 1);    // 4001 bytes of uint16
  const TempTokenFile tiny("tiny", world.rank(), std::vector<std::uint32_t>(kSeq, 1u));  // seq tokens
  std::vector<std::uint32_t> big_ids = tokens;
  // Ids out of range: one inside the evaluation windows used below (token
  // 1500), three after them.
  for (std::size_t at : {1500, 1700, 1800, 1900}) big_ids[at] = kVocab;
  const TempTokenFile big("bigid", world.rank(), big_ids);
  const TempTokenFile good("good", world.rank(), tokens);
  auto open = [&](const std::string& p) {
    return kshard::TokenFile::open(world, p, kshard::TokenDType::u16, kVocab, kSeq + 1);
  };
  auto names_file = [&](const std::string& p) {
    try {
      open(p);
    } catch (const kshard::Error& e) {
      return std::string(e.what()).find(p) != std::string::npos;
    }
    return false;
  };
  KSHARD_CHECK_THROWS_ALL(open("/nonexistent/kshard/train.bin"), kshard::Error);
  KSHARD_CHECK_THROWS_ALL(open(odd.path()), kshard::Error);
  KSHARD_CHECK_THROWS_ALL(open(tiny.path()), kshard::Error);
  KSHARD_CHECK_ALL(names_file(odd.path()) && names_file(tiny.path()) &&
                   names_file("/nonexistent/kshard/train.bin"));
  // A file that only rank 0 can open (at 1 rank there is no other rank).
  if (world.size() > 1)
    KSHARD_CHECK_THROWS_ALL(
        open(world.rank() == 0 ? good.path() : std::string("/nonexistent/x.bin")), kshard::Error);
  // uint32 read of a uint16 file: ids out of range (or a size that does not divide).
  const TempTokenFile u16_as_u32("u16", world.rank(), std::vector<std::uint32_t>{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20});
  kshard::TokenFile wide(u16_as_u32.path(), kshard::TokenDType::u32, kVocab, 1);
  std::vector<std::int32_t> tmp(4);
  KSHARD_CHECK_THROWS_ALL(wide.read(0, 4, tmp.data()), kshard::Error);

  // An id >= vocab inside the windows of some ranks only: the step fails on
  // every rank, before any collective of the step.
  const kshard::DeviceMesh mesh(world, {world.size()});
  const kshard::TokenFile bad = open(big.path());
  kshard::TrainerOptions o;
  o.batch = 64;  // 64 x world windows of 9 tokens out of 2000: the bad id is hit
  o.seq = kSeq;
  kshard::FsdpModel model(mesh, tiny_lm(), kshard::Recipe::parse("fp32"));
  kshard::Trainer trainer(std::move(model), o);
  std::string msg;
  try {
    for (int s = 0; s < 4; ++s) trainer.step(bad);
  } catch (const kshard::Error& e) {
    msg = e.what();
  }
  KSHARD_CHECK_ALL_MSG(msg.find(big.path()) != std::string::npos, "message: " << msg);
  // Evaluation (tokens 0 .. 1536): only window 187 (tokens 1496 .. 1504)
  // holds a bad id; with batch 64 one rank reads it (4 ranks: rank 2 in the
  // first pass; 2 ranks: rank 0 in the second, after a forward pass).
  std::string eval_msg;
  try {
    trainer.evaluate(bad, 3);
  } catch (const kshard::Error& e) {
    eval_msg = e.what();
  }
  KSHARD_CHECK_ALL_MSG(eval_msg.find(big.path()) != std::string::npos, "message: " << eval_msg);
  // The trainer is still usable on good data afterwards (no rank was left behind).
  const kshard::TokenFile ok = open(good.path());
  KSHARD_CHECK_ALL(std::isfinite(trainer.step(ok).loss));
}

KSHARD_TEST_SUITE_END()
