#include "kshard/mesh/communicator.hpp"

#include <string>
#include <vector>

#include "comm_impl.hpp"
#include "trace_registry.hpp"
#include "value_ranges.hpp"

namespace kshard {
namespace detail {
namespace {

const char* kind_name(CollKind k) {
  switch (k) {
    case CollKind::all_gather: return "all_gather";
    case CollKind::reduce_scatter: return "reduce_scatter";
    case CollKind::all_reduce: return "all_reduce";
    case CollKind::broadcast: return "broadcast";
  }
  return "?";
}

std::string where(const CommImpl& impl, const char* op) {
  return std::string(op) + " on communicator '" + impl.name() + "' (" +
         backend_name(impl.backend()) + ", " + std::to_string(impl.size()) + " ranks)";
}

// All ranks agree on what they are about to do, or all throw (one small
// host reduction: value_ranges.hpp).
void check_agreement(CommImpl& impl, CollKind kind, const CollArgs& a) {
  const std::uint64_t count = kind == CollKind::reduce_scatter ? a.recv_count : a.send_count;
  const std::vector<std::int64_t> mine = {
      std::int64_t(kind), std::int64_t(a.dtype), std::int64_t(count),
      (kind == CollKind::reduce_scatter || kind == CollKind::all_reduce) ? std::int64_t(a.op) : 0,
      kind == CollKind::broadcast ? std::int64_t(a.root) : 0};
  const std::vector<ValueRange> r = value_ranges(impl.control(), mine);
  static const char* fields[] = {"the collective", "the dtype", "the element count",
                                 "the reduce op", "the root"};
  for (std::size_t i = 0; i < mine.size(); ++i) {
    const std::int64_t hi = r[i].hi, lo = r[i].lo;
    if (hi == lo) continue;
    std::string detail;
    if (i == 0)
      detail = "some ranks called " + std::string(kind_name(CollKind(lo))) + ", others " +
               kind_name(CollKind(hi));
    else if (i == 1)
      detail = std::string("dtypes range from ") + dtype_name(DType(lo)) + " to " +
               dtype_name(DType(hi)) + " (this rank: " + dtype_name(a.dtype) + ")";
    else
      detail = "values range from " + std::to_string(lo) + " to " + std::to_string(hi) +
               " (this rank: " + std::to_string(mine[i]) + ")";
    throw Error(where(impl, kind_name(kind)) + ": ranks disagree on " + fields[i] + ": " + detail,
                "every rank to call the same collective with the same dtype, count, op and root");
  }
}

class TracedOp final : public PendingOp {
 public:
  TracedOp(std::unique_ptr<PendingOp> inner, std::shared_ptr<CollectiveTrace> trace,
           std::uint64_t seq)
      : inner_(std::move(inner)), trace_(std::move(trace)), seq_(seq) {
    inflight_counter().fetch_add(1);
  }
  ~TracedOp() override {
    if (!done_) inflight_counter().fetch_sub(1);
  }
  void wait() override { complete(&PendingOp::wait); }
  // Finished as far as the host can tell: a collective that never completes
  // on the device shows up at the next fence, not in the trace.
  void wait_on_device() override { complete(&PendingOp::wait_on_device); }
  bool test() override { return done_ || inner_->test(); }

 private:
  void complete(void (PendingOp::*how)()) {
    if (done_) return;
    done_ = true;
    inflight_counter().fetch_sub(1);
    ((*inner_).*how)();
    trace_->finish(seq_);
  }

  std::unique_ptr<PendingOp> inner_;
  std::shared_ptr<CollectiveTrace> trace_;
  std::uint64_t seq_;
  bool done_ = false;
};

}  // namespace

[[noreturn]] void throw_size_error(const CommImpl& impl, const char* op, std::size_t got,
                                   std::size_t expected, const char* what) {
  throw Error(where(impl, op) + ": got " + std::to_string(got) + " " + what,
              std::to_string(expected) + " " + what);
}

[[noreturn]] void throw_layout_error(const CommImpl& impl, const char* op, const char* which) {
  throw Error(where(impl, op) + ": the " + std::string(which) + " View is not contiguous",
              "a contiguous View (e.g. a 1-D View or a subview of contiguous rows)");
}

Request run_collective(CommImpl& impl, CollKind kind, const CollArgs& a) {
  const bool reduces = kind == CollKind::reduce_scatter || kind == CollKind::all_reduce;
  if (reduces && !dtype_reducible(a.dtype))
    throw Error(where(impl, kind_name(kind)) + ": cannot reduce " + dtype_name(a.dtype),
                "a reducible dtype (f32, f64, bf16, f16, i32, i64, u8); fp8 is storage-only");
  if (kind == CollKind::broadcast && (a.root < 0 || a.root >= impl.size()))
    throw Error(where(impl, "broadcast") + ": root " + std::to_string(a.root) + " out of range",
                "0 <= root < " + std::to_string(impl.size()));
  // Traced from here: a rank stuck in the agreement check is stuck in this collective.
  const std::size_t bytes = a.send_count * dtype_size(a.dtype);
  const std::uint64_t seq = impl.trace().begin(kind_name(kind), bytes, dtype_name(a.dtype));
  if (impl.validate()) {
    try {
      check_agreement(impl, kind, a);
    } catch (...) {
      impl.trace().finish(seq);
      throw;
    }
  }
  std::unique_ptr<PendingOp> op = impl.collective(kind, a);
  if (!op) {
    impl.trace().finish(seq);
    return Request();
  }
  return Request(std::make_unique<TracedOp>(std::move(op), impl.trace_handle(), seq));
}

}  // namespace detail

int Communicator::rank() const { return impl().rank(); }
int Communicator::size() const { return impl().size(); }
Backend Communicator::backend() const { return impl().backend(); }
const std::string& Communicator::name() const { return impl().name(); }
void Communicator::barrier() const { impl().barrier(); }
void Communicator::set_validation(bool on) const { impl().set_validate(on); }
std::vector<TraceEntry> Communicator::trace() const { return impl().trace().last(); }

Communicator Communicator::split(int color, int key, const std::string& name) const {
  return Communicator(impl().split(color, key, name));
}

detail::CommImpl& Communicator::impl() const {
  if (!impl_)
    throw Error("use of a null kshard::Communicator",
                "a communicator from Session::world(), DeviceMesh::comm() or split()");
  return *impl_;
}

}  // namespace kshard
