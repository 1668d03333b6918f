// AsyncSaver: stage 1 and the snapshot on the calling thread, stage 2 on a
// std::thread, stage 3 when a later poll() finds every rank's write ended
// (save_stages.hpp). MPI is initialised MPI_THREAD_FUNNELED, so every
// message between ranks (agreements included) stays on the calling thread;
// the background thread only writes a file from host memory.
#include "kshard/checkpoint/async_save.hpp"

#include <atomic>
#include <chrono>
#include <exception>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "kshard/mesh/agree.hpp"
#include "save_stages.hpp"
#include "snapshot.hpp"

namespace kshard {
namespace {

using Clock = std::chrono::steady_clock;

double since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

}  // namespace

struct AsyncSaver::Impl {
  detail::Snapshot snapshot;  // kept across saves
  // The pending save (job set: pending).
  std::optional<detail::SaveJob> job;
  std::thread thread;
  // Set by the thread when it ends, after `error` and `local` (release /
  // acquire: the main thread reads them only once it sees done).
  std::atomic<bool> done{false};
  std::optional<Error> error;
  detail::LocalWrite local;
  Clock::time_point started;
  double blocked = 0;  // seconds the caller spent in start() and in poll()s so far

  void join() noexcept {
    if (thread.joinable()) thread.join();
  }
  /// Back to "nothing pending" (the thread joined).
  void clear() noexcept {
    join();
    job.reset();
    error.reset();
    local = {};
    done.store(false);
    blocked = 0;
  }
};

AsyncSaver::AsyncSaver() : impl_(std::make_unique<Impl>()) {}

AsyncSaver::~AsyncSaver() { impl_->join(); }

void AsyncSaver::reserve(FsdpModel& model, const FusedAdam& optimizer) {
  if (detail::writes_data(model.mesh())) impl_->snapshot.reserve(model, &optimizer);
}

bool AsyncSaver::pending() const noexcept { return impl_->job.has_value(); }

void AsyncSaver::start(const std::filesystem::path& save_dir, std::int64_t step, FsdpModel& model,
                       const FusedAdam& optimizer, const nlohmann::json& user_state,
                       const SaveOptions& options) {
  begin(save_dir, step, model, &optimizer, user_state, options);
}

void AsyncSaver::start(const std::filesystem::path& save_dir, std::int64_t step, FsdpModel& model,
                       const nlohmann::json& user_state, const SaveOptions& options) {
  begin(save_dir, step, model, nullptr, user_state, options);
}

void AsyncSaver::begin(const std::filesystem::path& save_dir, std::int64_t step, FsdpModel& model,
                       const FusedAdam* optimizer, const nlohmann::json& user_state,
                       const SaveOptions& options) {
  wait();  // one save at a time: the snapshot buffers are the pending save's
  Impl& s = *impl_;
  const auto t0 = Clock::now();
  s.started = t0;
  s.job = detail::begin_save(save_dir, step, model, optimizer, user_state, options);
  // From here on a failure on one rank must not throw on that rank alone
  // (the others would go on into the next collective): it becomes this
  // rank's outcome of the write, which the next poll() or wait() agrees on.
  s.error = run_local([&] {
    if (s.job->writer) s.snapshot.take(model, optimizer);
  });
  if (!s.error && s.job->writer) {
    try {
      s.thread = std::thread([&s] {
        std::optional<Error> err;
        detail::LocalWrite w;
        try {
          err = run_local([&] { w = detail::write_local_file(*s.job, s.snapshot); });
        } catch (...) {  // run_local catches std::exception; anything else
          err = Error("the background checkpoint write failed with an unknown exception",
                      "no error");
        }
        s.error = std::move(err);
        s.local = std::move(w);
        s.done.store(true, std::memory_order_release);
      });
    } catch (const std::exception& e) {
      s.error = Error(std::string("cannot start the checkpoint writer thread: ") + e.what(),
                      "a process that may start a thread");
    }
  }
  if (!s.thread.joinable()) s.done.store(true, std::memory_order_release);  // nothing to write
  s.blocked = since(t0);
}

std::optional<SaveInfo> AsyncSaver::poll() {
  Impl& s = *impl_;
  if (!s.job) return std::nullopt;
  const auto t0 = Clock::now();
  const bool finished = s.done.load(std::memory_order_acquire);
  // {some rank still writes, some rank failed}: max over the world.
  std::vector<std::int64_t> state = {finished ? 0 : 1, finished && s.error ? 1 : 0};
  host_all_reduce(s.job->world, state, ReduceOp::max);
  if (state[0] == 1 && state[1] == 0) {
    s.blocked += since(t0);
    return std::nullopt;
  }
  // All written, or some rank failed: then the others' writes are waited
  // for too, so that no thread still writes into the directory rank 0 removes.
  return finish(since(t0));
}

std::optional<SaveInfo> AsyncSaver::wait() {
  if (!impl_->job) return std::nullopt;
  return finish(0);
}

std::optional<SaveInfo> AsyncSaver::finish(double blocked_before) {
  Impl& s = *impl_;
  const auto t0 = Clock::now();
  s.join();
  try {
    SaveInfo info = detail::finish_save(*s.job, s.error, s.local);
    info.seconds = since(s.started);
    info.blocked_seconds = s.blocked + blocked_before + since(t0);
    s.clear();
    return info;
  } catch (...) {
    s.clear();  // failed: nothing pending any more
    throw;
  }
}

}  // namespace kshard
