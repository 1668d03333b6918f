#include "kshard/engine/fsdp/sharded_group.hpp"

#include "kshard/kernels/cast.hpp"
#include "kshard/engine/nn/init.hpp"
#include "kshard/error.hpp"
#include "wire_format.hpp"

#include <algorithm>

namespace kshard {
namespace {

Kokkos::View<float*> alloc_f32(const std::string& label, std::size_t n, bool zero) {
  if (zero) return Kokkos::View<float*>(label, n);
  return Kokkos::View<float*>(Kokkos::view_alloc(label, Kokkos::WithoutInitializing), n);
}

}  // namespace

const char* state_name(ParamState s) noexcept {
  switch (s) {
    case ParamState::sharded: return "sharded";
    case ParamState::gathering: return "gathering";
    default: return "unsharded";
  }
}

const char* state_name(GradState s) noexcept {
  switch (s) {
    case GradState::none: return "none";
    case GradState::accumulating: return "accumulating";
    default: return "reducing";
  }
}

void ShardedGroup::bad_transition(const char* what, const char* state,
                                  const char* expected) const {
  throw Error(std::string(what) + " of group '" + name_ + "' in state " + state, expected);
}

ShardedGroup::ShardedGroup(std::string name, const std::vector<ParamSpec>& specs,
                           const DeviceMesh& mesh, Recipe recipe, bool keep_low_precision_shard)
    : name_(std::move(name)),
      recipe_(std::move(recipe)),
      index_(specs, mesh.shard_size(), ParamIndex::default_align, recipe_.fp8_block),
      shard_comm_(mesh.shard_comm()),
      replicate_comm_(mesh.replicate_comm()),
      shard_rank_(mesh.shard_comm().rank()) {
  const std::size_t shard = std::size_t(index_.shard_numel());
  master_ = alloc_f32(name_ + ".master", shard, true);
  grad_ = alloc_f32(name_ + ".grad", shard, true);
  grad_stats_ = Kokkos::View<double*>(name_ + ".grad_stats", 2);
  detail::WireFormat wire = detail::make_wire_format(context(), keep_low_precision_shard);
  gather_wire_ = std::move(wire.gather);
  reduce_wire_ = std::move(wire.reduce);
  refresh_low_precision();
}

ShardedGroup::ShardedGroup(ShardedGroup&&) = default;
ShardedGroup::~ShardedGroup() = default;

detail::ShardContext ShardedGroup::context() const {
  return {name_, index_, recipe_, shard_comm_, replicate_comm_, master_, grad_, grad_stats_};
}

void ShardedGroup::init_parameters(std::uint64_t seed) {
  const std::int64_t first = index_.shard_range(shard_rank_).first;
  for (std::size_t i = 0; i < index_.size(); ++i) {
    const ParamEntry& e = index_.entry(i);
    for (const auto& p : index_.pieces_in_shard(i, shard_rank_)) {
      auto dst = Kokkos::subview(master_, std::make_pair(p.flat_begin - first,
                                                         p.flat_begin - first + p.count));
      fill_init<float>(dst, e.init, seed, name_ + "." + e.name, p.param_begin);
    }
  }
  refresh_low_precision();
}

void ShardedGroup::set_full_parameters(Kokkos::View<const float*> flat) {
  if (std::int64_t(flat.extent(0)) != index_.flat_numel())
    throw Error("set_full_parameters of '" + name_ + "' with " + std::to_string(flat.extent(0)) +
                    " elements",
                std::to_string(index_.flat_numel()) + " (the padded flat buffer)");
  const auto [b, e] = index_.shard_range(shard_rank_);
  Kokkos::deep_copy(master_, Kokkos::subview(flat, std::make_pair(b, e)));
  refresh_low_precision();
}

LowPrecisionShard ShardedGroup::low_precision_shard() const noexcept {
  return gather_wire_->low_precision_shard();
}

void ShardedGroup::refresh_low_precision() { gather_wire_->refresh(context()); }

void ShardedGroup::start_unshard() {
  if (param_state_ != ParamState::sharded) return;
  gather_req_ = gather_wire_->start(context(), compute_);
  param_state_ = ParamState::gathering;
}

void ShardedGroup::finish_unshard() {
  if (param_state_ == ParamState::unsharded) return;
  if (param_state_ == ParamState::sharded) start_unshard();
  // The compute stream waits for the gather; the host does not, so the
  // kernels queued before (the previous unit's compute) keep the GPU busy.
  gather_req_.wait_on_device();
  gather_req_ = Request();
  gather_wire_->finish(context(), compute_);
  param_state_ = ParamState::unsharded;
}

void ShardedGroup::check_compute_type(DType t, const char* what) const {
  if (param_state_ != ParamState::unsharded)
    bad_transition(what, state_name(param_state_), "unsharded: unshard() (or finish_unshard()) first");
  if (t != recipe_.compute_dtype)
    throw Error(std::string(what) + "<" + dtype_name(t) + "> of group '" + name_ + "'",
                std::string("the recipe's compute dtype ") + dtype_name(recipe_.compute_dtype));
}

template <class T>
std::vector<Kokkos::View<const T*>> ShardedGroup::params() const {
  check_compute_type(dtype_of<T>::value, "params");
  std::vector<Kokkos::View<const T*>> v;
  for (const ParamEntry& e : index_.entries())
    v.push_back(compute_.view<const T>(std::size_t(e.numel), std::size_t(e.offset) * sizeof(T)));
  return v;
}

template <class T>
Kokkos::View<const T*> ShardedGroup::flat_params() const {
  check_compute_type(dtype_of<T>::value, "flat_params");
  return compute_.view<const T>(std::size_t(index_.flat_numel()));
}

template std::vector<Kokkos::View<const float*>> ShardedGroup::params<float>() const;
template std::vector<Kokkos::View<const bfloat16_t*>> ShardedGroup::params<bfloat16_t>() const;
template std::vector<Kokkos::View<const float16_t*>> ShardedGroup::params<float16_t>() const;
template Kokkos::View<const float*> ShardedGroup::flat_params<float>() const;
template Kokkos::View<const bfloat16_t*> ShardedGroup::flat_params<bfloat16_t>() const;
template Kokkos::View<const float16_t*> ShardedGroup::flat_params<float16_t>() const;

void ShardedGroup::reshard() {
  if (param_state_ == ParamState::gathering) finish_unshard();  // a collective in flight completes first
  compute_.reset();
  param_state_ = ParamState::sharded;
}

bool ShardedGroup::grads_unwritten() const {
  if (grad_state_ != GradState::none) return false;
  // In the shard: only a pending zero_grad() leaves nothing to keep; a fresh
  // unsharded buffer holds nothing by construction.
  return reduce_wire_->accumulates_in_shard(context()) ? shard_grad_ == ShardGrad::zero_pending
                                                        : true;
}

const std::vector<Kokkos::View<float*>>& ShardedGroup::unsharded_grads(GradWrite write) {
  if (write == GradWrite::none)
    throw Error("ShardedGroup '" + name_ + "': unsharded_grads(none)", "add or assign");
  if (write == GradWrite::assign && !grads_unwritten())
    throw Error("ShardedGroup '" + name_ + "': unsharded_grads(assign) over gradients that hold "
                "values (state " + std::string(state_name(grad_state_)) + ")",
                "assign only while grads_unwritten(): the first backward after zero_grad() "
                "or a reduction");
  if (grad_state_ == GradState::accumulating) return grad_views_;
  if (grad_state_ == GradState::reducing)
    bad_transition("unsharded_grads", state_name(grad_state_),
                   "none or accumulating: finish_reduce_grads() before the next backward");
  grad_views_.clear();
  const bool assign = write == GradWrite::assign;
  if (reduce_wire_->accumulates_in_shard(context())) {
    // The shard is the whole flat gradient here (one rank, one replica): the
    // layers accumulate into it (zeroed first if zero_grad() is pending), or
    // assign it (its gaps and padding were zeroed at allocation and nothing
    // but the fill writes them).
    if (assign)
      shard_grad_ = ShardGrad::current;
    else
      settle_grad();
    Kokkos::View<float*> shard = grad_;
    for (const ParamEntry& e : index_.entries())
      grad_views_.push_back(Kokkos::subview(
          shard, std::make_pair(std::size_t(e.offset), std::size_t(e.offset + e.numel))));
    grads_in_shard_ = true;
  } else {
    const std::size_t flat = std::size_t(index_.flat_numel());
    grad_full_ = memory::acquire(4 * flat, (name_ + ".grad_full").c_str());
    if (assign)
      zero_grad_gaps(grad_full_.view<float>(flat));
    else
      fill<float>(grad_full_.view<float>(flat), 0.0f);
    for (const ParamEntry& e : index_.entries())
      grad_views_.push_back(
          grad_full_.view<float>(std::size_t(e.numel), 4 * std::size_t(e.offset)));
  }
  grad_state_ = GradState::accumulating;
  return grad_views_;
}

void ShardedGroup::start_reduce_grads() {
  if (grad_state_ == GradState::reducing) return;
  unsharded_grads();  // a rank with nothing to add still takes part, with zeros
  grad_state_ = GradState::reducing;
  if (grads_in_shard_) {  // accumulated in place: finish() computes statistics only
    reduce_write_ = GradWrite::none;
    reduce_req_ = Request();
    return;
  }
  // A shard zeroed by zero_grad() is written, not added to.
  reduce_write_ = shard_grad_ == ShardGrad::zero_pending ? GradWrite::assign : GradWrite::add;
  shard_grad_ = ShardGrad::current;
  reduce_req_ = reduce_wire_->start(context(), grad_full_, reduce_write_);
  if (!reduce_wire_->reads_full_until_finish()) {
    grad_views_.clear();
    grad_full_.reset();
  }
}

void ShardedGroup::finish_reduce_grads() {
  if (grad_state_ != GradState::reducing) start_reduce_grads();
  // Device-side waits only: the reduction overlaps the backward kernels queued
  // after it started, and nothing here blocks the host.
  reduce_req_.wait_on_device();
  reduce_req_ = Request();
  // (HSDP) average over the replicas, then accumulate into the shard,
  // computing the optimizer's statistics on the way (into grad_stats_, on the
  // device).
  reduce_wire_->finish(context(), grad_full_, reduce_write_);
  // Back to the pool with the accumulation still queued: safe, because every
  // later user of the block is ordered after it.
  grad_views_.clear();
  grad_full_.reset();
  grads_in_shard_ = false;
  grad_state_ = GradState::none;
}

namespace {
// v(at(i)) = 0 for every i (a device lambda may not live in a private member).
void zero_at(Kokkos::View<const std::int64_t*> at, Kokkos::View<float*> v) {
  if (at.extent(0) == 0) return;
  Kokkos::parallel_for(
      "kshard::zero_grad_gaps", Kokkos::RangePolicy<>(0, at.extent(0)),
      KOKKOS_LAMBDA(std::size_t i) { v(at(i)) = 0.0f; });
}
}  // namespace

void ShardedGroup::zero_grad_gaps(Kokkos::View<float*> full) {
  if (!grad_gaps_built_) {
    std::vector<std::int64_t> gaps;
    std::int64_t at = 0;
    for (const ParamEntry& e : index_.entries()) {
      for (; at < e.offset; ++at) gaps.push_back(at);
      at = e.offset + e.numel;
    }
    for (; at < index_.flat_numel(); ++at) gaps.push_back(at);
    grad_gaps_ = Kokkos::View<std::int64_t*>(name_ + ".grad_gaps", gaps.size());
    Kokkos::deep_copy(grad_gaps_, Kokkos::View<const std::int64_t*, Kokkos::HostSpace,
                                                Kokkos::MemoryTraits<Kokkos::Unmanaged>>(
                                      gaps.data(), gaps.size()));
    grad_gaps_built_ = true;
  }
  zero_at(grad_gaps_, full);
}

void ShardedGroup::settle_grad() {
  if (shard_grad_ != ShardGrad::zero_pending) return;
  fill<float>(grad_, 0.0f);
  shard_grad_ = ShardGrad::current;
}

GradShardStats ShardedGroup::grad_stats() const {
  auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), grad_stats_);
  return GradShardStats{h(0), std::int64_t(h(1))};
}

std::vector<float> ShardedGroup::gather_master() const {
  Kokkos::View<float*> full(Kokkos::view_alloc(name_ + ".gather_master", Kokkos::WithoutInitializing),
                            std::size_t(index_.flat_numel()));
  shard_comm_.all_gather(master_, full);
  std::int64_t end = 0;
  for (const auto& e : index_.entries()) end = std::max(end, e.offset + e.numel);
  auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), full);
  return std::vector<float>(h.data(), h.data() + end);
}

void ShardedGroup::zero_grad() {
  if (grad_state_ == GradState::reducing)
    bad_transition("zero_grad", state_name(grad_state_),
                   "none or accumulating: finish_reduce_grads() first");
  fill<double>(grad_stats_, 0.0);
  if (grad_state_ == GradState::accumulating) {
    // Backward has accumulated and nothing is reduced yet (no_sync
    // micro-batches): those gradients go too (as FSDP2's zero_grad drops
    // unsharded gradients). In the shard itself: now.
    if (grads_in_shard_) {
      fill<float>(grad_, 0.0f);
      shard_grad_ = ShardGrad::current;
      grads_in_shard_ = false;
      grad_views_.clear();
      grad_state_ = GradState::none;
      return;
    }
    grad_views_.clear();
    grad_full_.reset();
    grad_state_ = GradState::none;
  }
  shard_grad_ = ShardGrad::zero_pending;  // the next reduction writes the shard (no fill now)
}

std::size_t ShardedGroup::persistent_bytes() const noexcept {
  return master_.span() * 4 + grad_.span() * 4 + gather_wire_->persistent_bytes();
}

std::size_t ShardedGroup::unsharded_bytes() const noexcept {
  const detail::ShardContext c = context();
  return gather_wire_->compute_bytes(c) + gather_wire_->gather_bytes(c);
}

}  // namespace kshard
