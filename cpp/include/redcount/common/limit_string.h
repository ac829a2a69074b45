// Rate-limit strings: "10/minute", "10 per minute", "100/5 minutes", "5/second;100/hour",
// and for the token-bucket and gcra strategies an optional burst: "10/second burst 50".
//
//   std::vector<RateLimit> limits = parse_limits("5/second;100/hour");
//   // limits[1].amount == 100, limits[1].window_ms == 3'600'000
//
// Units: second, minute, hour, day, week (7 days), month (30 days), year (365 days), each
// also plural and as s/sec, m/min, h/hr, d, wk/w. (A limiter with a calendar makes day,
// week, month and year calendar periods instead: see calendar.h.) Separators between
// limits: ';' or ','. A bad string
// throws InvalidArgument naming the part that is wrong.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace redcount {

struct RateLimit {
  std::int64_t amount = 0;     // events allowed per window; 1 .. 2^53-1
  std::int64_t multiple = 1;   // the "5" in "100/5 minutes"
  std::int64_t window_ms = 0;  // multiple * unit
  std::string unit;            // canonical singular unit name ("minute")
  std::int64_t burst = 0;      // "burst N": bucket capacity; 0 = not given (capacity = amount)
  std::int64_t capacity() const noexcept { return burst > 0 ? burst : amount; }
  std::string text() const;    // canonical form, e.g. "100/5 minutes", "10/second burst 50"
};

std::vector<RateLimit> parse_limits(std::string_view text);

}  // namespace redcount
