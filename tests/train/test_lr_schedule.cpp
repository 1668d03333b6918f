// LrSchedule against its closed form (written out again here, independently),
// at every step of several configurations, plus the exact end points and the
// config checks.
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <vector>

#include <kshard/error.hpp>
#include <kshard/optim/lr_schedule.hpp>

namespace {

using kshard::LrScheduleKind;

double expected(LrScheduleKind kind, double lr, double min_lr, long w, long t, long s) {
  if (s < w) return lr * double(s + 1) / double(w + 1);
  if (kind == LrScheduleKind::constant) return lr;
  const double p = (t - 1 - w) > 0 ? std::min(1.0, double(s - w) / double(t - 1 - w)) : 1.0;
  if (kind == LrScheduleKind::linear) return min_lr + (lr - min_lr) * (1.0 - p);
  return min_lr + (lr - min_lr) * 0.5 * (1.0 + std::cos(M_PI * p));
}

}  // namespace

BOOST_AUTO_TEST_CASE(values_follow_the_closed_form) {
  for (auto kind : {LrScheduleKind::constant, LrScheduleKind::linear, LrScheduleKind::cosine})
    for (long w : {0L, 1L, 5L, 20L})
      for (long t : {1L, 2L, 6L, 21L, 100L}) {
        const double lr = 6e-4, min_lr = kind == LrScheduleKind::constant ? 0.0 : 6e-5;
        const kshard::LrSchedule s({kind, lr, min_lr, w, t});
        for (long step = 0; step < t + 5; ++step) {
          const double want = expected(kind, lr, min_lr, w, t, step);
          BOOST_CHECK_MESSAGE(std::fabs(s.at(step) - want) <= 1e-15 * lr,
                              kshard::LrSchedule::kind_name(kind)
                                  << " warmup " << w << " total " << t << " step " << step << ": "
                                  << s.at(step) << " vs " << want);
        }
      }
}

BOOST_AUTO_TEST_CASE(end_points_are_exact) {
  const kshard::LrSchedule cos({LrScheduleKind::cosine, 1e-3, 1e-4, 10, 111});
  BOOST_CHECK(cos.at(10) == 1e-3);         // peak right after the warmup
  BOOST_CHECK(cos.at(110) == 1e-4);        // min_lr at the last step
  BOOST_CHECK(cos.at(500) == 1e-4);        // and after it
  BOOST_CHECK(cos.at(0) == 1e-3 / 11);     // warmup starts above 0
  BOOST_CHECK(std::fabs(cos.at(60) - 0.5 * (1e-3 + 1e-4)) < 1e-18);  // half way
  const kshard::LrSchedule lin({LrScheduleKind::linear, 2.0, 0.0, 0, 5});
  const std::vector<double> want = {2.0, 1.5, 1.0, 0.5, 0.0};
  for (int s = 0; s < 5; ++s) BOOST_CHECK(lin.at(s) == want[std::size_t(s)]);
  // Decay phase shorter than one step: min_lr from the end of the warmup on.
  const kshard::LrSchedule short_decay({LrScheduleKind::linear, 1.0, 0.25, 4, 5});
  BOOST_CHECK(short_decay.at(3) == 0.8);
  BOOST_CHECK(short_decay.at(4) == 0.25);
}

BOOST_AUTO_TEST_CASE(config_is_plain_data) {
  kshard::LrScheduleConfig c{LrScheduleKind::cosine, 3e-4, 3e-5, 7, 70};
  const kshard::LrSchedule a(c);
  const kshard::LrScheduleConfig saved = a.config();  // what a checkpoint stores
  const kshard::LrSchedule b(saved);
  BOOST_CHECK(saved == c);
  for (long s = 0; s < 80; ++s) BOOST_CHECK(a.at(s) == b.at(s));
}

BOOST_AUTO_TEST_CASE(bad_configs_throw) {
  using C = kshard::LrScheduleConfig;
  for (const C& c : {C{LrScheduleKind::constant, 0.0, 0.0, 0, 1},
                     C{LrScheduleKind::constant, NAN, 0.0, 0, 1},
                     C{LrScheduleKind::linear, 1e-3, 2e-3, 0, 10},
                     C{LrScheduleKind::linear, 1e-3, -1.0, 0, 10},
                     C{LrScheduleKind::cosine, 1e-3, 0.0, -1, 10},
                     C{LrScheduleKind::cosine, 1e-3, 0.0, 0, 0},
                     C{LrScheduleKind(7), 1e-3, 0.0, 0, 10}})
    BOOST_CHECK_THROW(kshard::LrSchedule{c}, kshard::Error);
  const kshard::LrSchedule ok({LrScheduleKind::constant, 1.0, 0.0, 0, 1});
  BOOST_CHECK_THROW(ok.at(-1), kshard::Error);
  BOOST_CHECK(kshard::LrSchedule::parse_kind("cosine") == LrScheduleKind::cosine);
  BOOST_CHECK_THROW(kshard::LrSchedule::parse_kind("step"), kshard::Error);
}
