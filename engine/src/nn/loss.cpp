#include "kshard/engine/nn/loss.hpp"
#include "kshard/compat/for_each.hpp"
#include "kshard/compat/kokkos.hpp"

#include <string>

#include "kshard/engine/nn/layer.hpp"
#include "kshard/error.hpp"
#include "kshard/core/buffer_pool.hpp"
#include "kshard/kernels/cross_entropy_rows.hpp"
#include "cross_entropy_parts.hpp"

namespace kshard {

namespace detail::loss {

using Team = Kokkos::TeamPolicy<>::member_type;

/// One team for a whole small reduction (a few thousand rows): a fixed
/// schedule, so the result is deterministic, and no host round trip.
inline Kokkos::TeamPolicy<> one_team() {
#if defined(KOKKOS_ENABLE_CUDA)
  return Kokkos::TeamPolicy<>(1, 256);
#else
  return Kokkos::TeamPolicy<>(1, Kokkos::AUTO);
#endif
}

// Team reductions only, in a fixed order (per-team partial sums, then one
// team's total): deterministic, and clean under racecheck. (Kokkos 3.4's
// RangePolicy reduction on CUDA goes through a warp-synchronous shared-memory
// block scan that compute-sanitizer's racecheck reports as racing.)
template <class T, class U>
double mse(Kokkos::View<const T*> pred, Kokkos::View<const U*> target, Kokkos::View<T*> dpred,
           double grad_scale) {
  using A = accum_t<T>;
  const std::int64_t n = static_cast<std::int64_t>(pred.extent(0));
  const A g = static_cast<A>(2.0 * grad_scale / static_cast<double>(n));
  const std::int64_t per_team = 8192;
  const std::int64_t teams = (n + per_team - 1) / per_team;
  memory::Block block =
      memory::acquire(std::size_t(teams + 1) * sizeof(double), "kshard::mse_loss.partials");
  Kokkos::View<double*> part = block.view<double>(std::size_t(teams + 1));
  Kokkos::parallel_for(
      "kshard::mse_loss", Kokkos::TeamPolicy<>(teams, Kokkos::AUTO),
      KOKKOS_LAMBDA(const Team& team) {
        const std::int64_t b = std::int64_t(team.league_rank()) * per_team;
        const std::int64_t len = n - b < per_team ? n - b : per_team;
        double s = 0;
        compat::team_reduce(
            team, len,
            [&](std::int64_t j, double& acc) {
              const A e = to_accum(pred(b + j)) - A(to_accum(target(b + j)));
              dpred(b + j) = from_accum<T>(g * e);
              acc += static_cast<double>(e) * static_cast<double>(e);
            },
            s);
        Kokkos::single(Kokkos::PerTeam(team), [&]() { part(team.league_rank()) = s; });
      });
  Kokkos::parallel_for(
      "kshard::mse_loss_total", one_team(), KOKKOS_LAMBDA(const Team& team) {
        double s = 0;
        compat::team_reduce(
            team, teams, [&](std::int64_t t, double& acc) { acc += part(t); }, s);
        Kokkos::single(Kokkos::PerTeam(team), [&]() { part(teams) = s; });
      });
  auto h = Kokkos::create_mirror_view_and_copy(
      Kokkos::HostSpace(), Kokkos::subview(part, std::make_pair(teams, teams + 1)));
  return h(0) / static_cast<double>(n);
}

// A target names a class when it is in [0, vocab); negative: ignored row;
// anything else is bad (counted, treated as ignored).
template <class Target>
KOKKOS_INLINE_FUNCTION bool target_ok(Target t, std::int64_t vocab) {
  static_assert(std::is_integral_v<Target>, "class ids are integers");
  return t >= Target(0) && std::int64_t(t) < vocab;
}

// result(0) = mean loss, result(1) = counted rows, result(2) = bad targets,
// all written on the device in stream order (three kernels, no host wait).
template <class T, class Target>
void count_targets(Kokkos::View<const Target*> targets, std::int64_t vocab,
                   Kokkos::View<double*> result) {
  const std::int64_t rows = static_cast<std::int64_t>(targets.extent(0));
  Kokkos::parallel_for(
      "kshard::cross_entropy_count", one_team(), KOKKOS_LAMBDA(const Team& team) {
        double counted = 0, bad = 0;
        compat::team_reduce(
            team, rows,
            [&](std::int64_t r, double& c) { c += target_ok(targets(r), vocab) ? 1 : 0; },
            counted);
        compat::team_reduce(
            team, rows,
            [&](std::int64_t r, double& b) {
              b += (targets(r) >= Target(0) && !target_ok(targets(r), vocab)) ? 1 : 0;
            },
            bad);
        Kokkos::single(Kokkos::PerTeam(team), [&]() {
          result(1) = counted;
          result(2) = bad;
        });
      });
}

// One team per row. dlogits may alias logits: each element is read (passes
// 1-2, and pass 3 before its own write) only by the thread that writes it, and
// the target's logit is read before any write (barrier). dlogits null: the
// forward-only mode (row losses alone, no gradient written).
template <class T, class Target>
void row_losses(const T* logits, std::int64_t rows, std::int64_t vocab,
                Kokkos::View<const Target*> targets, T* dlogits, double grad_scale,
                Kokkos::View<const double*> result, Kokkos::View<double*> row_loss) {
  using A = accum_t<T>;
  // The backend's one-pass row kernel where it has one (cross_entropy_rows.hpp),
  // else the portable team kernel.
  if (dlogits != nullptr &&
      cross_entropy_rows<T, Target>(logits, rows, vocab, targets.data(), dlogits, grad_scale,
                                    result.data(), row_loss.data()))
    return;
  Kokkos::parallel_for(
      "kshard::cross_entropy", compat::row_team_policy(rows), KOKKOS_LAMBDA(const Team& team) {
        const std::int64_t r = team.league_rank();
        const T* l = logits + r * vocab;
        T* dl = dlogits != nullptr ? dlogits + r * vocab : nullptr;
        const Target tt = targets(r);
        if (!target_ok(tt, vocab)) {
          if (dl != nullptr)
            Kokkos::parallel_for(Kokkos::TeamThreadRange(team, vocab),
                                 [&](std::int64_t j) { dl[j] = from_accum<T>(A(0)); });
          Kokkos::single(Kokkos::PerTeam(team), [&]() { row_loss(r) = 0; });
          return;
        }
        const double counted = result(1);
        const A g = static_cast<A>(grad_scale / counted);
        const std::int64_t t = static_cast<std::int64_t>(tt);
        A mx = 0;
        compat::team_reduce(
            team, vocab,
            [&](std::int64_t j, A& m) {
              const A v = to_accum(l[j]);
              if (v > m) m = v;
            },
            Kokkos::Max<A>(mx));
        A sum = 0;
        compat::team_reduce(
            team, vocab, [&](std::int64_t j, A& s) { s += compat::exp(to_accum(l[j]) - mx); }, sum);
        const A lse = mx + compat::log(sum);
        const A lt = to_accum(l[t]);
        team.team_barrier();
        if (dl != nullptr)
          Kokkos::parallel_for(Kokkos::TeamThreadRange(team, vocab), [&](std::int64_t j) {
            const A p = compat::exp(to_accum(l[j]) - lse);
            dl[j] = from_accum<T>(g * (p - (j == t ? A(1) : A(0))));
          });
        Kokkos::single(Kokkos::PerTeam(team),
                       [&]() { row_loss(r) = static_cast<double>(lse - lt); });
      });
}

void mean_loss(Kokkos::View<const double*> row_loss, Kokkos::View<double*> result, bool mean) {
  const std::int64_t rows = static_cast<std::int64_t>(row_loss.extent(0));
  Kokkos::parallel_for(
      "kshard::cross_entropy_total", one_team(), KOKKOS_LAMBDA(const Team& team) {
        double total = 0;
        compat::team_reduce(
            team, rows, [&](std::int64_t r, double& s) { s += row_loss(r); }, total);
        Kokkos::single(Kokkos::PerTeam(team), [&]() {
          result(0) = !mean ? total : result(1) > 0 ? total / result(1) : 0.0;
        });
      });
}

// mean = false (with dlogits null: the forward-only mode): result(0) is the
// sum of the counted rows' losses instead of their mean.
template <class T, class Target>
void cross_entropy(const T* logits, std::int64_t rows, std::int64_t vocab,
                   Kokkos::View<const Target*> targets, T* dlogits, double grad_scale,
                   Kokkos::View<double*> result, bool mean = true) {
  count_targets<T, Target>(targets, vocab, result);
  memory::Block block = memory::acquire(std::size_t(rows) * sizeof(double),
                                        "kshard::cross_entropy.row_loss");
  Kokkos::View<double*> row_loss = block.view<double>(std::size_t(rows));
  row_losses<T, Target>(logits, rows, vocab, targets, dlogits, grad_scale, result, row_loss);
  mean_loss(row_loss, result, mean);
  // The row buffer goes back to the pool with the kernels queued: later users
  // are ordered after them (kshard/core/buffer_pool.hpp).
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

namespace {
std::string ce_who(const char* fn, std::int64_t rows, std::int64_t vocab) {
  return std::string(fn) + "(rows=" + std::to_string(rows) + ", vocab=" + std::to_string(vocab) +
         ")";
}

/// The arguments every cross-entropy entry point shares; dlogits null: the
/// forward-only mode (no gradient buffer).
template <class T, class Target>
void check_ce_args(const char* fn, Kokkos::View<const T*> logits, std::int64_t rows,
                   std::int64_t vocab, Kokkos::View<const Target*> targets,
                   const Kokkos::View<T*>* dlogits, std::size_t result_size) {
  const std::string who = ce_who(fn, rows, vocab);
  if (rows <= 0 || vocab <= 0) throw Error(who, "rows > 0 and vocab > 0");
  detail::check_size(who, "logits", logits.extent(0), rows * vocab);
  if (dlogits) detail::check_size(who, "dlogits", dlogits->extent(0), rows * vocab);
  detail::check_size(who, "targets", targets.extent(0), rows);
  if (result_size < 3) detail::check_size(who, "result", result_size, 3);
}

/// The result on the host (waits); a bad target is an error naming `fn`.
Kokkos::View<const double*, Kokkos::HostSpace> read_result(const char* fn,
                                                           Kokkos::View<const double*> result,
                                                           std::int64_t rows,
                                                           std::int64_t vocab) {
  auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), result);
  if (h(2) != 0)
    throw Error(ce_who(fn, rows, vocab) + ": " + std::to_string(std::int64_t(h(2))) +
                    " targets are >= vocab",
                "targets in [0, vocab), or negative to ignore a row");
  return h;
}
}  // namespace

template <class T, class Target>
void cross_entropy_loss_async(Kokkos::View<const T*> logits, std::int64_t rows,
                              std::int64_t vocab, Kokkos::View<const Target*> targets,
                              Kokkos::View<T*> dlogits, double grad_scale,
                              Kokkos::View<double*> result) {
  check_ce_args<T, Target>("cross_entropy_loss", logits, rows, vocab, targets, &dlogits,
                           result.extent(0));
  detail::loss::cross_entropy<T, Target>(logits.data(), rows, vocab, targets, dlogits.data(),
                                         grad_scale, result);
}

double cross_entropy_result(Kokkos::View<const double*> result, std::int64_t rows,
                            std::int64_t vocab) {
  return read_result("cross_entropy_loss", result, rows, vocab)(0);
}

template <class T, class Target>
double cross_entropy_loss(Kokkos::View<const T*> logits, std::int64_t rows, std::int64_t vocab,
                          Kokkos::View<const Target*> targets, Kokkos::View<T*> dlogits,
                          double grad_scale) {
  check_ce_args<T, Target>("cross_entropy_loss", logits, rows, vocab, targets, &dlogits, 3);
  memory::Block block = memory::acquire(3 * sizeof(double), "kshard::cross_entropy.result");
  auto result = block.view<double>(3);
  detail::loss::cross_entropy<T, Target>(logits.data(), rows, vocab, targets, dlogits.data(),
                                         grad_scale, result);
  return cross_entropy_result(result, rows, vocab);
}

template <class T, class Target>
CrossEntropySum cross_entropy_sum(Kokkos::View<const T*> logits, std::int64_t rows,
                                  std::int64_t vocab, Kokkos::View<const Target*> targets) {
  check_ce_args<T, Target>("cross_entropy_sum", logits, rows, vocab, targets, nullptr, 3);
  memory::Block block = memory::acquire(3 * sizeof(double), "kshard::cross_entropy.result");
  auto result = block.view<double>(3);
  // No gradient buffer, and the total instead of the mean.
  detail::loss::cross_entropy<T, Target>(logits.data(), rows, vocab, targets, nullptr, 1.0,
                                         result, /*mean=*/false);
  const auto h = read_result("cross_entropy_sum", result, rows, vocab);
  return CrossEntropySum{h(0), std::int64_t(h(1))};
}

#define KSHARD_CE_INSTANTIATE(T, Target)                                                  \
  template CrossEntropySum cross_entropy_sum<T, Target>(                                  \
      Kokkos::View<const T*>, std::int64_t, std::int64_t, Kokkos::View<const Target*>);   \
  template double cross_entropy_loss<T, Target>(Kokkos::View<const T*>, std::int64_t,     \
                                                std::int64_t, Kokkos::View<const Target*>, \
                                                Kokkos::View<T*>, double);                 \
  template void cross_entropy_loss_async<T, Target>(                                      \
      Kokkos::View<const T*>, std::int64_t, std::int64_t, Kokkos::View<const Target*>,    \
      Kokkos::View<T*>, double, Kokkos::View<double*>);
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
KSHARD_FOR_EACH_CE_PAIR(KSHARD_CE_INSTANTIATE)
#undef KSHARD_CE_INSTANTIATE

namespace detail::loss {
#define KSHARD_CE_PARTS_INSTANTIATE(T, Target)                                              \
  template void count_targets<T, Target>(Kokkos::View<const Target*>, std::int64_t,           \
                                         Kokkos::View<double*>);                              \
  template void row_losses<T, Target>(const T*, std::int64_t, std::int64_t,                   \
                                      Kokkos::View<const Target*>, T*, double,                \
                                      Kokkos::View<const double*>, Kokkos::View<double*>);
KSHARD_FOR_EACH_CE_PAIR(KSHARD_CE_PARTS_INSTANTIATE)
#undef KSHARD_CE_PARTS_INSTANTIATE
}  // namespace detail::loss

}  // namespace kshard
