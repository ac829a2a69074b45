// Calendar periods in a time zone: days, ISO weeks (Monday to Monday), months (optionally
// anchored on a day of the month, for billing periods) and years, as [start, end) in epoch
// milliseconds.
//
//   auto berlin = std::make_shared<const Calendar>("Europe/Berlin", transitions, offsets, 15);
//   Period p = berlin->period(CalendarUnit::Month, now_ms);
//   // p.start_ms: the 15th of this or the previous month at 00:00 Berlin time.
//
// The zone is a table of UTC-offset changes (the instant of each change and the offset in
// force from it), which the caller supplies: the Python package reads it from the IANA
// database through zoneinfo once per zone. Everything here is pure arithmetic on that
// immutable table, so a Calendar is thread-safe and one lookup is a binary search.
//
// Rules:
// - A period starts at local midnight of its first day. When that midnight does not exist
//   (a DST gap at 00:00) it starts at the first instant after the gap; when it exists twice
//   (a fold), at the first of the two. A day is therefore 23 or 25 hours long on DST days.
//   Periods tile time: the end of one is the start of the next.
// - Months with anchor day A start on day A of each month; in a month shorter than A days
//   they start on its last day (A = 31: Jan 31, Feb 28/29, Mar 31, Apr 30, ...). A = 1 is
//   the calendar month. Weeks and years ignore the anchor; years start on January 1.
// - A period of n units ("10/2 days", "1000/3 months") is counted from a fixed epoch in
//   the zone, so every process cuts time the same way: n days from 1970-01-01, n weeks
//   from Monday 1969-12-29, n months from January 1970 (2, 3, 4, 6 or 12 months: every
//   year starts one; months begin on the anchor day as above), n years from 1970. Its
//   start and end are local midnights as for one unit (DST days inside it included).
// - Past the end of the table the last offset holds.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace redcount {

enum class CalendarUnit { Day, Week, Month, Year };

// "day", "week", "month" or "year"; nullopt for any other unit.
std::optional<CalendarUnit> calendar_unit(std::string_view unit) noexcept;
std::string_view calendar_unit_name(CalendarUnit unit) noexcept;

struct Period {
  std::int64_t start_ms = 0;  // inclusive
  std::int64_t end_ms = 0;    // exclusive
};

class Calendar {
 public:
  // `at_ms`: ascending instants at which the offset changes; `offsets_ms`: at_ms.size() + 1
  // offsets, [0] in force before at_ms[0], [i + 1] from at_ms[i]. Offsets are within
  // +-26 hours. anchor_day: 1..31. Throws InvalidArgument for a malformed table.
  Calendar(std::string zone, std::vector<std::int64_t> at_ms, std::vector<std::int64_t> offsets_ms,
           int anchor_day = 1);

  const std::string& zone() const noexcept { return zone_; }
  int anchor_day() const noexcept { return anchor_day_; }

  // The period of `multiple` (>= 1; less counts as 1) units that contains `now_ms`.
  Period period(CalendarUnit unit, std::int64_t now_ms, std::int64_t multiple = 1) const noexcept;

  // The UTC offset in force at an instant.
  std::int64_t offset_at(std::int64_t utc_ms) const noexcept;
  // The first instant whose wall-clock time is `local_ms` or later (local_ms: wall-clock
  // milliseconds counted as if the zone were UTC).
  std::int64_t utc_of_local(std::int64_t local_ms) const noexcept;

 private:
  std::pair<std::int64_t, std::int64_t> days_of(CalendarUnit unit, std::int64_t day, std::int64_t n) const noexcept;

  std::string zone_;
  std::vector<std::int64_t> at_;
  std::vector<std::int64_t> offsets_;
  int anchor_day_ = 1;
};

// Proleptic Gregorian calendar arithmetic on days since 1970-01-01.
std::int64_t days_from_civil(std::int64_t y, unsigned m, unsigned d) noexcept;
struct CivilDate {
  std::int64_t year;
  unsigned month;  // 1..12
  unsigned day;    // 1..31
};
CivilDate civil_from_days(std::int64_t days) noexcept;
unsigned days_in_month(std::int64_t year, unsigned month) noexcept;

}  // namespace redcount
