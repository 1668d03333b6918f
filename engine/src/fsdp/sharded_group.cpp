#include "kshard/engine/fsdp/sharded_group.hpp"

#include "kshard/engine/kernels/cast.hpp"
#include "kshard/engine/kernels/fp8_block.hpp"
#include "kshard/engine/nn/init.hpp"
#include "kshard/error.hpp"

#include <algorithm>
#include <type_traits>

namespace kshard {
namespace {

template <class T>
using Unmanaged = Kokkos::View<T*, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;

/// A typed window onto a byte buffer (the buffers below change dtype by recipe).
template <class T>
Unmanaged<T> typed(const Kokkos::View<std::uint8_t*>& bytes, std::size_t offset_bytes, std::size_t n) {
  return Unmanaged<T>(reinterpret_cast<T*>(bytes.data() + offset_bytes), n);
}

Kokkos::View<std::uint8_t*> alloc_bytes(const std::string& label, std::size_t n) {
  return Kokkos::View<std::uint8_t*>(Kokkos::view_alloc(label, Kokkos::WithoutInitializing), n);
}
Kokkos::View<float*> alloc_f32(const std::string& label, std::size_t n, bool zero) {
  if (zero) return Kokkos::View<float*>(label, n);
  return Kokkos::View<float*>(Kokkos::view_alloc(label, Kokkos::WithoutInitializing), n);
}

bool is_16bit(DType t) { return t == DType::bf16 || t == DType::f16; }

/// Calls f(T{}) with T the storage type of a 16-bit dtype (bf16 or f16), so
/// each buffer operation is written once for both.
template <class F>
void with_16bit_type(DType t, F&& f) {
  if (t == DType::bf16)
    f(bfloat16_t{});
  else
    f(float16_t{});
}

}  // namespace

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
  if (is_16bit(recipe_.gather_dtype) && keep_low_precision_shard)
    lp_shard_ = alloc_bytes(name_ + ".shard_lp", 2 * shard);
  else if (recipe_.fp8_init)
    lp_shard_ = alloc_bytes(name_ + ".shard_fp8", fp8_segment_bytes());
  refresh_low_precision();
}

std::size_t ShardedGroup::fp8_segment_bytes() const noexcept {
  const std::size_t shard = std::size_t(index_.shard_numel());
  return shard + sizeof(float) * fp8_num_blocks(shard, recipe_.fp8_block);
}

void ShardedGroup::fp8_pack(std::uint8_t* packed) const {
  const std::size_t shard = std::size_t(index_.shard_numel());
  fp8_quantize(master_, Unmanaged<float8_e4m3_t>(reinterpret_cast<float8_e4m3_t*>(packed), shard),
               Unmanaged<float>(reinterpret_cast<float*>(packed + shard),
                                fp8_num_blocks(shard, recipe_.fp8_block)),
               recipe_.fp8_block);
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

LowPrecisionShard ShardedGroup::model_param() const noexcept {
  // A raw view: the group outlives the optimizer's use of it (the Trainer
  // owns both; the optimizer is destroyed first).
  if (is_16bit(recipe_.gather_dtype) && lp_shard_.data())
    return LowPrecisionShard::raw(recipe_.gather_dtype, lp_shard_.data(),
                                  std::size_t(index_.shard_numel()));
  return {};
}

void ShardedGroup::refresh_low_precision() {
  const std::size_t shard = std::size_t(index_.shard_numel());
  if (is_16bit(recipe_.gather_dtype) && lp_shard_.data())
    with_16bit_type(recipe_.gather_dtype, [&](auto tag) {
      using T = decltype(tag);
      cast_from_f32<T>(master_, typed<T>(lp_shard_, 0, shard));
    });
  else if (recipe_.fp8_init)
    fp8_pack(lp_shard_.data());
}

void ShardedGroup::start_unshard() {
  if (unsharded_ || gather_started_) return;
  const std::size_t shard = std::size_t(index_.shard_numel());
  const std::size_t flat = std::size_t(index_.flat_numel());
  const std::string label = name_ + ".full";
  switch (recipe_.gather_dtype) {
    case DType::f32:
      // The gathered buffer IS the compute buffer: every parameter is a View into it.
      compute_ = memory::acquire(4 * flat, label.c_str());
      gather_req_ = shard_comm_.all_gather_async(master_, compute_.view<float>(flat));
      break;
    case DType::bf16:
    case DType::f16:
      // Likewise in 16 bits: the layers compute on the gathered values as they
      // are. The all-gather input is the kept low-precision shard, or (FSDP2's
      // way, the default) the master cast into a pool block now.
      compute_ = memory::acquire(2 * flat, label.c_str());
      with_16bit_type(recipe_.gather_dtype, [&](auto tag) {
        using T = decltype(tag);
        Kokkos::View<const T*> src;
        if (lp_shard_.data()) {
          src = typed<T>(lp_shard_, 0, shard);
        } else if (shard_comm_.size() == 1) {
          // One rank per shard: the all-gather would only copy the cast
          // shard; cast into the compute buffer instead (one pass, no send
          // block); the request is a completed one.
          cast_from_f32<T>(master_, compute_.view<T>(flat));
          gather_req_ = Request();
          return;
        } else {
          send_tmp_ = memory::acquire(2 * shard, (name_ + ".send_lp").c_str());
          cast_from_f32<T>(master_, send_tmp_.view<T>(shard));
          src = send_tmp_.view<T>(shard);
        }
        gather_req_ = shard_comm_.all_gather_async(src, compute_.view<T>(flat));
      });
      break;
    case DType::e4m3: {
      // ONE all-gather of [fp8 values | block scales] per rank.
      const std::size_t seg = fp8_segment_bytes();
      Kokkos::View<const std::uint8_t*> src = lp_shard_;
      if (!recipe_.fp8_init) {
        send_tmp_ = memory::acquire(seg, (name_ + ".fp8_send").c_str());
        fp8_pack(send_tmp_.data());
        src = send_tmp_.view<std::uint8_t>(seg);
      }
      gathered_ = memory::acquire(seg * std::size_t(index_.shard_size()),
                                  (name_ + ".gathered").c_str());
      gather_req_ = shard_comm_.all_gather_async(
          src, gathered_.view<std::uint8_t>(seg * std::size_t(index_.shard_size())));
      break;
    }
    default:
      throw Error("recipe '" + recipe_.name + "' gathers " + dtype_name(recipe_.gather_dtype),
                  "f32, bf16, f16 or e4m3");
  }
  gather_started_ = true;
}

void ShardedGroup::finish_unshard() {
  if (unsharded_) return;
  if (!gather_started_) start_unshard();
  // The compute stream waits for the gather; the host does not, so the
  // kernels queued before (the previous unit's compute) keep the GPU busy.
  gather_req_.wait_on_device();
  gather_started_ = false;
  send_tmp_.reset();
  if (recipe_.gather_dtype == DType::e4m3) {
    // Dequantize each rank's segment straight into the bf16 compute buffer.
    const std::size_t shard = std::size_t(index_.shard_numel());
    const std::size_t flat = std::size_t(index_.flat_numel());
    const std::size_t seg = fp8_segment_bytes();
    const std::size_t nb = fp8_num_blocks(shard, recipe_.fp8_block);
    compute_ = memory::acquire(2 * flat, (name_ + ".full").c_str());
    for (int r = 0; r < index_.shard_size(); ++r) {
      const std::size_t base = std::size_t(r) * seg;
      fp8_dequantize(gathered_.view<float8_e4m3_t>(shard, base),
                     gathered_.view<float>(nb, base + shard),
                     compute_.view<bfloat16_t>(shard, 2 * std::size_t(r) * shard),
                     recipe_.fp8_block);
    }
    gathered_.reset();
  }
  unsharded_ = true;
}

void ShardedGroup::check_compute_type(DType t, const char* what) const {
  if (!unsharded_)
    throw Error(std::string(what) + " of group '" + name_ + "' while it is sharded",
                "unshard() (or finish_unshard()) first");
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

Kokkos::View<float*> ShardedGroup::flat_params_f32() const {
  const std::size_t flat = std::size_t(index_.flat_numel());
  Kokkos::View<float*> out(Kokkos::view_alloc(name_ + ".params_f32", Kokkos::WithoutInitializing),
                           flat);
  if (recipe_.compute_dtype == DType::f32) {
    Kokkos::deep_copy(out, flat_params<float>());
  } else {
    with_16bit_type(recipe_.compute_dtype, [&](auto tag) {
      using T = decltype(tag);
      cast_to_f32<T>(flat_params<T>(), out);
    });
  }
  return out;
}

template std::vector<Kokkos::View<const float*>> ShardedGroup::params<float>() const;
template std::vector<Kokkos::View<const bfloat16_t*>> ShardedGroup::params<bfloat16_t>() const;
template std::vector<Kokkos::View<const float16_t*>> ShardedGroup::params<float16_t>() const;
template Kokkos::View<const float*> ShardedGroup::flat_params<float>() const;
template Kokkos::View<const bfloat16_t*> ShardedGroup::flat_params<bfloat16_t>() const;
template Kokkos::View<const float16_t*> ShardedGroup::flat_params<float16_t>() const;

void ShardedGroup::reshard() {
  if (gather_started_) finish_unshard();  // a collective in flight must complete first
  compute_.reset();
  unsharded_ = false;
}

const std::vector<Kokkos::View<float*>>& ShardedGroup::unsharded_grads() {
  if (!grad_full_) {
    const std::size_t flat = std::size_t(index_.flat_numel());
    grad_full_ = memory::acquire(4 * flat, (name_ + ".grad_full").c_str());
    fill<float>(grad_full_.view<float>(flat), 0.0f);
    grad_views_.clear();
    for (const ParamEntry& e : index_.entries())
      grad_views_.push_back(
          grad_full_.view<float>(std::size_t(e.numel), 4 * std::size_t(e.offset)));
  }
  return grad_views_;
}

void ShardedGroup::start_reduce_grads() {
  if (reduce_started_) return;
  unsharded_grads();  // a rank with nothing to add still takes part, with zeros
  const std::size_t shard = std::size_t(index_.shard_numel());
  const std::size_t flat = std::size_t(index_.flat_numel());
  auto full = grad_full_.view<float>(flat);
  // A shard zeroed by zero_grad() is written, not added to.
  reduce_write_ = grad_zero_pending_ ? GradWrite::assign : GradWrite::add;
  grad_zero_pending_ = false;
  switch (recipe_.reduce_dtype) {
    case DType::f32:
      if (reduces_locally()) {
        // One rank per shard: avg over one rank is the identity, so no
        // reduce-scatter (NCCL would copy the whole gradient: 2.3 ms of a
        // 38 ms step at 536M parameters on the H200); finish accumulates
        // from the unsharded gradient itself.
        reduce_req_ = Request();
      } else if (reduce_write_ == GradWrite::assign) {
        // Straight into the shard: no receive buffer, no accumulation pass.
        reduce_write_ = GradWrite::none;
        reduce_req_ = shard_comm_.reduce_scatter_async(full, grad_, ReduceOp::avg);
      } else {
        rs_recv_ = memory::acquire(4 * shard, (name_ + ".rs_recv").c_str());
        reduce_req_ =
            shard_comm_.reduce_scatter_async(full, rs_recv_.view<float>(shard), ReduceOp::avg);
      }
      break;
    case DType::bf16:
    case DType::f16: {
      rs_send_ = memory::acquire(2 * flat, (name_ + ".rs_send").c_str());
      rs_recv_ = memory::acquire(2 * shard, (name_ + ".rs_recv").c_str());
      with_16bit_type(recipe_.reduce_dtype, [&](auto tag) {
        using T = decltype(tag);
        cast_from_f32<T>(full, rs_send_.view<T>(flat));
        reduce_req_ = shard_comm_.reduce_scatter_async(rs_send_.view<T>(flat),
                                                       rs_recv_.view<T>(shard), ReduceOp::avg);
      });
      grad_views_.clear();
      grad_full_.reset();  // the low-precision copy is what is sent
      break;
    }
    default:
      throw Error("reduce dtype " + std::string(dtype_name(recipe_.reduce_dtype)),
                  "f32, bf16 or f16");
  }
  reduce_started_ = true;
}

void ShardedGroup::finish_reduce_grads() {
  if (!reduce_started_) start_reduce_grads();
  // Device-side waits only: the reduction overlaps the backward kernels queued
  // after it started, and nothing here blocks the host.
  reduce_req_.wait_on_device();
  reduce_started_ = false;
  const std::size_t shard = std::size_t(index_.shard_numel());
  const bool hsdp = replicate_comm_.size() > 1;
  // (HSDP) average over the replicas, then accumulate into the shard,
  // computing the optimizer's statistics on the way (into grad_stats_, on the
  // device).
  auto finish = [&](auto tag) {
    using T = decltype(tag);
    // GradWrite::none: the reduce-scatter wrote the shard itself (f32 only).
    Kokkos::View<T*> r;
    if constexpr (std::is_same_v<T, float>) {
      if (reduces_locally()) r = grad_full_.view<float>(shard);  // shard == flat
    }
    if (reduce_write_ != GradWrite::none && !reduces_locally()) r = rs_recv_.view<T>(shard);
    if (hsdp) {
      if constexpr (std::is_same_v<T, float>) {
        if (reduce_write_ == GradWrite::none) r = grad_;
      }
      replicate_req_ = replicate_comm_.all_reduce_async(r, r, ReduceOp::avg);
      replicate_req_.wait_on_device();
      if (reduce_write_ == GradWrite::none) r = {};
    }
    accumulate_with_stats<T>(r, grad_, grad_stats_, reduce_write_);
  };
  if (recipe_.reduce_dtype == DType::f32)
    finish(float{});
  else
    with_16bit_type(recipe_.reduce_dtype, finish);
  // Back to the pool with the accumulation still queued: safe, because every
  // later user of these blocks is ordered after it (kernels on the same
  // stream; collectives wait for that stream when they start).
  rs_send_.reset();
  rs_recv_.reset();
  grad_views_.clear();
  grad_full_.reset();
}

bool ShardedGroup::reduces_locally() const {
  return shard_comm_.size() == 1 && recipe_.reduce_dtype == DType::f32;
}

Kokkos::View<float*> ShardedGroup::grad() const {
  if (grad_zero_pending_) {
    fill<float>(grad_, 0.0f);
    grad_zero_pending_ = false;
  }
  return grad_;
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
  grad_zero_pending_ = true;  // the next reduction writes the shard (no fill now)
  fill<double>(grad_stats_, 0.0);
}

std::size_t ShardedGroup::persistent_bytes() const noexcept {
  return master_.span() * 4 + grad_.span() * 4 + lp_shard_.span();
}

std::size_t ShardedGroup::unsharded_bytes() const noexcept {
  const std::size_t flat = std::size_t(index_.flat_numel());
  const std::size_t compute = dtype_size(recipe_.compute_dtype) * flat;
  const std::size_t gathered =
      recipe_.is_fp8() ? fp8_segment_bytes() * std::size_t(index_.shard_size()) : 0;
  return compute + gathered;
}

}  // namespace kshard
