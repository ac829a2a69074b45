// Calendar periods in a time zone (calendar.h) and calendar windows (window.h), with the
// 2026 offset changes of Europe/Berlin and America/New_York written out by hand.
#include <gtest/gtest.h>

#include <cstdint>
#include <memory>

#include "redcount/common/calendar.h"
#include "redcount/common/clock.h"
#include "redcount/common/errors.h"
#include "redcount/common/window.h"
#include "redcount/counters/fixed_window.h"
#include "redcount/limiters/limiter.h"
#include "redcount/sharded/quota.h"
#include "test_support.h"

using namespace redcount;

namespace {

constexpr std::int64_t kH = 3'600'000;
constexpr std::int64_t kD = 24 * kH;

// UTC instant (ms) of a wall-clock time in a zone whose offset is `off` at that time.
std::int64_t at(std::int64_t y, unsigned m, unsigned d, std::int64_t hour, std::int64_t off) {
  return days_from_civil(y, m, d) * kD + hour * kH - off;
}

// Europe/Berlin in 2026: CET (+1) until 29 Mar 01:00 UTC, CEST (+2) until 25 Oct 01:00 UTC.
Calendar berlin(int anchor = 1) {
  return Calendar("Europe/Berlin", {1'774'746'000'000, 1'792'890'000'000}, {kH, 2 * kH, kH}, anchor);
}
// America/New_York in 2026: EST (-5) until 8 Mar 07:00 UTC, EDT (-4) until 1 Nov 06:00 UTC.
Calendar new_york() {
  return Calendar("America/New_York", {1'772'953'200'000, 1'793'512'800'000}, {-5 * kH, -4 * kH, -5 * kH});
}

TEST(Civil, RoundTripsEveryDayFrom1900To2200) {
  const std::int64_t from = days_from_civil(1900, 1, 1), to = days_from_civil(2200, 1, 1);
  for (std::int64_t z = from; z < to; ++z) {
    const CivilDate c = civil_from_days(z);
    ASSERT_EQ(days_from_civil(c.year, c.month, c.day), z);
  }
  EXPECT_EQ(days_from_civil(1970, 1, 1), 0);
  EXPECT_EQ(days_in_month(2026, 2), 28u);
  EXPECT_EQ(days_in_month(2028, 2), 29u);
  EXPECT_EQ(days_in_month(2100, 2), 28u);
  EXPECT_EQ(days_in_month(2000, 2), 29u);
}

TEST(Calendar, DaysOf23And25HoursOnEuropeanDstChanges) {
  const Calendar c = berlin();
  const Period spring = c.period(CalendarUnit::Day, at(2026, 3, 29, 12, 2 * kH));
  EXPECT_EQ(spring.start_ms, at(2026, 3, 29, 0, kH));
  EXPECT_EQ(spring.end_ms, at(2026, 3, 30, 0, 2 * kH));
  EXPECT_EQ(spring.end_ms - spring.start_ms, 23 * kH);
  const Period autumn = c.period(CalendarUnit::Day, at(2026, 10, 25, 2, kH) + 30 * 60'000);  // the second 02:30
  EXPECT_EQ(autumn.start_ms, at(2026, 10, 25, 0, 2 * kH));
  EXPECT_EQ(autumn.end_ms - autumn.start_ms, 25 * kH);
  // Boundaries: inclusive start, exclusive end.
  EXPECT_EQ(c.period(CalendarUnit::Day, spring.end_ms).start_ms, spring.end_ms);
  EXPECT_EQ(c.period(CalendarUnit::Day, spring.end_ms - 1).start_ms, spring.start_ms);
}

TEST(Calendar, DaysOf23And25HoursOnUsDstChanges) {
  const Calendar c = new_york();
  const Period spring = c.period(CalendarUnit::Day, at(2026, 3, 8, 12, -4 * kH));
  EXPECT_EQ(spring.start_ms, at(2026, 3, 8, 0, -5 * kH));
  EXPECT_EQ(spring.end_ms - spring.start_ms, 23 * kH);
  const Period autumn = c.period(CalendarUnit::Day, at(2026, 11, 1, 12, -5 * kH));
  EXPECT_EQ(autumn.start_ms, at(2026, 11, 1, 0, -4 * kH));
  EXPECT_EQ(autumn.end_ms - autumn.start_ms, 25 * kH);
}

TEST(Calendar, WeeksStartOnMonday) {
  const Calendar c = berlin();
  // 29 Mar 2026 is a Sunday: its week is Mon 23 Mar .. Mon 30 Mar, one hour short.
  const Period p = c.period(CalendarUnit::Week, at(2026, 3, 29, 12, 2 * kH));
  EXPECT_EQ(p.start_ms, at(2026, 3, 23, 0, kH));
  EXPECT_EQ(p.end_ms, at(2026, 3, 30, 0, 2 * kH));
  EXPECT_EQ(p.end_ms - p.start_ms, 7 * kD - kH);
  // Monday 00:00 starts the next one.
  EXPECT_EQ(c.period(CalendarUnit::Week, p.end_ms).start_ms, p.end_ms);
}

TEST(Calendar, MonthsAndFebruary) {
  const Calendar c = berlin();
  const Period feb = c.period(CalendarUnit::Month, at(2026, 2, 14, 12, kH));
  EXPECT_EQ(feb.start_ms, at(2026, 2, 1, 0, kH));
  EXPECT_EQ(feb.end_ms - feb.start_ms, 28 * kD);
  const Period mar = c.period(CalendarUnit::Month, at(2026, 3, 31, 23, 2 * kH));
  EXPECT_EQ(mar.start_ms, feb.end_ms);
  EXPECT_EQ(mar.end_ms - mar.start_ms, 31 * kD - kH);
  const Period year = c.period(CalendarUnit::Year, at(2026, 7, 1, 0, 2 * kH));
  EXPECT_EQ(year.start_ms, at(2026, 1, 1, 0, kH));
  EXPECT_EQ(year.end_ms - year.start_ms, 365 * kD);
}

TEST(Calendar, AnchorDaysClampToTheLastDayOfShortMonths) {
  // anchor 15: 15 Mar .. 15 Apr, and a time before the 15th belongs to last month's period.
  const Calendar c15 = berlin(15);
  const Period p = c15.period(CalendarUnit::Month, at(2026, 4, 14, 23, 2 * kH));
  EXPECT_EQ(p.start_ms, at(2026, 3, 15, 0, kH));
  EXPECT_EQ(p.end_ms, at(2026, 4, 15, 0, 2 * kH));
  // anchors 29, 30, 31 in February 2026 (28 days): the period starts on 28 Feb.
  for (int a : {29, 30, 31}) {
    const Calendar c = berlin(a);
    const Period feb = c.period(CalendarUnit::Month, at(2026, 3, 1, 12, kH));
    EXPECT_EQ(feb.start_ms, at(2026, 2, 28, 0, kH)) << a;
    EXPECT_EQ(feb.end_ms, at(2026, 3, static_cast<unsigned>(a), 0, a == 29 ? kH : 2 * kH)) << a;
    const Period jan = c.period(CalendarUnit::Month, at(2026, 2, 27, 12, kH));
    EXPECT_EQ(jan.start_ms, at(2026, 1, static_cast<unsigned>(a), 0, kH)) << a;
    EXPECT_EQ(jan.end_ms, feb.start_ms) << a;
  }
  // anchor 31 across the year: 31 Mar, 30 Apr, 31 May, ..., each period tiling the next.
  const Calendar c31 = berlin(31);
  std::int64_t t = at(2026, 1, 31, 0, kH);
  for (int i = 0; i < 12; ++i) {
    const Period q = c31.period(CalendarUnit::Month, t);
    ASSERT_EQ(q.start_ms, t);
    const CivilDate end = civil_from_days((q.end_ms + c31.offset_at(q.end_ms)) / kD);
    EXPECT_EQ(end.day, days_in_month(end.year, end.month));
    t = q.end_ms;
  }
}

TEST(Calendar, MidnightInAGapStartsAfterTheGap) {
  // A zone that moves from +0 to +1 at local midnight of 8 Mar 2026: 00:00 never shows.
  const std::int64_t change = at(2026, 3, 8, 0, 0);
  const Calendar c("Test/Gap", {change}, {0, kH});
  const Period p = c.period(CalendarUnit::Day, change + 5 * kH);
  EXPECT_EQ(p.start_ms, change);
  EXPECT_EQ(p.end_ms - p.start_ms, 23 * kH);
  EXPECT_EQ(c.period(CalendarUnit::Day, change - 1).end_ms, change);
}

TEST(Calendar, ADstEndAtMidnightMakesThePreviousDayLonger) {
  // From +1 to +0 when 8 Mar 2026 would begin: after 23:59:59 the clock shows 23:00 of 7 Mar
  // again, so 7 Mar lasts 25 hours and 8 Mar 24 (midnight shows once).
  const std::int64_t change = at(2026, 3, 8, 0, kH);
  const Calendar c("Test/Back", {change}, {kH, 0});
  const Period seventh = c.period(CalendarUnit::Day, change);
  EXPECT_EQ(seventh.start_ms, at(2026, 3, 7, 0, kH));
  EXPECT_EQ(seventh.end_ms, at(2026, 3, 8, 0, 0));
  EXPECT_EQ(seventh.end_ms - seventh.start_ms, 25 * kH);
}

TEST(Calendar, AFoldAcrossMidnightKeepsPeriodsTiling) {
  // From +1 to +0 at 00:30 of 8 Mar 2026: 00:00..00:30 shows, then 23:30 of 7 Mar again, so
  // midnight shows twice. 7 Mar ends at the first; the repeated half hour belongs to 8 Mar.
  const std::int64_t change = at(2026, 3, 8, 0, kH) + kH / 2;
  const Calendar c("Test/Fold", {change}, {kH, 0});
  const std::int64_t first_midnight = at(2026, 3, 8, 0, kH);
  EXPECT_EQ(c.period(CalendarUnit::Day, first_midnight - 1).end_ms, first_midnight);
  for (std::int64_t t : {first_midnight, change, change + kH / 4, change + kH / 2}) {
    const Period p = c.period(CalendarUnit::Day, t);
    EXPECT_EQ(p.start_ms, first_midnight) << t;
    EXPECT_EQ(p.end_ms, at(2026, 3, 9, 0, 0)) << t;
  }
}

TEST(Calendar, HalfHourOffsetsAndNoTransitions) {
  const Calendar utc("UTC", {}, {0});
  const Period p = utc.period(CalendarUnit::Day, 1'772'953'200'123);
  EXPECT_EQ(p.start_ms % kD, 0);
  EXPECT_EQ(p.end_ms - p.start_ms, kD);
  const Calendar kolkata("Asia/Kolkata", {}, {5 * kH + kH / 2});
  // UTC midnight is 05:30 in Kolkata: its day began five and a half hours before.
  EXPECT_EQ(kolkata.period(CalendarUnit::Day, p.start_ms).start_ms, p.start_ms - 5 * kH - kH / 2);
}

TEST(Calendar, RejectsBadTablesAndAnchors) {
  EXPECT_THROW(Calendar("Z", {}, {0}, 0), InvalidArgument);
  EXPECT_THROW(Calendar("Z", {}, {0}, 32), InvalidArgument);
  EXPECT_THROW(Calendar("Z", {1}, {0}), InvalidArgument);
  EXPECT_THROW(Calendar("Z", {2, 1}, {0, 0, 0}), InvalidArgument);
  EXPECT_THROW(Calendar("Z", {}, {27 * kH}), InvalidArgument);
}

TEST(CalendarWindow, KeysCarryThePeriodAndTtlsItsEnd) {
  WindowSpec spec{30 * kD, 1'000, false};
  spec.calendar = std::make_shared<const Calendar>(berlin());
  spec.calendar_unit = CalendarUnit::Month;
  validate(spec);
  const WindowPos pos = locate(spec, "k", at(2026, 3, 10, 0, kH));
  EXPECT_EQ(pos.index, at(2026, 3, 1, 0, kH));
  EXPECT_EQ(pos.span_ms, 31 * kD - kH);
  EXPECT_EQ(pos.expire_at_ms, at(2026, 4, 1, 0, 2 * kH) + 1'000);
  spec.stagger = true;
  EXPECT_THROW(validate(spec), InvalidArgument);
  EXPECT_EQ(require_calendar_unit("week", 1, *spec.calendar), CalendarUnit::Week);
  EXPECT_THROW(require_calendar_unit("hour", 1, *spec.calendar), InvalidArgument);
  EXPECT_EQ(require_calendar_unit("day", 2, *spec.calendar), CalendarUnit::Day);
  EXPECT_EQ(require_calendar_unit("month", 1200, *spec.calendar), CalendarUnit::Month);
  EXPECT_THROW(require_calendar_unit("year", 101, *spec.calendar), InvalidArgument);
  EXPECT_THROW(require_calendar_unit("day", 0, *spec.calendar), InvalidArgument);
}

TEST(Calendar, MultiplesCountFromTheEpoch) {
  const Calendar c = berlin();
  // Two days from 1970-01-01: 28-29 Mar 2026 (day 20540 is even) holds the 23-hour day.
  const Period two = c.period(CalendarUnit::Day, at(2026, 3, 29, 12, 2 * kH), 2);
  EXPECT_EQ(two.start_ms, at(2026, 3, 28, 0, kH));
  EXPECT_EQ(two.end_ms, at(2026, 3, 30, 0, 2 * kH));
  EXPECT_EQ(two.end_ms - two.start_ms, 47 * kH);
  EXPECT_EQ(c.period(CalendarUnit::Day, two.end_ms, 2).start_ms, two.end_ms);  // tiling
  // Quarters: months from January 1970 in threes.
  const Period q = c.period(CalendarUnit::Month, at(2026, 5, 20, 12, 2 * kH), 3);
  EXPECT_EQ(q.start_ms, at(2026, 4, 1, 0, 2 * kH));
  EXPECT_EQ(q.end_ms, at(2026, 7, 1, 0, 2 * kH));
  const Calendar anchored = berlin(15);
  const Period aq = anchored.period(CalendarUnit::Month, at(2026, 4, 14, 12, 2 * kH), 3);
  EXPECT_EQ(aq.start_ms, at(2026, 1, 15, 0, kH));
  EXPECT_EQ(aq.end_ms, at(2026, 4, 15, 0, 2 * kH));
  // Two weeks from Monday 1969-12-29, two years from 1970.
  const Period w = c.period(CalendarUnit::Week, at(2026, 3, 29, 12, 2 * kH), 2);
  EXPECT_EQ(w.end_ms - w.start_ms, 14 * kD - kH);
  EXPECT_EQ((days_from_civil(2026, 3, 23) + 3) / 7 % 2, 0);
  EXPECT_EQ(w.start_ms, at(2026, 3, 23, 0, kH));
  const Period y = c.period(CalendarUnit::Year, at(2027, 6, 1, 0, 2 * kH), 2);
  EXPECT_EQ(y.start_ms, at(2026, 1, 1, 0, kH));
  EXPECT_EQ(c.period(CalendarUnit::Day, at(2026, 3, 29, 12, 2 * kH), 1).start_ms,
            c.period(CalendarUnit::Day, at(2026, 3, 29, 12, 2 * kH)).start_ms);
}

TEST(CalendarWindow, ClockWindowsAreUnchanged) {
  const WindowSpec spec{60'000, 1'000, false};
  const WindowPos pos = locate(spec, "k", 1'700'000'000'123);
  EXPECT_EQ(pos.span_ms, 60'000);
  EXPECT_EQ(pos.index, 1'700'000'000'123 / 60'000);
}

// The same on a memory store whose clock the test moves: the limiter, the counter and a
// quota with a monthly reset, across Berlin's spring change.
TEST(CalendarStores, LimiterCounterAndQuotaFollowThePeriods) {
  auto clock = std::make_shared<ManualClock>(at(2026, 3, 28, 23, kH));
  auto store = rctest::memory_store(clock);
  auto cal = std::make_shared<const Calendar>(berlin(29));

  LimiterOptions lo;
  lo.calendar = cal;
  auto limiter = make_limiter(store, "fixed-window", lo);
  const auto limits = parse_limits("2/day;3/month");
  EXPECT_TRUE(limiter->hit(limits, "u", 1).allowed);
  EXPECT_TRUE(limiter->hit(limits, "u", 1).allowed);
  EXPECT_FALSE(limiter->hit(limits, "u", 1).allowed);
  clock->set(at(2026, 3, 29, 0, kH));  // the 23-hour day; the month period (from the 29th) is new too
  const Decision d = limiter->hit(limits, "u", 1);
  EXPECT_TRUE(d.allowed);
  EXPECT_EQ(d.remaining, 1);
  EXPECT_EQ(d.reset_after_ms, 23 * kH);
  EXPECT_THROW(limiter->hit(parse_limits("5/hour"), "u", 1), InvalidArgument);
  LimiterOptions bad = lo;
  EXPECT_THROW(make_limiter(store, "gcra", bad), InvalidArgument);

  FixedWindowOptions fo;
  fo.name = "cal";
  fo.window_ms = 7 * kD;
  fo.calendar = cal;
  fo.calendar_unit = CalendarUnit::Week;
  FixedWindowCounter counter(store, fo);
  EXPECT_EQ(counter.incr("k", 2), 2);
  const WindowPos w = counter.window("k");
  EXPECT_EQ(w.start_ms, at(2026, 3, 23, 0, kH));
  EXPECT_EQ(counter.pttl("k"), at(2026, 3, 30, 0, 2 * kH) + fo.grace_ms - clock->now_ms());
  clock->set(at(2026, 3, 30, 0, 2 * kH));
  EXPECT_EQ(counter.get("k"), 0);

  QuotaOptions qo;
  qo.name = "credits";
  qo.calendar = cal;
  qo.period = CalendarUnit::Month;
  qo.reset_to = 10;
  Quota quota(store, qo);
  EXPECT_EQ(quota.value(), 10);
  EXPECT_EQ(quota.take(4, "r1").value, 6);
  EXPECT_TRUE(quota.take(4, "r1").duplicate);
  clock->set(at(2026, 4, 29, 0, 2 * kH));
  EXPECT_EQ(quota.value(), 10);
  EXPECT_EQ(quota.set(3).value, 3);
  EXPECT_EQ(quota.value(), 3);
  qo.reset_to = -1;
  EXPECT_THROW(Quota(store, qo), InvalidArgument);
}

}  // namespace
