#include "snapshot.hpp"

#include <string>

namespace kshard::ckpt {
namespace {

/// dst holds src's size, (re)allocated only when its size differs.
template <class T, class Src>
void size_like(Kokkos::View<T*, compat::StagingSpace>& dst, const Src& src, const char* label) {
  if (dst.extent(0) != src.extent(0))
    dst = Kokkos::View<T*, compat::StagingSpace>(
        Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string(label)), src.extent(0));
}

/// dst becomes a copy of src.
template <class T, class Src>
void copy_into(Kokkos::View<T*, compat::StagingSpace>& dst, const Src& src, const char* label) {
  size_like(dst, src, label);
  Kokkos::deep_copy(dst, src);
}

template <class V>
const char* bytes_of(const V& v) {
  return reinterpret_cast<const char*>(v.data());
}

}  // namespace

void Snapshot::take(FsdpModel& model, const FusedAdam* opt) {
  Kokkos::fence();  // the optimizer's update kernels may still run
  units_.resize(model.num_units());
  for (std::size_t u = 0; u < model.num_units(); ++u) {
    Unit& h = units_[u];
    copy_into(h.master, model.group(u).master(), "kshard.checkpoint.snapshot.master");
    h.data[0] = bytes_of(h.master);
    h.data[1] = h.data[2] = nullptr;
    if (!opt) {
      h.m32 = h.v32 = {};
      h.m16 = h.v16 = {};
      continue;
    }
    const AdamGroupState& s = opt->state(int(u));
    if (s.moment_dtype == DType::bf16) {
      h.m32 = h.v32 = {};
      copy_into(h.m16, s.exp_avg_bf16, "kshard.checkpoint.snapshot.exp_avg");
      copy_into(h.v16, s.exp_avg_sq_bf16, "kshard.checkpoint.snapshot.exp_avg_sq");
      h.data[1] = bytes_of(h.m16);
      h.data[2] = bytes_of(h.v16);
    } else {
      h.m16 = h.v16 = {};
      copy_into(h.m32, s.exp_avg, "kshard.checkpoint.snapshot.exp_avg");
      copy_into(h.v32, s.exp_avg_sq, "kshard.checkpoint.snapshot.exp_avg_sq");
      h.data[1] = bytes_of(h.m32);
      h.data[2] = bytes_of(h.v32);
    }
  }
}

void Snapshot::reserve(FsdpModel& model, const FusedAdam* opt) {
  units_.resize(model.num_units());
  for (std::size_t u = 0; u < model.num_units(); ++u) {
    Unit& h = units_[u];
    size_like(h.master, model.group(u).master(), "kshard.checkpoint.snapshot.master");
    if (!opt) continue;
    const AdamGroupState& s = opt->state(int(u));
    if (s.moment_dtype == DType::bf16) {
      size_like(h.m16, s.exp_avg_bf16, "kshard.checkpoint.snapshot.exp_avg");
      size_like(h.v16, s.exp_avg_sq_bf16, "kshard.checkpoint.snapshot.exp_avg_sq");
    } else {
      size_like(h.m32, s.exp_avg, "kshard.checkpoint.snapshot.exp_avg");
      size_like(h.v32, s.exp_avg_sq, "kshard.checkpoint.snapshot.exp_avg_sq");
    }
  }
}

const char* Snapshot::tensor(std::size_t unit, int kind) { return units_.at(unit).data[kind]; }

std::size_t Snapshot::bytes() const {
  std::size_t n = 0;
  for (const Unit& h : units_)
    n += h.master.span() * 4 + (h.m32.span() + h.v32.span()) * 4 + (h.m16.span() + h.v16.span()) * 2;
  return n;
}

}  // namespace kshard::ckpt
