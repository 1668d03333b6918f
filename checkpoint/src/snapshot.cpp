#include "snapshot.hpp"

#include <string>

namespace kshard::detail {
namespace {

/// dst holds src's size, (re)allocated only when its size differs.
template <class T, class Src>
void size_like(Kokkos::View<T*, compat::StagingSpace>& dst, const Src& src, const char* label) {
  if (dst.extent(0) != src.extent(0))
    dst = Kokkos::View<T*, compat::StagingSpace>(
        Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string(label)), src.extent(0));
}

template <class V>
const char* bytes_of(const V& v) {
  return reinterpret_cast<const char*>(v.data());
}

}  // namespace

template <class F>
void Snapshot::each_tensor(FsdpModel& model, const FusedAdam* opt, std::size_t u, F&& f) {
  Unit& h = units_[u];
  f(h.master, model.group(u).master(), 0, "kshard.checkpoint.snapshot.master");
  const bool bf16 = opt && opt->state(int(u)).moment_dtype == DType::bf16;
  if (!opt || bf16) h.m32 = h.v32 = {};
  if (!opt || !bf16) h.m16 = h.v16 = {};
  if (!opt) return;
  const AdamGroupState& s = opt->state(int(u));
  if (bf16) {
    f(h.m16, s.exp_avg_bf16, 1, "kshard.checkpoint.snapshot.exp_avg");
    f(h.v16, s.exp_avg_sq_bf16, 2, "kshard.checkpoint.snapshot.exp_avg_sq");
  } else {
    f(h.m32, s.exp_avg, 1, "kshard.checkpoint.snapshot.exp_avg");
    f(h.v32, s.exp_avg_sq, 2, "kshard.checkpoint.snapshot.exp_avg_sq");
  }
}

void Snapshot::take(FsdpModel& model, const FusedAdam* opt) {
  Kokkos::fence();  // the optimizer's update kernels may still run
  units_.resize(model.num_units());
  for (std::size_t u = 0; u < model.num_units(); ++u) {
    Unit& h = units_[u];
    h.data[0] = h.data[1] = h.data[2] = nullptr;
    each_tensor(model, opt, u, [&](auto& dst, const auto& src, int kind, const char* label) {
      size_like(dst, src, label);
      Kokkos::deep_copy(dst, src);
      h.data[kind] = bytes_of(dst);
    });
  }
}

void Snapshot::reserve(FsdpModel& model, const FusedAdam* opt) {
  units_.resize(model.num_units());
  for (std::size_t u = 0; u < model.num_units(); ++u)
    each_tensor(model, opt, u, [](auto& dst, const auto& src, int, const char* label) {
      size_like(dst, src, label);
    });
}

const char* Snapshot::tensor(std::size_t unit, int kind) { return units_.at(unit).data[kind]; }

std::size_t Snapshot::bytes() const {
  std::size_t n = 0;
  for (const Unit& h : units_)
    n += h.master.span() * 4 + (h.m32.span() + h.v32.span()) * 4 + (h.m16.span() + h.v16.span()) * 2;
  return n;
}

}  // namespace kshard::detail
