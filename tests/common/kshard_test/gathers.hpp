#pragma once
// What tests read back from a sharded model: the full parameters, gathered
// onto every rank. Test-only (the library's own export goes through
// checkpoint/), so FsdpModel and ShardedGroup carry none of it.
#include <cstddef>
#include <vector>

#include <Kokkos_Core.hpp>

#include <kshard/engine/fsdp/fsdp_model.hpp>
#include <kshard/engine/fsdp/sharded_group.hpp>
#include <kshard/kernels/cast.hpp>

namespace kshard::test {

/// Every unit's f32 master parameters, all-gathered (padding dropped), on
/// the host of every rank. Collective over each unit's shard communicator.
inline std::vector<std::vector<float>> gather_master_parameters(const FsdpModel& model) {
  std::vector<std::vector<float>> out;
  for (std::size_t i = 0; i < model.num_units(); ++i) out.push_back(model.group(i).gather_master());
  return out;
}

/// An unsharded group's compute buffer (padded), upcast to f32.
inline Kokkos::View<float*> flat_params_f32(const ShardedGroup& g) {
  const std::size_t flat = std::size_t(g.index().flat_numel());
  Kokkos::View<float*> out(Kokkos::view_alloc(g.name() + ".params_f32", Kokkos::WithoutInitializing),
                           flat);
  switch (g.recipe().compute_dtype) {
    case DType::f32:
      Kokkos::deep_copy(out, g.flat_params<float>());
      break;
    case DType::bf16:
      cast_to_f32<bfloat16_t>(g.flat_params<bfloat16_t>(), out);
      break;
    default:
      cast_to_f32<float16_t>(g.flat_params<float16_t>(), out);
  }
  return out;
}

}  // namespace kshard::test
