// Clock-aligned window math, storage key layout and key validation.
//
//   WindowSpec spec{.window_ms = 60'000, .grace_ms = 1'000};
//   WindowPos pos = locate(spec, "user:42", now_ms);
//   // pos.start_ms is a multiple of 60 s since the epoch; pos.expire_at_ms = end + grace.
//
// With `stagger`, each key's windows are shifted by a deterministic offset in
// [0, window) derived from the key (FNV-1a), so hourly counters of many keys do not
// all reset in the same millisecond.
//
// With a `calendar`, windows are that calendar's periods of `calendar_unit` instead
// (days, weeks, months, years in a time zone; see calendar.h): `index` is then the
// period's start in epoch ms and `span_ms` its length, so the pair names one period of
// one calendar (a key built from them is unique per period).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "redcount/common/calendar.h"
#include "redcount/common/keys.h"

namespace redcount {

inline constexpr std::size_t kMaxKeyBytes = 1024;
inline constexpr std::size_t kMaxRequestIdBytes = 256;

struct WindowSpec {
  std::int64_t window_ms = 0;
  std::int64_t grace_ms = 0;
  bool stagger = false;
  // Calendar windows (window_ms is then only the unit's nominal length; stagger must be off).
  std::shared_ptr<const Calendar> calendar{};
  CalendarUnit calendar_unit = CalendarUnit::Day;
};

struct WindowPos {
  std::int64_t index = 0;     // which window since the epoch (per key offset applied)
  std::int64_t start_ms = 0;  // inclusive
  std::int64_t end_ms = 0;    // exclusive
  std::int64_t expire_at_ms = 0;  // end_ms + grace_ms: the key's PEXPIREAT deadline
  std::int64_t span_ms = 0;   // the window length that storage keys carry (window_ms, or the period's)
};

// Throws InvalidArgument unless window_ms > 0, grace_ms >= 0 and both fit the clock, and
// a calendar comes without stagger.
void validate(const WindowSpec& spec);
// The calendar unit of a window given as a limit-string unit and multiple ("1 month",
// "3 months"): InvalidArgument, naming the calendar, for a unit that is no calendar period
// or a multiple outside 1 .. a century of that unit (periods of several units are counted
// from a fixed epoch: calendar.h).
CalendarUnit require_calendar_unit(std::string_view unit, std::int64_t multiple, const Calendar& calendar);
// Converts seconds to whole milliseconds; rejects NaN, infinities, <= 0 and < 1 ms.
std::int64_t window_seconds_to_ms(double seconds, const char* what = "window");

std::uint64_t fnv1a64(std::string_view data) noexcept;
std::int64_t stagger_offset(std::string_view key, std::int64_t window_ms) noexcept;
WindowPos locate(const WindowSpec& spec, std::string_view key, std::int64_t now_ms) noexcept;

// A user key: 1..kMaxKeyBytes bytes of valid UTF-8. `what` names it in the error.
void validate_key(std::string_view key, const char* what = "key");
// A request id: 1..kMaxRequestIdBytes bytes of valid UTF-8.
void validate_request_id(std::string_view id);
// A prefix or counter name: non-empty, <= 256 bytes, UTF-8, no '{' or '}' (they would
// change the Redis Cluster hash tag of every key).
void validate_name(std::string_view name, const char* what);
bool is_valid_utf8(std::string_view s) noexcept;

// Storage keys (window_key, request_id_key...) are built in keys.h.

}  // namespace redcount
