#include "kshard/engine/loss.hpp"
#include "kshard/compat/kokkos.hpp"

#include <string>

#include "kshard/error.hpp"

namespace kshard {

namespace detail::loss {

using Team = Kokkos::TeamPolicy<>::member_type;

template <class T, class U>
double mse(Kokkos::View<const T*> pred, Kokkos::View<const U*> target, Kokkos::View<T*> dpred,
           double grad_scale) {
  using A = accum_t<T>;
  const std::int64_t n = static_cast<std::int64_t>(pred.extent(0));
  const A g = static_cast<A>(2.0 * grad_scale / static_cast<double>(n));
  double sum = 0;
  Kokkos::parallel_reduce(
      "kshard::mse_loss", Kokkos::RangePolicy<>(0, n),
      KOKKOS_LAMBDA(std::int64_t i, double& s) {
        const A e = to_accum(pred(i)) - A(to_accum(target(i)));
        dpred(i) = from_accum<T>(g * e);
        s += static_cast<double>(e) * static_cast<double>(e);
      },
      sum);
  return sum / static_cast<double>(n);
}

// Rows with a target >= 0 (counted) and rows with a target >= vocab (bad).
template <class Target>
void count_targets(Kokkos::View<const Target*> targets, std::int64_t vocab, std::int64_t& counted,
                   std::int64_t& bad) {
  counted = 0;
  bad = 0;
  Kokkos::parallel_reduce(
      "kshard::cross_entropy_count", Kokkos::RangePolicy<>(0, static_cast<std::int64_t>(targets.extent(0))),
      KOKKOS_LAMBDA(std::int64_t r, std::int64_t& c, std::int64_t& b) {
        const Target t = targets(r);
        if (t >= Target(0)) {
          // A T target must also be integral to name a class.
          if (t >= Target(vocab) || static_cast<Target>(static_cast<std::int64_t>(t)) != t)
            b += 1;
          else
            c += 1;
        }
      },
      counted, bad);
}

// One team per row. dlogits may alias logits: each element is read (passes
// 1-2, and pass 3 before its own write) only by the thread that writes it, and
// the target's logit is read before any write (barrier).
template <class T, class Target>
double cross_entropy(const T* logits, std::int64_t rows, std::int64_t vocab,
                     Kokkos::View<const Target*> targets, T* dlogits, double inv_counted,
                     double grad_scale) {
  using A = accum_t<T>;
  const A g = static_cast<A>(grad_scale * inv_counted);
  double total = 0;
  Kokkos::parallel_reduce(
      "kshard::cross_entropy", Kokkos::TeamPolicy<>(static_cast<int>(rows), Kokkos::AUTO),
      KOKKOS_LAMBDA(const Team& team, double& acc) {
        const std::int64_t r = team.league_rank();
        const T* l = logits + r * vocab;
        T* dl = dlogits + r * vocab;
        const Target tt = targets(r);
        if (tt < Target(0)) {
          Kokkos::parallel_for(Kokkos::TeamThreadRange(team, vocab),
                               [&](std::int64_t j) { dl[j] = from_accum<T>(A(0)); });
          return;
        }
        const std::int64_t t = static_cast<std::int64_t>(tt);
        A mx = 0;
        Kokkos::parallel_reduce(
            Kokkos::TeamThreadRange(team, vocab),
            [&](std::int64_t j, A& m) {
              const A v = to_accum(l[j]);
              if (v > m) m = v;
            },
            Kokkos::Max<A>(mx));
        A sum = 0;
        Kokkos::parallel_reduce(
            Kokkos::TeamThreadRange(team, vocab),
            [&](std::int64_t j, A& s) { s += compat::exp(to_accum(l[j]) - mx); }, sum);
        const A lse = mx + compat::log(sum);
        const A lt = to_accum(l[t]);
        team.team_barrier();
        Kokkos::parallel_for(Kokkos::TeamThreadRange(team, vocab), [&](std::int64_t j) {
          const A p = compat::exp(to_accum(l[j]) - lse);
          dl[j] = from_accum<T>(g * (p - (j == t ? A(1) : A(0))));
        });
        Kokkos::single(Kokkos::PerTeam(team),
                       [&]() { acc += static_cast<double>(lse - lt); });
      },
      total);
  return total * inv_counted;
}

}  // namespace detail::loss

template <class T, class U>
double mse_loss(Kokkos::View<const T*> pred,
                typename std::common_type<Kokkos::View<const U*>>::type target,
                Kokkos::View<T*> dpred, double grad_scale) {
  const std::size_t n = pred.extent(0);
  if (n == 0) throw Error("mse_loss: empty prediction", "at least one element");
  if (target.extent(0) != n || dpred.extent(0) != n)
    throw Error("mse_loss: pred has " + std::to_string(n) + " elements, target " +
                    std::to_string(target.extent(0)) + ", dpred " +
                    std::to_string(dpred.extent(0)),
                "equal sizes");
  return detail::loss::mse<T, U>(pred, target, dpred, grad_scale);
}

template <class T, class Target>
double cross_entropy_loss(Kokkos::View<const T*> logits, std::int64_t rows, std::int64_t vocab,
                          Kokkos::View<const Target*> targets, Kokkos::View<T*> dlogits,
                          double grad_scale) {
  const std::string who = "cross_entropy_loss(rows=" + std::to_string(rows) +
                          ", vocab=" + std::to_string(vocab) + ")";
  if (rows <= 0 || vocab <= 0) throw Error(who, "rows > 0 and vocab > 0");
  auto size = [&](const char* what, std::size_t have, std::int64_t want) {
    if (static_cast<std::int64_t>(have) != want)
      throw Error(who + ": " + what + " has " + std::to_string(have) + " elements",
                  std::to_string(want) + " elements");
  };
  size("logits", logits.extent(0), rows * vocab);
  size("dlogits", dlogits.extent(0), rows * vocab);
  size("targets", targets.extent(0), rows);
  std::int64_t counted = 0, bad = 0;
  detail::loss::count_targets<Target>(targets, vocab, counted, bad);
  if (bad != 0)
    throw Error(who + ": " + std::to_string(bad) + " targets are >= vocab or not integers",
                "targets in [0, vocab), or negative to ignore a row");
  const double inv = counted > 0 ? 1.0 / static_cast<double>(counted) : 0.0;
  return detail::loss::cross_entropy<T, Target>(logits.data(), rows, vocab, targets,
                                                dlogits.data(), inv, grad_scale);
}

#define KSHARD_CE_INSTANTIATE(T, Target)                                                  \
  template double cross_entropy_loss<T, Target>(Kokkos::View<const T*>, std::int64_t,     \
                                                std::int64_t, Kokkos::View<const Target*>, \
                                                Kokkos::View<T*>, double);
#define KSHARD_MSE_INSTANTIATE(T, U)                                                     \
  template double mse_loss<T, U>(Kokkos::View<const T*>,                                  \
                                 std::common_type<Kokkos::View<const U*>>::type,          \
                                 Kokkos::View<T*>, double);
KSHARD_MSE_INSTANTIATE(float, float)
KSHARD_MSE_INSTANTIATE(double, double)
KSHARD_MSE_INSTANTIATE(bfloat16_t, bfloat16_t)
KSHARD_MSE_INSTANTIATE(bfloat16_t, float)
KSHARD_MSE_INSTANTIATE(float16_t, float16_t)
KSHARD_MSE_INSTANTIATE(float16_t, float)
#undef KSHARD_MSE_INSTANTIATE
KSHARD_CE_INSTANTIATE(float, std::int32_t)
KSHARD_CE_INSTANTIATE(float, std::int64_t)
KSHARD_CE_INSTANTIATE(float, float)
KSHARD_CE_INSTANTIATE(double, std::int32_t)
KSHARD_CE_INSTANTIATE(double, std::int64_t)
KSHARD_CE_INSTANTIATE(double, double)
KSHARD_CE_INSTANTIATE(bfloat16_t, std::int32_t)
KSHARD_CE_INSTANTIATE(float16_t, std::int32_t)
#undef KSHARD_CE_INSTANTIATE

}  // namespace kshard
