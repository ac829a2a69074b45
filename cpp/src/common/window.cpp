#include "redcount/common/window.h"

#include <cmath>
#include <limits>

#include "redcount/common/bounds.h"
#include "redcount/common/errors.h"
#include "redcount/common/util.h"

namespace redcount {
namespace {
std::string fmt_double(double v) {
  std::string s = std::to_string(v);
  while (s.size() > 1 && s.back() == '0') s.pop_back();
  if (!s.empty() && s.back() == '.') s.pop_back();
  return s;
}
}  // namespace

std::int64_t window_seconds_to_ms(double seconds, const char* what) {
  if (std::isnan(seconds) || std::isinf(seconds)) {
    throw InvalidArgument(std::string(what) + " must be a finite number of seconds, got " + fmt_double(seconds));
  }
  if (seconds <= 0) {
    throw InvalidArgument(std::string(what) + " must be > 0 seconds, got " + fmt_double(seconds));
  }
  const double ms = std::round(seconds * 1000.0);
  if (ms < 1) {
    throw InvalidArgument(std::string(what) + " must be at least 1 ms (0.001 s), got " + fmt_double(seconds) + " s");
  }
  if (ms > static_cast<double>(kMaxCounterSpanMs)) {
    throw InvalidArgument(std::string(what) + " is too long: " + fmt_double(seconds) + " s");
  }
  return static_cast<std::int64_t>(ms);
}

void validate(const WindowSpec& spec) {
  if (spec.window_ms <= 0) {
    throw InvalidArgument("window must be > 0 ms, got " + std::to_string(spec.window_ms));
  }
  if (spec.window_ms > kMaxCounterSpanMs) throw InvalidArgument("window is too long");
  if (spec.grace_ms < 0) throw InvalidArgument("grace must be >= 0 seconds, got " + std::to_string(spec.grace_ms) + " ms");
  if (spec.grace_ms > kMaxCounterSpanMs) throw InvalidArgument("grace is too long");
  if (spec.calendar && spec.stagger) {
    throw InvalidArgument("stagger cannot be combined with calendar: calendar windows start at local midnight");
  }
}

CalendarUnit require_calendar_unit(std::string_view unit, std::int64_t multiple, const Calendar& calendar) {
  const auto u = calendar_unit(unit);
  if (!u) {
    throw InvalidArgument("calendar='" + calendar.zone() + "' windows are days, weeks, months or years, got '" +
                          std::string(unit) + "' (drop calendar= for clock-aligned windows)");
  }
  // A period of several units is counted from a fixed epoch (calendar.h), which aligns any
  // multiple; the bound keeps a period within a century (and its span within the scripts').
  const std::int64_t most = *u == CalendarUnit::Day     ? 36'500
                            : *u == CalendarUnit::Week  ? 5'200
                            : *u == CalendarUnit::Month ? 1'200
                                                        : 100;
  if (multiple < 1 || multiple > most) {
    throw InvalidArgument("calendar='" + calendar.zone() + "' windows are 1 to " + std::to_string(most) + " " +
                          std::string(unit) + "s (a period of at most a century), got " + std::to_string(multiple));
  }
  return *u;
}

std::uint64_t fnv1a64(std::string_view data) noexcept {
  std::uint64_t h = 14695981039346656037ULL;  // the FNV-1a 64-bit offset basis
  for (unsigned char c : data) {
    h ^= c;
    h *= 1099511628211ULL;
  }
  return h;
}

std::int64_t stagger_offset(std::string_view key, std::int64_t window_ms) noexcept {
  if (window_ms <= 0) return 0;
  return static_cast<std::int64_t>(fnv1a64(key) % static_cast<std::uint64_t>(window_ms));
}

WindowPos locate(const WindowSpec& spec, std::string_view key, std::int64_t now_ms) noexcept {
  if (spec.calendar) {
    const Period p = spec.calendar->period(spec.calendar_unit, now_ms);
    WindowPos pos;
    pos.index = p.start_ms;
    pos.start_ms = p.start_ms;
    pos.end_ms = p.end_ms;
    pos.expire_at_ms = p.end_ms + spec.grace_ms;
    pos.span_ms = p.end_ms - p.start_ms;
    return pos;
  }
  const std::int64_t w = spec.window_ms > 0 ? spec.window_ms : 1;
  const std::int64_t offset = spec.stagger ? stagger_offset(key, w) : 0;
  const std::int64_t t = now_ms - offset;
  // Floor division, correct for t < 0 too.
  std::int64_t index = t / w;
  if (t % w != 0 && t < 0) --index;
  WindowPos pos;
  pos.index = index;
  pos.start_ms = index * w + offset;
  pos.end_ms = pos.start_ms + w;
  pos.expire_at_ms = pos.end_ms + spec.grace_ms;
  pos.span_ms = w;
  return pos;
}

bool is_valid_utf8(std::string_view s) noexcept {
  std::size_t i = 0;
  const std::size_t n = s.size();
  while (i < n) {
    const auto c = static_cast<unsigned char>(s[i]);
    std::size_t len;
    std::uint32_t cp;
    if (c < 0x80) {
      ++i;
      continue;
    } else if ((c & 0xE0) == 0xC0) {
      len = 2;
      cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      len = 3;
      cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      len = 4;
      cp = c & 0x07;
    } else {
      return false;
    }
    if (i + len > n) return false;
    for (std::size_t j = 1; j < len; ++j) {
      const auto cc = static_cast<unsigned char>(s[i + j]);
      if ((cc & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (cc & 0x3F);
    }
    // Overlong forms, surrogates and code points past U+10FFFF are not UTF-8.
    if ((len == 2 && cp < 0x80) || (len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000) ||
        (cp >= 0xD800 && cp <= 0xDFFF) || cp > 0x10FFFF) {
      return false;
    }
    i += len;
  }
  return true;
}

namespace {
void validate_text(std::string_view s, const char* what, std::size_t max) {
  if (s.empty()) throw InvalidArgument(std::string(what) + " must not be empty");
  if (s.size() > max) {
    throw InvalidArgument(std::string(what) + " is " + std::to_string(s.size()) + " bytes; the limit is " +
                          std::to_string(max) + " bytes (hash long identifiers before using them as keys)");
  }
  if (!is_valid_utf8(s)) {
    throw InvalidArgument(std::string(what) + " is not valid UTF-8; pass a str, or bytes that decode as UTF-8");
  }
}
}  // namespace

void validate_key(std::string_view key, const char* what) { validate_text(key, what, kMaxKeyBytes); }

void validate_request_id(std::string_view id) { validate_text(id, "request_id", kMaxRequestIdBytes); }

void validate_name(std::string_view name, const char* what) {
  validate_text(name, what, 256);
  if (name.find_first_of("{}") != std::string_view::npos) {
    throw InvalidArgument(std::string(what) + " must not contain '{' or '}' (they would change the Redis "
                          "Cluster hash tag), got '" + printable(name) + "'");
  }
}

}  // namespace redcount
