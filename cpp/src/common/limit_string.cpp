#include "redcount/common/limit_string.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <utility>

#include "redcount/common/bounds.h"
#include "redcount/common/errors.h"
#include "redcount/common/util.h"

namespace redcount {
namespace {

constexpr std::size_t kMaxLimits = 16;
// Far more than 16 limits of the longest sensible spelling ("9007199254740991 per 999 seconds burst ...").
constexpr std::size_t kMaxLimitText = 2048;

struct Unit {
  std::string_view name;
  std::int64_t ms;
  std::array<std::string_view, 4> aliases;
};

constexpr std::array<Unit, 7> kUnits{{
    {"second", 1000, {"second", "seconds", "sec", "s"}},
    {"minute", 60'000, {"minute", "minutes", "min", "m"}},
    {"hour", 3'600'000, {"hour", "hours", "hr", "h"}},
    {"day", 86'400'000, {"day", "days", "d", "d"}},
    {"week", 7LL * 86'400'000, {"week", "weeks", "wk", "w"}},
    {"month", 30LL * 86'400'000, {"month", "months", "month", "month"}},
    {"year", 365LL * 86'400'000, {"year", "years", "yr", "y"}},
}};

std::string_view trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

// Quotes the whole string only when it holds more than the bad part (a list of limits), so
// that a single limit is not repeated in its own message.
[[noreturn]] void bad(std::string_view whole, std::string_view part, const std::string& why) {
  std::string message = "invalid rate limit '" + printable(trim(part)) + "'";
  if (trim(part) != trim(whole)) message += " in '" + printable(whole) + "'";
  throw InvalidArgument(message + ": " + why +
                        " (expected e.g. '10/minute', '10 per minute', '100/5 minutes', '5/second;100/hour')");
}

RateLimit parse_one(std::string_view whole, std::string_view part) {
  std::string_view s = trim(part);
  if (s.empty()) bad(whole, part, "empty limit");
  // An optional trailing "burst N".
  std::int64_t burst = 0;
  {
    const std::string low = ascii_lower(s);
    if (auto at = low.rfind("burst"); at != std::string::npos && at > 0 &&
                                      std::isspace(static_cast<unsigned char>(low[at - 1]))) {
      std::string_view burst_text = trim(s.substr(at + 5));
      auto b = parse_int64(burst_text);
      if (!b) bad(whole, part, "burst '" + printable(burst_text) + "' is not a whole number");
      if (*b < 1) bad(whole, part, "burst must be >= 1, got " + std::to_string(*b));
      if (*b > kMaxAmount) bad(whole, part, "burst must be <= 2^53-1");
      burst = *b;
      s = trim(s.substr(0, at));
    }
  }
  std::string_view amount_text, per_text;
  if (auto slash = s.find('/'); slash != std::string_view::npos) {
    amount_text = trim(s.substr(0, slash));
    per_text = trim(s.substr(slash + 1));
  } else {
    // "10 per minute"
    std::string low = ascii_lower(s);
    auto per = low.find(" per ");
    if (per == std::string::npos) bad(whole, part, "missing '/' or 'per'");
    amount_text = trim(s.substr(0, per));
    per_text = trim(s.substr(per + 5));
  }
  auto amount = parse_int64(amount_text);
  if (!amount) {
    if (!amount_text.empty() && std::isdigit(static_cast<unsigned char>(amount_text.back())) &&
        amount_text.find_first_not_of("0123456789") == std::string_view::npos) {
      bad(whole, part, "amount '" + printable(amount_text) + "' is too large");
    }
    bad(whole, part, "amount '" + printable(amount_text) + "' is not a whole number");
  }
  if (*amount < 1) bad(whole, part, "amount must be >= 1, got " + std::to_string(*amount));
  if (*amount > kMaxAmount) bad(whole, part, "amount must be <= 2^53-1");

  std::int64_t multiple = 1;
  std::string_view unit_text = per_text;
  std::size_t digits = 0;
  while (digits < per_text.size() && std::isdigit(static_cast<unsigned char>(per_text[digits]))) ++digits;
  if (digits > 0) {
    auto m = parse_int64(per_text.substr(0, digits));
    if (!m) bad(whole, part, "window multiple '" + printable(per_text.substr(0, digits)) + "' is not valid");
    if (*m < 1) bad(whole, part, "window multiple must be >= 1");
    multiple = *m;
    unit_text = trim(per_text.substr(digits));
  }
  if (unit_text.empty()) bad(whole, part, "missing time unit");
  const std::string unit = ascii_lower(unit_text);
  for (const Unit& u : kUnits) {
    for (auto alias : u.aliases) {
      if (unit == alias) {
        if (multiple > kMaxWindowMs / u.ms) bad(whole, part, "window is too long");
        RateLimit r;
        r.amount = *amount;
        r.multiple = multiple;
        r.window_ms = multiple * u.ms;
        r.unit = std::string(u.name);
        r.burst = burst;
        return r;
      }
    }
  }
  bad(whole, part, "unknown time unit '" + printable(unit_text) +
                       "' (use second, minute, hour, day, week, month or year)");
}

}  // namespace

std::string RateLimit::text() const {
  std::string out = std::to_string(amount) + "/";
  if (multiple != 1) out += std::to_string(multiple) + " " + unit + "s";
  else out += unit;
  if (burst > 0) out += " burst " + std::to_string(burst);
  return out;
}

std::vector<RateLimit> parse_limits(std::string_view text) {
  if (trim(text).empty()) throw InvalidArgument("rate limit string is empty (expected e.g. '10/minute')");
  // The caps are checked before any parsing, so a huge string costs a scan, not a parse.
  if (text.size() > kMaxLimitText) {
    throw InvalidArgument("rate limit string is " + std::to_string(text.size()) + " bytes long; at most " +
                          std::to_string(kMaxLimitText) + " are accepted ('" + printable(text, 40) + "')");
  }
  const std::size_t parts = 1 + static_cast<std::size_t>(std::count_if(text.begin(), text.end(), [](char c) {
                              return c == ';' || c == ',';
                            }));
  if (parts > kMaxLimits) {
    throw InvalidArgument("at most " + std::to_string(kMaxLimits) + " limits may be combined, got " +
                          std::to_string(parts));
  }
  std::vector<RateLimit> out;
  std::size_t start = 0;
  while (start <= text.size()) {
    std::size_t end = text.find_first_of(";,", start);
    if (end == std::string_view::npos) end = text.size();
    out.push_back(parse_one(text, text.substr(start, end - start)));
    start = end + 1;
  }
  return out;
}

}  // namespace redcount
