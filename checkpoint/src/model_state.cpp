#include "model_state.hpp"

#include "kshard/error.hpp"

namespace kshard::detail {

void check_optimizer_matches(FsdpModel& model, const FusedAdam& opt) {
  const std::string expected =
      "a FusedAdam whose group i is model unit i's shard (add_group in unit order)";
  if (std::size_t(opt.num_groups()) != model.num_units())
    throw Error("the optimizer has " + std::to_string(opt.num_groups()) + " groups but the model " +
                    std::to_string(model.num_units()) + " units",
                expected);
  for (std::size_t u = 0; u < model.num_units(); ++u) {
    const auto shard = std::size_t(model.group(u).index().shard_numel());
    if (opt.group_size(int(u)) != shard)
      throw Error("optimizer group " + std::to_string(u) + " holds " +
                      std::to_string(opt.group_size(int(u))) + " elements but unit '" +
                      model.group(u).name() + "' has a shard of " + std::to_string(shard),
                  expected);
  }
}

const char* UnitHost::data(int kind) const {
  switch (kind) {
    case 0: return reinterpret_cast<const char*>(master.data());
    case 1: return m16.data() ? reinterpret_cast<const char*>(m16.data())
                              : reinterpret_cast<const char*>(m32.data());
    default: return v16.data() ? reinterpret_cast<const char*>(v16.data())
                               : reinterpret_cast<const char*>(v32.data());
  }
}

UnitHost copy_to_host(ShardedGroup& group, const AdamGroupState* state) {
  UnitHost h;
  const Kokkos::HostSpace host;
  h.master = Kokkos::create_mirror_view_and_copy(host, group.master());
  if (state) {
    if (state->moment_dtype == DType::bf16) {
      h.m16 = Kokkos::create_mirror_view_and_copy(host, state->exp_avg_bf16);
      h.v16 = Kokkos::create_mirror_view_and_copy(host, state->exp_avg_sq_bf16);
    } else {
      h.m32 = Kokkos::create_mirror_view_and_copy(host, state->exp_avg);
      h.v32 = Kokkos::create_mirror_view_and_copy(host, state->exp_avg_sq);
    }
  }
  return h;
}

const char* LiveShards::tensor(std::size_t unit, int kind) {
  if (unit != unit_) {
    host_ = UnitHost();  // the previous unit's copies go first
    host_ = copy_to_host(model_.group(unit), opt_ ? &opt_->state(int(unit)) : nullptr);
    unit_ = unit;
  }
  return host_.data(kind);
}

std::string full_name(const ShardedGroup& group, std::size_t param) {
  return group.name() + "." + group.index().entry(param).name;
}

}  // namespace kshard::detail
