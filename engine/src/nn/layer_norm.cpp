#include "kshard/engine/nn/layer_norm.hpp"
#include "kshard/compat/for_each.hpp"
#include "kshard/compat/kokkos.hpp"

#include <cmath>

#include "kshard/error.hpp"
#include "kshard/kernels/layer_norm_rows.hpp"

namespace kshard {

namespace detail::layer_norm {

// The portable team kernels below; a backend's register-resident row kernels
// (layer_norm_rows.hpp: CUDA) run instead where they serve the shape.

using Team = Kokkos::TeamPolicy<>::member_type;

template <class T>
void forward(Kokkos::View<const T*> x, Kokkos::View<const T*> gamma, Kokkos::View<const T*> beta,
             Kokkos::View<T*> y, Kokkos::View<accum_t<T>*> mean, Kokkos::View<accum_t<T>*> rstd,
             std::int64_t rows, std::int64_t d, double eps) {
  using A = accum_t<T>;
  if (layer_norm_forward_rows<T, A>(x.data(), gamma.data(), beta.data(), y.data(), mean.data(),
                                    rstd.data(), rows, d, eps))
    return;
  Kokkos::parallel_for(
      "kshard::layer_norm_forward", compat::row_team_policy(rows),
      KOKKOS_LAMBDA(const Team& team) {
        const std::int64_t r = team.league_rank();
        const T* xr = x.data() + r * d;
        T* yr = y.data() + r * d;
        A sum = 0;
        compat::team_reduce(
            team, d, [&](std::int64_t j, A& s) { s += to_accum(xr[j]); }, sum);
        const A mu = sum / A(d);
        // Two passes (mean, then centred squares): no cancellation for large means.
        A sq = 0;
        compat::team_reduce(
            team, d,
            [&](std::int64_t j, A& s) {
              const A c = to_accum(xr[j]) - mu;
              s += c * c;
            },
            sq);
        const A rs = A(1) / compat::sqrt(sq / A(d) + A(eps));
        Kokkos::parallel_for(Kokkos::TeamThreadRange(team, d), [&](std::int64_t j) {
          yr[j] = from_accum<T>((to_accum(xr[j]) - mu) * rs * to_accum(gamma(j)) +
                                to_accum(beta(j)));
        });
        Kokkos::single(Kokkos::PerTeam(team), [&]() {
          mean(r) = mu;
          rstd(r) = rs;
        });
      });
}

// dx = rstd * (g - mean(g) - xhat * mean(g * xhat)), g = dy * gamma; also
// dy_xhat = dy * xhat (accumulation type) for the dgamma reduction.
template <class T>
void backward(Kokkos::View<const T*> x, Kokkos::View<const T*> gamma, Kokkos::View<const T*> dy,
              Kokkos::View<const accum_t<T>*> mean, Kokkos::View<const accum_t<T>*> rstd,
              Kokkos::View<T*> dx, Kokkos::View<accum_t<T>*> dy_xhat, std::int64_t rows,
              std::int64_t d) {
  using A = accum_t<T>;
  if (layer_norm_backward_rows<T, A>(x.data(), gamma.data(), dy.data(), mean.data(), rstd.data(),
                                     dx.data(), dy_xhat.data(), rows, d))
    return;
  Kokkos::parallel_for(
      "kshard::layer_norm_backward", compat::row_team_policy(rows),
      KOKKOS_LAMBDA(const Team& team) {
        const std::int64_t r = team.league_rank();
        const std::int64_t o = r * d;
        const A mu = mean(r), rs = rstd(r);
        A sg = 0, sgx = 0;
        compat::team_reduce(
            team, d,
            [&](std::int64_t j, A& s) { s += to_accum(dy(o + j)) * to_accum(gamma(j)); }, sg);
        compat::team_reduce(
            team, d,
            [&](std::int64_t j, A& s) {
              s += to_accum(dy(o + j)) * to_accum(gamma(j)) * (to_accum(x(o + j)) - mu) * rs;
            },
            sgx);
        const A a = sg / A(d), b = sgx / A(d);
        Kokkos::parallel_for(Kokkos::TeamThreadRange(team, d), [&](std::int64_t j) {
          const A xhat = (to_accum(x(o + j)) - mu) * rs;
          const A g = to_accum(dy(o + j)) * to_accum(gamma(j));
          dx(o + j) = from_accum<T>(rs * (g - a - xhat * b));
          dy_xhat(o + j) = to_accum(dy(o + j)) * xhat;
        });
      });
}

}  // namespace detail::layer_norm

template <class T>
LayerNorm<T>::LayerNorm(std::int64_t features, double eps) : d_(features), eps_(eps) {
  if (d_ <= 0) throw Error("LayerNorm(" + std::to_string(d_) + ")", "features > 0");
  if (!(eps_ > 0.0) || !std::isfinite(eps_))
    throw Error("LayerNorm eps=" + std::to_string(eps_), "a finite eps > 0");
}

template <class T>
std::vector<ParamSpec> LayerNorm<T>::param_specs() const {
  return {{"gamma", {d_}, Init::ones()}, {"beta", {d_}, Init::zeros()}};
}

template <class T>
void LayerNorm<T>::forward(Kokkos::View<const T*> x, ActShape shape, const ConstViews& params,
                           Kokkos::View<T*> y) {
  detail::check_forward<T>(*this, x, shape, params, y);
  const std::int64_t rows = shape.rows();
  detail::ensure_size(mean_, rows, "kshard::LayerNorm::mean");
  detail::ensure_size(rstd_, rows, "kshard::LayerNorm::rstd");
  detail::layer_norm::forward<T>(x, params[0], params[1], y, mean_, rstd_, rows, d_, eps_);
  x_ = x;
  shape_ = shape;
  saved_ = true;
}

template <class T>
void LayerNorm<T>::backward(Kokkos::View<const T*> dy, const ConstViews& params,
                            const GradViews& grads, Kokkos::View<T*> dx) {
  detail::check_backward<T>(*this, saved_, shape_, dy, params, grads, dx);
  const std::int64_t rows = shape_.rows();
  auto dy_xhat = detail::scratch<accum_t<T>>(rows * d_, "kshard::LayerNorm::dy_xhat");
  const GradWrite w = this->take_grad_write();
  detail::layer_norm::backward<T>(x_, params[0], dy, mean_, rstd_, dx, dy_xhat.view, rows, d_);
  detail::accumulate_column_sums<accum_t<T>>(dy_xhat.view, rows, d_, grads[0], ones_acc_, w);
  detail::accumulate_column_sums<T>(dy, rows, d_, grads[1], ones_, w);
}

template <class T>
void LayerNorm<T>::release() {
  x_ = {};
  saved_ = false;
}

#define KSHARD_INSTANTIATE_LAYER(T) template class LayerNorm<T>;
KSHARD_FOR_EACH_COMPUTE_TYPE(KSHARD_INSTANTIATE_LAYER)
#undef KSHARD_INSTANTIATE_LAYER

}  // namespace kshard
