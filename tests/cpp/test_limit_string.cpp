// The rate-limit string parser (limit_string.h).
#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "redcount/common/errors.h"
#include "redcount/common/limit_string.h"
#include "redcount/common/util.h"
#include "test_support.h"

using namespace redcount;
using rctest::contains;

namespace {

constexpr std::int64_t kSecond = 1000;
constexpr std::int64_t kMinute = 60 * kSecond;
constexpr std::int64_t kHour = 60 * kMinute;
constexpr std::int64_t kDay = 24 * kHour;

RateLimit one(const std::string& text) {
  auto v = parse_limits(text);
  EXPECT_EQ(v.size(), 1u) << text;
  return v.empty() ? RateLimit{} : v.front();
}

std::string parse_error(const std::string& text) {
  return rctest::error_of<InvalidArgument>([&] { parse_limits(text); });
}

TEST(ParseLimits, SlashForm) {
  const RateLimit r = one("10/minute");
  EXPECT_EQ(r.amount, 10);
  EXPECT_EQ(r.multiple, 1);
  EXPECT_EQ(r.window_ms, kMinute);
  EXPECT_EQ(r.unit, "minute");
  EXPECT_EQ(r.text(), "10/minute");
}

TEST(ParseLimits, PerForm) {
  for (std::string s : {"10 per minute", "10 PER MINUTE", "10 Per Minute", "  10   per   minute  "}) {
    const RateLimit r = one(s);
    EXPECT_EQ(r.amount, 10) << s;
    EXPECT_EQ(r.window_ms, kMinute) << s;
    EXPECT_EQ(r.unit, "minute") << s;
  }
  const RateLimit r = one("7 per 3 hours");
  EXPECT_EQ(r.amount, 7);
  EXPECT_EQ(r.multiple, 3);
  EXPECT_EQ(r.window_ms, 3 * kHour);
}

TEST(ParseLimits, Multiples) {
  RateLimit r = one("100/5 minutes");
  EXPECT_EQ(r.amount, 100);
  EXPECT_EQ(r.multiple, 5);
  EXPECT_EQ(r.window_ms, 5 * kMinute);
  EXPECT_EQ(r.unit, "minute");
  EXPECT_EQ(r.text(), "100/5 minutes");
  r = one("100/5minutes");
  EXPECT_EQ(r.window_ms, 5 * kMinute);
  r = one("3/10 s");
  EXPECT_EQ(r.window_ms, 10 * kSecond);
  EXPECT_EQ(r.text(), "3/10 seconds");
  r = one("1/1 hour");
  EXPECT_EQ(r.multiple, 1);
  EXPECT_EQ(r.text(), "1/hour");
}

TEST(ParseLimits, SeveralLimits) {
  auto v = parse_limits("5/second;100/hour");
  ASSERT_EQ(v.size(), 2u);
  EXPECT_EQ(v[0].amount, 5);
  EXPECT_EQ(v[0].window_ms, kSecond);
  EXPECT_EQ(v[1].amount, 100);
  EXPECT_EQ(v[1].window_ms, kHour);

  v = parse_limits("5/second,100/hour");
  ASSERT_EQ(v.size(), 2u);
  EXPECT_EQ(v[1].window_ms, kHour);

  v = parse_limits("  5 / second ;  100 per hour ,1000/ day  ");
  ASSERT_EQ(v.size(), 3u);
  EXPECT_EQ(v[0].amount, 5);
  EXPECT_EQ(v[0].window_ms, kSecond);
  EXPECT_EQ(v[1].amount, 100);
  EXPECT_EQ(v[1].window_ms, kHour);
  EXPECT_EQ(v[2].amount, 1000);
  EXPECT_EQ(v[2].window_ms, kDay);
}

TEST(ParseLimits, UnitAliases) {
  const std::vector<std::pair<std::string, std::int64_t>> cases = {
      {"s", kSecond},           {"sec", kSecond},         {"second", kSecond},     {"seconds", kSecond},
      {"m", kMinute},           {"min", kMinute},         {"minute", kMinute},     {"minutes", kMinute},
      {"h", kHour},             {"hr", kHour},            {"hour", kHour},         {"hours", kHour},
      {"d", kDay},              {"day", kDay},            {"days", kDay},          {"month", 30 * kDay},
      {"months", 30 * kDay},    {"year", 365 * kDay},     {"years", 365 * kDay},   {"SEC", kSecond},
      {"Minute", kMinute},      {"HOURS", kHour},
  };
  for (const auto& [unit, ms] : cases) {
    const RateLimit r = one("1/" + unit);
    EXPECT_EQ(r.window_ms, ms) << unit;
    EXPECT_EQ(r.multiple, 1) << unit;
  }
  EXPECT_EQ(one("1/m").unit, "minute");  // 'm' is a minute, never a month
  EXPECT_EQ(one("1/months").unit, "month");
  EXPECT_EQ(one("1/sec").unit, "second");
  EXPECT_EQ(one("2/3 days").window_ms, 3 * kDay);
}

TEST(ParseLimits, TextRoundTrips) {
  for (std::string s : {"10/minute", "100/5 minutes", "1/second", "7/2 hours", "9/day", "3/month", "4/2 years"}) {
    const RateLimit r = one(s);
    EXPECT_EQ(r.text(), s);
    const RateLimit again = one(r.text());
    EXPECT_EQ(again.amount, r.amount);
    EXPECT_EQ(again.window_ms, r.window_ms);
  }
}

TEST(ParseLimits, AmountRange) {
  EXPECT_EQ(one("1/second").amount, 1);
  EXPECT_EQ(one("9007199254740991/second").amount, 9007199254740991);  // 2^53 - 1
  std::string msg = parse_error("9007199254740992/second");                // 2^53
  EXPECT_TRUE(contains(msg, "2^53")) << msg;
  msg = parse_error("9223372036854775807/second");
  EXPECT_TRUE(contains(msg, "2^53")) << msg;
  msg = parse_error("99999999999999999999999/second");
  EXPECT_TRUE(contains(msg, "too large")) << msg;
  EXPECT_TRUE(contains(msg, "99999999999999999999999")) << msg;
}

TEST(ParseLimits, Errors) {
  struct Case {
    std::string text;
    std::vector<std::string> in_message;
  };
  const std::vector<Case> cases = {
      {"", {"empty"}},
      {"   ", {"empty"}},
      {"10", {"'10'", "missing '/' or 'per'"}},
      {"ten per", {"missing '/' or 'per'"}},
      {"abc/minute", {"'abc'", "not a whole number"}},
      {"1.5/minute", {"'1.5'", "not a whole number"}},
      {"+5/minute", {"'+5'"}},
      {"/minute", {"not a whole number"}},
      {"0/minute", {"'0/minute'", ">= 1"}},
      {"-1/minute", {"'-1/minute'", "-1"}},
      {"10/fortnight", {"'fortnight'", "unknown time unit"}},
      {"10/", {"missing time unit"}},
      {"10/5", {"missing time unit"}},
      {"10/0 minutes", {"'10/0 minutes'", "multiple"}},
      {"10/00 minutes", {"multiple"}},
      {"10/minute;", {"empty limit"}},
      {"10/minute,", {"empty limit"}},
      {";10/minute", {"empty limit"}},
      {"10/minute;;5/second", {"empty limit"}},
      {"5/second;bogus", {"'bogus'"}},
      {"5/second;10/eon", {"'eon'"}},
      {"1/99999999999 years", {"too long"}},
      {"1/99999999999999999999999 seconds", {"multiple"}},
  };
  for (const auto& c : cases) {
    const std::string msg = parse_error(c.text);
    for (const auto& part : c.in_message) EXPECT_TRUE(contains(msg, part)) << "'" << c.text << "' -> " << msg;
  }
  // The whole string appears too, so the caller can find it in their config.
  EXPECT_TRUE(contains(parse_error("5/second;10/eon"), "'5/second;10/eon'"));
}

TEST(ParseLimits, AtMostSixteenLimits) {
  std::string s;
  for (int i = 1; i <= 16; ++i) s += rctest::cat(s.empty() ? "" : ";", i, "/second");
  EXPECT_EQ(parse_limits(s).size(), 16u);
  s += ";17/second";
  const std::string msg = parse_error(s);
  EXPECT_TRUE(contains(msg, "16")) << msg;
  EXPECT_TRUE(contains(msg, "17")) << msg;
}

// The caps are checked before parsing, so a huge string is refused at the
// cost of a scan, and its error message stays short.
TEST(ParseLimits, HugeStringsAreRefusedBeforeParsing) {
  std::string many;
  for (int i = 0; i < 400'000; ++i) many += "1/second;";  // 3.6 MB of valid limits
  const std::string msg = parse_error(many);
  EXPECT_TRUE(contains(msg, "2048")) << msg.substr(0, 200);
  EXPECT_LT(msg.size(), 400u);
  const std::string msg2 = parse_error(std::string(1 << 20, 'x'));
  EXPECT_TRUE(contains(msg2, "bytes long")) << msg2.substr(0, 200);
  EXPECT_LT(msg2.size(), 400u);
  std::string seventeen;
  for (int i = 0; i < 17; ++i) seventeen += "x;";
  EXPECT_TRUE(contains(parse_error(seventeen), "at most 16")) << parse_error(seventeen);
}

// A NUL or other control byte in the input must not cut the message.
TEST(ParseLimits, ControlBytesAreEscapedInMessages) {
  const std::string msg = parse_error(std::string("10/min\0ute", 10));
  EXPECT_TRUE(contains(msg, "\\x00")) << msg;
  EXPECT_TRUE(contains(msg, "unknown time unit")) << msg;
  EXPECT_EQ(std::string(msg.c_str()), msg);  // no NUL inside: what() keeps the whole text
}

// Found by the limit-string fuzzer: a message cut at 80 bytes in the middle of a UTF-8
// character was not valid UTF-8, so Python raised UnicodeDecodeError instead of the error.
TEST(ParseLimits, MessagesAreValidUtf8) {
  auto valid_utf8 = [](const std::string& s) {
    for (std::size_t i = 0; i < s.size();) {
      if (static_cast<unsigned char>(s[i]) < 0x80) {
        ++i;
        continue;
      }
      const std::size_t n = utf8_char_length(s, i);
      if (n == 0) return false;
      i += n;
    }
    return true;
  };
  std::string accents;
  for (int i = 0; i < 60; ++i) accents += "\xc3\xa9";  // é
  for (const std::string& text : {std::string(79, 'x') + "\xc3\xa9/minute", "1/" + accents, accents,
                                   std::string("5/s\xcf\x63;5/\xff\xfe minute")}) {
    const std::string message = parse_error(text);
    EXPECT_TRUE(valid_utf8(message)) << message;
  }
  // Bytes that are not UTF-8 are shown escaped; whole characters are kept.
  EXPECT_TRUE(contains(parse_error("1/\xff\xc3\xa9"), "'\\xff\xc3\xa9'"));
}

TEST(ParseLimits, ErrorsAreInvalidArgumentAndRedcountErrors) {
  try {
    parse_limits("10/fortnight");
    FAIL() << "did not throw";
  } catch (const Error& e) {
    EXPECT_NE(dynamic_cast<const InvalidArgument*>(&e), nullptr);
  }
}

}  // namespace
