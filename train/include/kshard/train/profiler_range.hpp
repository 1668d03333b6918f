#pragma once
// A window for a device profiler: what lies between start() and stop() is
// what `ncu --profile-from-start off` or `nsys profile --capture-range
// cudaProfilerApi` record, so one training step can be profiled without the
// start-up and the steps around it (a whole run under ncu takes minutes).
// CUDA: cudaProfilerStart / cudaProfilerStop; host backends: nothing.
namespace kshard {

class ProfilerRange {
 public:
  ProfilerRange() = default;
  ProfilerRange(const ProfilerRange&) = delete;
  ProfilerRange& operator=(const ProfilerRange&) = delete;
  ~ProfilerRange() { stop(); }

  /// Opens the window (once; a second start() does nothing).
  void start();
  /// Closes it after the device has finished the work queued so far.
  void stop();
  bool open() const { return open_; }

 private:
  bool open_ = false;
};

}  // namespace kshard
