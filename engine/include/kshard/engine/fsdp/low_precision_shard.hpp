#pragma once
// LowPrecisionShard: the 16-bit (bf16/f16) copy of an f32 master shard that
// the optimizer's update kernel rewrites from the new master, so that the
// next all-gather can send it as is (no cast pass per unshard).
//
// The one description of such a copy, shared by the engine (ShardedGroup,
// which owns it) and the optimizer (FusedAdam, which writes it). A training
// loop never builds one: FusedAdam::add_group(ShardedGroup&) reads it from
// the group. It holds a typed View (sharing the memory, keeping it alive):
//
//   kshard::LowPrecisionShard none;                                   // no copy
//   kshard::LowPrecisionShard copy(Kokkos::View<kshard::bfloat16_t*>("m", n));
//   if (copy.present() && copy.dtype() == kshard::DType::bf16) use(copy.bf16());
//
// The memory is that of the default execution space.
#include <cstddef>

#include <Kokkos_Core.hpp>

#include "kshard/dtype.hpp"
#include "kshard/numeric/types.hpp"

namespace kshard {

class LowPrecisionShard {
 public:
  LowPrecisionShard() = default;  // none
  LowPrecisionShard(Kokkos::View<bfloat16_t*> v)  // NOLINT: implicit on purpose
      : dtype_(DType::bf16), bf16_(std::move(v)) {}
  LowPrecisionShard(Kokkos::View<float16_t*> v)  // NOLINT
      : dtype_(DType::f16), f16_(std::move(v)) {}

  bool present() const noexcept { return dtype_ != DType::f32; }
  /// bf16 or f16 when present; f32 (the master's) when there is no copy.
  DType dtype() const noexcept { return dtype_; }
  std::size_t count() const noexcept { return dtype_ == DType::f16 ? f16_.size() : bf16_.size(); }
  /// The copy as a View of its dtype (an empty View for the other dtype).
  const Kokkos::View<bfloat16_t*>& bf16() const noexcept { return bf16_; }
  const Kokkos::View<float16_t*>& f16() const noexcept { return f16_; }

 private:
  DType dtype_ = DType::f32;  // f32: no copy
  Kokkos::View<bfloat16_t*> bf16_;
  Kokkos::View<float16_t*> f16_;
};

}  // namespace kshard
