#include "kshard/engine/nn/rms_norm.hpp"

#include <cmath>

#include "kshard/compat/for_each.hpp"
#include "kshard/compat/kokkos.hpp"
#include "kshard/error.hpp"
#include "kshard/kernels/rms_norm_rows.hpp"

namespace kshard {
namespace detail::rms_norm {

// The portable team kernels below; a backend's register-resident row kernels
// (rms_norm_rows.hpp: CUDA) run instead where they serve the shape.

using Team = Kokkos::TeamPolicy<>::member_type;

template <class T>
void forward(Kokkos::View<const T*> x, Kokkos::View<const T*> gamma, Kokkos::View<T*> y,
             Kokkos::View<accum_t<T>*> rstd, std::int64_t rows, std::int64_t d, double eps) {
  using A = accum_t<T>;
  if (rms_norm_forward_rows<T, A>(x.data(), gamma.data(), y.data(), rstd.data(), rows, d, eps))
    return;
  Kokkos::parallel_for(
      "kshard::rms_norm_forward", compat::row_team_policy(rows),
      KOKKOS_LAMBDA(const Team& team) {
        const std::int64_t r = team.league_rank();
        const T* xr = x.data() + r * d;
        T* yr = y.data() + r * d;
        A sq = 0;
        compat::team_reduce(
            team, d,
            [&](std::int64_t j, A& s) {
              const A v = to_accum(xr[j]);
              s += v * v;
            },
            sq);
        const A rs = A(1) / compat::sqrt(sq / A(d) + A(eps));
        Kokkos::parallel_for(Kokkos::TeamThreadRange(team, d), [&](std::int64_t j) {
          yr[j] = from_accum<T>(to_accum(xr[j]) * rs * to_accum(gamma(j)));
        });
        Kokkos::single(Kokkos::PerTeam(team), [&]() { rstd(r) = rs; });
      });
}

// With xhat = x * rstd and g = dy * gamma:
//   dx = rstd * (g - xhat * mean(g * xhat)),  dy_xhat = dy * xhat (for dgamma).
template <class T>
void backward(Kokkos::View<const T*> x, Kokkos::View<const T*> gamma, Kokkos::View<const T*> dy,
              Kokkos::View<const accum_t<T>*> rstd, Kokkos::View<T*> dx,
              Kokkos::View<accum_t<T>*> dy_xhat, std::int64_t rows, std::int64_t d) {
  using A = accum_t<T>;
  if (rms_norm_backward_rows<T, A>(x.data(), gamma.data(), dy.data(), rstd.data(), dx.data(),
                                   dy_xhat.data(), rows, d))
    return;
  Kokkos::parallel_for(
      "kshard::rms_norm_backward", compat::row_team_policy(rows),
      KOKKOS_LAMBDA(const Team& team) {
        const std::int64_t r = team.league_rank();
        const std::int64_t o = r * d;
        const A rs = rstd(r);
        A sgx = 0;
        compat::team_reduce(
            team, d,
            [&](std::int64_t j, A& s) {
              s += to_accum(dy(o + j)) * to_accum(gamma(j)) * to_accum(x(o + j)) * rs;
            },
            sgx);
        const A b = sgx / A(d);
        Kokkos::parallel_for(Kokkos::TeamThreadRange(team, d), [&](std::int64_t j) {
          const A xhat = to_accum(x(o + j)) * rs;
          const A g = to_accum(dy(o + j)) * to_accum(gamma(j));
          dx(o + j) = from_accum<T>(rs * (g - xhat * b));
          dy_xhat(o + j) = to_accum(dy(o + j)) * xhat;
        });
      });
}

}  // namespace detail::rms_norm

template <class T>
RMSNorm<T>::RMSNorm(std::int64_t features, double eps) : d_(features), eps_(eps) {
  if (d_ <= 0) throw Error("RMSNorm(" + std::to_string(d_) + ")", "features > 0");
  if (!(eps_ > 0.0) || !std::isfinite(eps_))
    throw Error("RMSNorm eps=" + std::to_string(eps_), "a finite eps > 0");
}

template <class T>
std::vector<ParamSpec> RMSNorm<T>::param_specs() const {
  return {{"gamma", {d_}, Init::ones()}};
}

template <class T>
void RMSNorm<T>::forward(Kokkos::View<const T*> x, ActShape shape, const ConstViews& params,
                         Kokkos::View<T*> y) {
  detail::check_forward<T>(*this, x, shape, params, y);
  const std::int64_t rows = shape.rows();
  detail::ensure_size(rstd_, rows, "kshard::RMSNorm::rstd");
  detail::rms_norm::forward<T>(x, params[0], y, rstd_, rows, d_, eps_);
  x_ = x;
  shape_ = shape;
  saved_ = true;
}

template <class T>
void RMSNorm<T>::backward(Kokkos::View<const T*> dy, const ConstViews& params,
                          const GradViews& grads, Kokkos::View<T*> dx) {
  detail::check_backward<T>(*this, saved_, shape_, dy, params, grads, dx);
  const std::int64_t rows = shape_.rows();
  auto dy_xhat = detail::scratch<accum_t<T>>(rows * d_, "kshard::RMSNorm::dy_xhat");
  const GradWrite w = this->take_grad_write();
  detail::rms_norm::backward<T>(x_, params[0], dy, rstd_, dx, dy_xhat.view, rows, d_);
  detail::accumulate_column_sums<accum_t<T>>(dy_xhat.view, rows, d_, grads[0], ones_acc_, w);
}

template <class T>
void RMSNorm<T>::release() {
  x_ = {};
  saved_ = false;
}

#define KSHARD_INSTANTIATE_LAYER(T) template class RMSNorm<T>;
KSHARD_FOR_EACH_COMPUTE_TYPE(KSHARD_INSTANTIATE_LAYER)
#undef KSHARD_INSTANTIATE_LAYER

}  // namespace kshard
