#include "redcount/common/calendar.h"

#include <algorithm>
#include <tuple>
#include <utility>

#include "redcount/common/errors.h"

namespace redcount {
namespace {

constexpr std::int64_t kDayMs = 86'400'000;
constexpr std::int64_t kMaxOffsetMs = 26 * 3'600'000LL;

std::int64_t floor_div(std::int64_t a, std::int64_t b) noexcept {
  std::int64_t q = a / b;
  if (a % b != 0 && (a < 0) != (b < 0)) --q;
  return q;
}

// The anchored month start's day in (year, month): the anchor, or the month's last day.
unsigned anchored_day(std::int64_t y, unsigned m, int anchor) noexcept {
  return std::min(static_cast<unsigned>(anchor), days_in_month(y, m));
}

}  // namespace

// Howard Hinnant's algorithms (http://howardhinnant.github.io/date_algorithms.html).
std::int64_t days_from_civil(std::int64_t y, unsigned m, unsigned d) noexcept {
  y -= m <= 2;
  const std::int64_t era = (y >= 0 ? y : y - 399) / 400;
  const auto yoe = static_cast<unsigned>(y - era * 400);
  const unsigned doy = (153 * (m > 2 ? m - 3 : m + 9) + 2) / 5 + d - 1;
  const unsigned doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
  return era * 146097 + static_cast<std::int64_t>(doe) - 719468;
}

CivilDate civil_from_days(std::int64_t z) noexcept {
  z += 719468;
  const std::int64_t era = (z >= 0 ? z : z - 146096) / 146097;
  const auto doe = static_cast<unsigned>(z - era * 146097);
  const unsigned yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
  const std::int64_t y = static_cast<std::int64_t>(yoe) + era * 400;
  const unsigned doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
  const unsigned mp = (5 * doy + 2) / 153;
  const unsigned d = doy - (153 * mp + 2) / 5 + 1;
  const unsigned m = mp < 10 ? mp + 3 : mp - 9;
  return CivilDate{y + (m <= 2), m, d};
}

unsigned days_in_month(std::int64_t y, unsigned m) noexcept {
  static constexpr unsigned kDays[] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
  if (m == 2) {
    const bool leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
    return leap ? 29 : 28;
  }
  return kDays[m - 1];
}

std::optional<CalendarUnit> calendar_unit(std::string_view unit) noexcept {
  if (unit == "day") return CalendarUnit::Day;
  if (unit == "week") return CalendarUnit::Week;
  if (unit == "month") return CalendarUnit::Month;
  if (unit == "year") return CalendarUnit::Year;
  return std::nullopt;
}

std::string_view calendar_unit_name(CalendarUnit unit) noexcept {
  switch (unit) {
    case CalendarUnit::Day: return "day";
    case CalendarUnit::Week: return "week";
    case CalendarUnit::Month: return "month";
    case CalendarUnit::Year: return "year";
  }
  return "?";
}

Calendar::Calendar(std::string zone, std::vector<std::int64_t> at_ms, std::vector<std::int64_t> offsets_ms,
                   int anchor_day)
    : zone_(std::move(zone)), at_(std::move(at_ms)), offsets_(std::move(offsets_ms)), anchor_day_(anchor_day) {
  if (anchor_day < 1 || anchor_day > 31) {
    throw InvalidArgument("anchor_day must be between 1 and 31, got " + std::to_string(anchor_day));
  }
  if (offsets_.size() != at_.size() + 1) {
    throw InvalidArgument("a time zone table needs one offset more than transitions");
  }
  if (!std::is_sorted(at_.begin(), at_.end()) || std::adjacent_find(at_.begin(), at_.end()) != at_.end()) {
    throw InvalidArgument("a time zone table's transitions must be strictly ascending");
  }
  for (std::int64_t o : offsets_) {
    if (o < -kMaxOffsetMs || o > kMaxOffsetMs) {
      throw InvalidArgument("a UTC offset must be within +-26 hours, got " + std::to_string(o) + " ms");
    }
  }
}

std::int64_t Calendar::offset_at(std::int64_t utc_ms) const noexcept {
  const auto i = std::upper_bound(at_.begin(), at_.end(), utc_ms) - at_.begin();
  return offsets_[static_cast<std::size_t>(i)];
}

std::int64_t Calendar::utc_of_local(std::int64_t local_ms) const noexcept {
  // The offsets a day either side: the wall-clock time maps to one instant, two (a fold:
  // take the earlier) or none (a gap: the change itself is the first instant after it).
  const std::int64_t before = offset_at(local_ms - kDayMs);
  const std::int64_t after = offset_at(local_ms + kDayMs);
  const std::int64_t c1 = local_ms - before, c2 = local_ms - after;
  const bool ok1 = offset_at(c1) == before, ok2 = offset_at(c2) == after;
  if (ok1 && ok2) return std::min(c1, c2);
  if (ok1) return c1;
  if (ok2) return c2;
  const auto it = std::upper_bound(at_.begin(), at_.end(), std::min(c1, c2));
  return it == at_.end() ? c1 : *it;
}

// The local days [first, next) of the period of `n` units that holds local day `day`.
// Periods of n units are counted from a fixed epoch (see calendar.h), so that every
// process, at any time, cuts time into the same periods.
std::pair<std::int64_t, std::int64_t> Calendar::days_of(CalendarUnit unit, std::int64_t day,
                                                        std::int64_t n) const noexcept {
  switch (unit) {
    case CalendarUnit::Day: {
      const std::int64_t first = floor_div(day, n) * n;  // day 0: 1970-01-01
      return {first, first + n};
    }
    case CalendarUnit::Week: {
      // Weeks since Monday 1969-12-29 (day -3; 1970-01-01 was a Thursday).
      const std::int64_t week = floor_div(day + 3, 7);
      const std::int64_t first = floor_div(week, n) * n;
      return {first * 7 - 3, (first + n) * 7 - 3};
    }
    case CalendarUnit::Month: {
      const CivilDate c = civil_from_days(day);
      std::int64_t y = c.year;
      unsigned m = c.month;
      if (c.day < anchored_day(y, m, anchor_day_)) {  // still in the period that began last month
        if (--m == 0) m = 12, --y;
      }
      // Months since January 1970; a period of n months starts on a multiple of n.
      const std::int64_t index = floor_div((y - 1970) * 12 + (m - 1), n) * n;
      auto start_of = [this](std::int64_t months) {
        const std::int64_t yy = 1970 + floor_div(months, 12);
        const auto mm = static_cast<unsigned>(months - floor_div(months, 12) * 12 + 1);
        return days_from_civil(yy, mm, anchored_day(yy, mm, anchor_day_));
      };
      return {start_of(index), start_of(index + n)};
    }
    case CalendarUnit::Year: {
      const CivilDate c = civil_from_days(day);
      const std::int64_t first = 1970 + floor_div(c.year - 1970, n) * n;
      return {days_from_civil(first, 1, 1), days_from_civil(first + n, 1, 1)};
    }
  }
  return {day, day + 1};
}

Period Calendar::period(CalendarUnit unit, std::int64_t now_ms, std::int64_t multiple) const noexcept {
  const std::int64_t n = std::max<std::int64_t>(1, multiple);
  const std::int64_t day = floor_div(now_ms + offset_at(now_ms), kDayMs);
  auto [first, next] = days_of(unit, day, n);
  Period p{utc_of_local(first * kDayMs), utc_of_local(next * kDayMs)};
  if (p.end_ms <= now_ms) {
    // A fold across midnight (the wall clock set back past 00:00): the next period began at
    // the first midnight, and the repeated hour before midnight belongs to it.
    std::tie(first, next) = days_of(unit, next, n);
    p = Period{utc_of_local(first * kDayMs), utc_of_local(next * kDayMs)};
  }
  // Defensive only (offset changes less than a day apart): never a period without `now`.
  p.start_ms = std::min(p.start_ms, now_ms);
  p.end_ms = std::max(p.end_ms, now_ms + 1);
  return p;
}

}  // namespace redcount
