#pragma once
// LowPrecisionShard: the 16-bit (bf16/f16) copy of an f32 master shard that
// the optimizer's update kernel rewrites from the new master, so that the
// next all-gather can send it as is (no cast pass per unshard).
//
// The one description of such a copy, shared by the engine (ShardedGroup,
// which owns it) and the optimizer (FusedAdam, which writes it): before, each
// side had its own type and a training loop had to translate between them.
// A training loop never builds one: FusedAdam::add_group(ShardedGroup&)
// reads it from the group. The View constructors are for code that owns a
// copy of its own (tests, benchmarks); they keep the memory alive.
//
//   kshard::LowPrecisionShard none;                          // no copy
//   kshard::LowPrecisionShard copy(Kokkos::View<kshard::bfloat16_t*>("m", n));
//   kshard::LowPrecisionShard raw = kshard::LowPrecisionShard::raw(DType::f16, ptr, n);
//
// The memory must be that of the default execution space.
#include <cstddef>

#include <Kokkos_Core.hpp>

#include "kshard/dtype.hpp"
#include "kshard/numeric/types.hpp"

namespace kshard {

struct LowPrecisionShard {
  DType dtype = DType::f32;  ///< bf16 or f16 when present
  void* data = nullptr;      ///< nullptr: no copy (or an empty one)
  std::size_t count = 0;     ///< elements
  bool present = false;

  LowPrecisionShard() = default;  // none
  LowPrecisionShard(Kokkos::View<bfloat16_t*> v)  // NOLINT: implicit on purpose
      : dtype(DType::bf16), data(v.data()), count(v.size()), present(true), bf16_(std::move(v)) {}
  LowPrecisionShard(Kokkos::View<float16_t*> v)  // NOLINT
      : dtype(DType::f16), data(v.data()), count(v.size()), present(true), f16_(std::move(v)) {}
  /// A copy whose memory the caller keeps alive. FusedAdam::add_group checks
  /// dtype (bf16 or f16), size and a non-null pointer.
  static LowPrecisionShard raw(DType dtype, void* data, std::size_t count) {
    LowPrecisionShard s;
    s.dtype = dtype;
    s.data = data;
    s.count = count;
    s.present = true;
    return s;
  }

 private:
  Kokkos::View<bfloat16_t*> bf16_;  // keep-alive handles of the View constructors
  Kokkos::View<float16_t*> f16_;
};

}  // namespace kshard
