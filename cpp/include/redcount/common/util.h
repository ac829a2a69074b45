// Small helpers shared by the core: strict integer parsing and formatting.
#pragma once

#include <algorithm>
#include <cctype>
#include <charconv>
#include <chrono>
#include <cstdint>
#include <random>
#include <optional>
#include <string>
#include <string_view>

namespace redcount {

// Parses a decimal int64 the way Redis does (string2ll): optional '-', no '+', no
// spaces, no leading zeros, no overflow. Returns nullopt when it is not one.
inline std::optional<std::int64_t> parse_int64(std::string_view s) noexcept {
  if (s.empty() || s.size() > 20) return std::nullopt;
  if (s.size() > 1 && (s[0] == '0' || (s[0] == '-' && s[1] == '0'))) return std::nullopt;
  if (s == "-") return std::nullopt;
  std::int64_t v = 0;
  auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || ptr != s.data() + s.size()) return std::nullopt;
  return v;
}

inline std::string to_string(std::int64_t v) { return std::to_string(v); }

// Caller-supplied text made safe to quote in an error message: control bytes (a NUL would
// cut the message short where it is handed on as a C string) and bytes that are not part of
// a valid UTF-8 character become \xNN, and text past `max` bytes is cut with "...(N bytes)"
// at a character boundary, so a huge argument never makes a huge message and the message
// is always valid UTF-8 (Python decodes it strictly).
inline std::size_t utf8_char_length(std::string_view s, std::size_t i) noexcept {
  const auto c = static_cast<unsigned char>(s[i]);
  std::size_t n = 0;
  std::uint32_t cp = 0;
  if (c >= 0xc2 && c <= 0xdf) {
    n = 2;
    cp = c & 0x1f;
  } else if (c >= 0xe0 && c <= 0xef) {
    n = 3;
    cp = c & 0x0f;
  } else if (c >= 0xf0 && c <= 0xf4) {
    n = 4;
    cp = c & 0x07;
  } else {
    return 0;
  }
  if (i + n > s.size()) return 0;
  for (std::size_t k = 1; k < n; ++k) {
    const auto cc = static_cast<unsigned char>(s[i + k]);
    if ((cc & 0xc0) != 0x80) return 0;
    cp = (cp << 6) | (cc & 0x3f);
  }
  // Overlong forms, UTF-16 surrogates and code points past U+10FFFF are not UTF-8.
  if ((n == 3 && cp < 0x800) || (n == 4 && (cp < 0x10000 || cp > 0x10ffff)) || (cp >= 0xd800 && cp <= 0xdfff)) {
    return 0;
  }
  return n;
}

inline std::string printable(std::string_view s, std::size_t max = 80) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  const std::size_t shown = std::min(s.size(), max);
  out.reserve(shown + 16);
  std::size_t i = 0;
  while (i < shown) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c >= 0x80) {
      const std::size_t n = utf8_char_length(s, i);
      if (n > 0 && i + n <= shown) {
        out.append(s.substr(i, n));
        i += n;
        continue;
      }
      if (n > 0) break;  // a whole character that does not fit: cut before it
    }
    if (c < 0x20 || c >= 0x7f) {
      out += "\\x";
      out += kHex[c >> 4];
      out += kHex[c & 15];
    } else {
      out += static_cast<char>(c);
    }
    ++i;
  }
  if (i < s.size()) out += "...(" + std::to_string(s.size()) + " bytes)";
  return out;
}

// A URL query parameter name worth echoing in an error: a short identifier. Anything else
// may be the tail of a password with an unescaped '?' in it, so it is not shown.
inline bool showable_query_name(std::string_view name) {
  if (name.empty() || name.size() > 40) return false;
  for (char c : name) {
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_')) return false;
  }
  return true;
}

// ASCII case folding without the locale lookup of std::tolower: command names are folded
// for every request of a routed batch.
inline char ascii_lower(char c) { return (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c; }

inline std::string ascii_lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = ascii_lower(c);
  return out;
}

// `s` equals `lowercase_word` ignoring ASCII case (no copy).
inline bool ascii_iequals(std::string_view s, std::string_view lowercase_word) {
  if (s.size() != lowercase_word.size()) return false;
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (ascii_lower(s[i]) != lowercase_word[i]) return false;
  }
  return true;
}

// A delay drawn uniformly from [backoff / 2, backoff]: spreads retries and reconnects of
// many clients so they do not arrive in lock-step.
inline std::chrono::milliseconds jittered(std::chrono::milliseconds backoff) {
  static thread_local std::minstd_rand rng{std::random_device{}()};
  const long hi = std::max<long>(static_cast<long>(backoff.count()), 1);
  return std::chrono::milliseconds(std::uniform_int_distribution<long>(hi / 2, hi)(rng));
}

inline constexpr std::string_view kMaxInt64Text = "9223372036854775807";

// a > b for canonical decimals: compared as text, as pn_merge.lua does.
inline bool decimal_greater(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return a.size() > b.size();
  return a > b;
}

// A non-negative decimal without sign or leading zeros that fits in int64: what HINCRBY
// leaves behind and what merge sends.
inline bool canonical_uint(std::string_view s) {
  if (s.empty() || s.size() > 19) return false;
  if (!std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; })) return false;
  if (s.size() > 1 && s[0] == '0') return false;
  return !(s.size() == 19 && decimal_greater(s, kMaxInt64Text));
}

}  // namespace redcount
