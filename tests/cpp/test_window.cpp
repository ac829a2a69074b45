// Window math, key layout and key validation (window.h).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <set>
#include <string>

#include "redcount/common/errors.h"
#include "redcount/common/window.h"
#include "test_support.h"

using namespace redcount;
using rctest::contains;
using rctest::kT0;

namespace {

// Floor division as the reference for locate().
std::int64_t floor_div(std::int64_t a, std::int64_t b) {
  std::int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
  return q;
}

TEST(Locate, AlignsToTheEpoch) {
  const WindowSpec spec{60'000, 1'000, false};
  const WindowPos p = locate(spec, "user:42", kT0 + 12'345);
  EXPECT_EQ(p.index, kT0 / 60'000);
  EXPECT_EQ(p.start_ms, kT0);
  EXPECT_EQ(p.end_ms, kT0 + 60'000);
  EXPECT_EQ(p.expire_at_ms, kT0 + 61'000);
}

TEST(Locate, BoundariesAreInclusiveStartExclusiveEnd) {
  const WindowSpec spec{3'600'000, 0, false};
  const std::int64_t i = kT0 / 3'600'000;
  EXPECT_EQ(locate(spec, "k", kT0).index, i);
  EXPECT_EQ(locate(spec, "k", kT0 - 1).index, i - 1);
  EXPECT_EQ(locate(spec, "k", kT0 + 3'599'999).index, i);
  EXPECT_EQ(locate(spec, "k", kT0 + 3'600'000).index, i + 1);
  EXPECT_EQ(locate(spec, "k", kT0 + 3'600'000).start_ms, kT0 + 3'600'000);
  EXPECT_EQ(locate(spec, "k", kT0).expire_at_ms, kT0 + 3'600'000);  // grace 0
}

TEST(Locate, InvariantsOverManyTimesAndWindows) {
  std::uint64_t x = 88172645463325252ULL;  // xorshift: deterministic pseudo-random times
  for (std::int64_t w : {std::int64_t{1}, std::int64_t{7}, std::int64_t{1000}, std::int64_t{60'000},
                         std::int64_t{3'600'000}, std::int64_t{86'400'000}, std::int64_t{31'536'000'000}}) {
    for (std::int64_t grace : {std::int64_t{0}, std::int64_t{1}, std::int64_t{1000}}) {
      for (int i = 0; i < 500; ++i) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        const std::int64_t now = static_cast<std::int64_t>(x % 4'000'000'000'000ULL) - 1'000'000'000'000;
        const WindowPos p = locate(WindowSpec{w, grace, false}, "key", now);
        ASSERT_EQ(p.start_ms % w, 0) << "w=" << w << " now=" << now;
        ASSERT_EQ(p.index, floor_div(now, w));
        ASSERT_EQ(p.start_ms, p.index * w);
        ASSERT_LE(p.start_ms, now);
        ASSERT_LT(now, p.end_ms);
        ASSERT_EQ(p.end_ms, p.start_ms + w);
        ASSERT_EQ(p.expire_at_ms, p.end_ms + grace);
      }
    }
  }
}

TEST(Locate, NegativeTimesUseFloorDivision) {
  const WindowSpec spec{1000, 500, false};
  WindowPos p = locate(spec, "k", -1);
  EXPECT_EQ(p.index, -1);
  EXPECT_EQ(p.start_ms, -1000);
  EXPECT_EQ(p.end_ms, 0);
  EXPECT_EQ(p.expire_at_ms, 500);
  p = locate(spec, "k", -1000);
  EXPECT_EQ(p.index, -1);
  EXPECT_EQ(p.start_ms, -1000);
  p = locate(spec, "k", -1001);
  EXPECT_EQ(p.index, -2);
  EXPECT_EQ(p.start_ms, -2000);
  p = locate(spec, "k", 0);
  EXPECT_EQ(p.index, 0);
  EXPECT_EQ(p.start_ms, 0);
  EXPECT_EQ(p.end_ms, 1000);
}

TEST(Locate, KeyDoesNotMatterWithoutStagger) {
  const WindowSpec spec{60'000, 0, false};
  EXPECT_EQ(locate(spec, "a", kT0 + 5).start_ms, locate(spec, "zzz", kT0 + 5).start_ms);
}

TEST(Stagger, OffsetIsDeterministicAndInRange) {
  for (std::int64_t w : {std::int64_t{1}, std::int64_t{2}, std::int64_t{1000}, std::int64_t{3'600'000}}) {
    for (int i = 0; i < 200; ++i) {
      const std::string key = rctest::cat("user:", i);
      const std::int64_t off = stagger_offset(key, w);
      ASSERT_GE(off, 0);
      ASSERT_LT(off, w);
      ASSERT_EQ(off, stagger_offset(key, w));
      ASSERT_EQ(static_cast<std::uint64_t>(off), fnv1a64(key) % static_cast<std::uint64_t>(w));
    }
  }
  EXPECT_EQ(stagger_offset("k", 0), 0);
  EXPECT_EQ(stagger_offset("k", -5), 0);
}

TEST(Stagger, OffsetsSpreadAcrossKeys) {
  std::set<std::int64_t> offsets;
  for (int i = 0; i < 100; ++i) offsets.insert(stagger_offset(rctest::cat("user:", i), 3'600'000));
  EXPECT_GE(offsets.size(), 95u);  // essentially all distinct in an hour of milliseconds
}

TEST(Stagger, LocateShiftsWindowsByTheKeysOffset) {
  const std::int64_t w = 3'600'000;
  const WindowSpec spec{w, 1000, true};
  for (int i = 0; i < 50; ++i) {
    const std::string key = rctest::cat("k", i);
    const std::int64_t off = stagger_offset(key, w);
    for (std::int64_t now : {kT0, kT0 + off, kT0 + off - 1, kT0 + 1'234'567, std::int64_t{-5}}) {
      const WindowPos p = locate(spec, key, now);
      ASSERT_EQ(((p.start_ms % w) + w) % w, off);
      ASSERT_LE(p.start_ms, now);
      ASSERT_LT(now, p.end_ms);
      ASSERT_EQ(p.end_ms, p.start_ms + w);
      ASSERT_EQ(p.expire_at_ms, p.end_ms + 1000);
      ASSERT_EQ(p.index, floor_div(now - off, w));
    }
    // The window turns over exactly at start + offset.
    if (off > 0) {
      EXPECT_EQ(locate(spec, key, kT0 + off).index, locate(spec, key, kT0 + off - 1).index + 1);
    }
  }
}

TEST(Fnv1a64, KnownValues) {
  // The published FNV-1a 64-bit test vectors (offset basis 14695981039346656037).
  EXPECT_EQ(fnv1a64(""), 0xcbf29ce484222325ULL);
  EXPECT_EQ(fnv1a64("a"), 0xaf63dc4c8601ec8cULL);
  EXPECT_EQ(fnv1a64("foobar"), 0x85944171f73967e8ULL);
  EXPECT_EQ(fnv1a64("user:42"), 0x6c151ea4dcd221c2ULL);
  EXPECT_EQ(stagger_offset("user:42", 3'600'000), static_cast<std::int64_t>(0x6c151ea4dcd221c2ULL % 3'600'000));
}

// ---- seconds -> milliseconds --------------------------------------------------------

TEST(WindowSecondsToMs, Converts) {
  EXPECT_EQ(window_seconds_to_ms(60.0), 60'000);
  EXPECT_EQ(window_seconds_to_ms(1.5), 1'500);
  EXPECT_EQ(window_seconds_to_ms(0.001), 1);
  EXPECT_EQ(window_seconds_to_ms(0.0015), 2);  // rounded to the nearest ms
  EXPECT_EQ(window_seconds_to_ms(3600), 3'600'000);
  EXPECT_EQ(window_seconds_to_ms(365.0 * 86400), 31'536'000'000);
}

TEST(WindowSecondsToMs, Rejects) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  for (double bad : {nan, inf, -inf, 0.0, -0.0, -1.0, 0.0004, 1e-9, 1e300}) {
    rctest::error_of<InvalidArgument>([&] { window_seconds_to_ms(bad); });
  }
  EXPECT_TRUE(contains(rctest::error_of<InvalidArgument>([&] { window_seconds_to_ms(nan); }), "finite"));
  EXPECT_TRUE(contains(rctest::error_of<InvalidArgument>([&] { window_seconds_to_ms(-2.0); }), "> 0"));
  EXPECT_TRUE(contains(rctest::error_of<InvalidArgument>([&] { window_seconds_to_ms(0.0001); }), "1 ms"));
  // The name of the parameter appears in the message.
  EXPECT_TRUE(contains(rctest::error_of<InvalidArgument>([&] { window_seconds_to_ms(-1.0, "grace"); }), "grace"));
}

TEST(ValidateWindowSpec, RejectsBadSpecs) {
  validate(WindowSpec{1, 0, false});
  validate(WindowSpec{60'000, 1'000, true});
  rctest::error_of<InvalidArgument>([] { validate(WindowSpec{0, 0, false}); });
  rctest::error_of<InvalidArgument>([] { validate(WindowSpec{-1, 0, false}); });
  rctest::error_of<InvalidArgument>([] { validate(WindowSpec{1000, -1, false}); });
  rctest::error_of<InvalidArgument>([] { validate(WindowSpec{std::int64_t{1} << 60, 0, false}); });
  rctest::error_of<InvalidArgument>([] { validate(WindowSpec{1000, std::int64_t{1} << 60, false}); });
}

// ---- key validation -----------------------------------------------------------------

TEST(ValidateKey, AcceptsUpTo1024BytesOfUtf8) {
  validate_key("a");
  validate_key(std::string(1024, 'x'));
  validate_key("caf\xC3\xA9");                      // é
  validate_key("\xE2\x82\xAC 10");                  // €
  validate_key("\xF0\x9F\x98\x80");                 // 😀
  validate_key("\xF4\x8F\xBF\xBF");                 // U+10FFFF, the last code point
  validate_key("\xED\x9F\xBF");                     // U+D7FF, just below the surrogates
  validate_key("\xEE\x80\x80");                     // U+E000, just above them
  validate_key(std::string("a\0b", 3));             // NUL is valid UTF-8
  std::string emoji;
  for (int i = 0; i < 256; ++i) emoji += "\xF0\x9F\x98\x80";
  ASSERT_EQ(emoji.size(), 1024u);
  validate_key(emoji);
}

TEST(ValidateKey, RejectsEmptyAndTooLong) {
  EXPECT_TRUE(contains(rctest::error_of<InvalidArgument>([] { validate_key(""); }), "must not be empty"));
  const std::string msg = rctest::error_of<InvalidArgument>([] { validate_key(std::string(1025, 'x')); });
  EXPECT_TRUE(contains(msg, "1025")) << msg;
  EXPECT_TRUE(contains(msg, "1024")) << msg;
  std::string emoji;
  for (int i = 0; i < 257; ++i) emoji += "\xF0\x9F\x98\x80";  // 257 characters, 1028 bytes
  rctest::error_of<InvalidArgument>([&] { validate_key(emoji); });
  EXPECT_TRUE(contains(rctest::error_of<InvalidArgument>([] { validate_key("", "user key"); }), "user key"));
}

TEST(ValidateKey, RejectsInvalidUtf8) {
  const char* bad[] = {
      "\x80",                  // lone continuation byte
      "abc\xBF",               // continuation after ASCII
      "\xC0\xAF",              // overlong '/'
      "\xC1\xBF",              // overlong
      "\xE0\x80\xAF",          // overlong 3-byte
      "\xE0\x9F\xBF",          // overlong 3-byte (U+07FF)
      "\xF0\x80\x80\xAF",      // overlong 4-byte
      "\xF0\x8F\xBF\xBF",      // overlong 4-byte (U+FFFF)
      "\xED\xA0\x80",          // U+D800, a surrogate
      "\xED\xBF\xBF",          // U+DFFF, a surrogate
      "\xF4\x90\x80\x80",      // U+110000, past the end of Unicode
      "\xF5\x80\x80\x80",      // invalid lead byte
      "\xF8\x88\x80\x80\x80",  // 5-byte form
      "\xFE",
      "\xFF",
      "\xC3",                  // truncated 2-byte
      "\xE2\x82",              // truncated 3-byte
      "\xF0\x9F\x98",          // truncated 4-byte
      "ok\xF0\x9F\x98",        // truncated at the end of a longer key
      "\xC3\x28",              // bad continuation
      "\xE2\x28\xA1",          // bad continuation
  };
  for (const char* s : bad) {
    EXPECT_FALSE(is_valid_utf8(s)) << s;
    const std::string msg = rctest::error_of<InvalidArgument>([&] { validate_key(s); });
    EXPECT_TRUE(contains(msg, "UTF-8")) << msg;
  }
  EXPECT_TRUE(is_valid_utf8(""));
}

TEST(ValidateRequestId, Limits) {
  validate_request_id("req-1");
  validate_request_id(std::string(256, 'r'));
  rctest::error_of<InvalidArgument>([] { validate_request_id(""); });
  rctest::error_of<InvalidArgument>([] { validate_request_id(std::string(257, 'r')); });
  rctest::error_of<InvalidArgument>([] { validate_request_id("\xFF"); });
  EXPECT_TRUE(contains(rctest::error_of<InvalidArgument>([] { validate_request_id(""); }), "request_id"));
}

TEST(ValidateName, RejectsBracesEmptyLongAndBadUtf8) {
  validate_name("pageviews", "name");
  validate_name("redcount:lim", "prefix");
  validate_name(std::string(256, 'n'), "name");
  for (std::string bad : {"{", "}", "a{b", "a}b", "{tag}", "pre{fix"}) {
    const std::string msg = rctest::error_of<InvalidArgument>([&] { validate_name(bad, "prefix"); });
    EXPECT_TRUE(contains(msg, "prefix")) << msg;
    EXPECT_TRUE(contains(msg, "'{' or '}'")) << msg;
  }
  EXPECT_TRUE(contains(rctest::error_of<InvalidArgument>([] { validate_name("", "name"); }), "name"));
  rctest::error_of<InvalidArgument>([] { validate_name(std::string(257, 'n'), "name"); });
  rctest::error_of<InvalidArgument>([] { validate_name("\xC0\xAF", "name"); });
}

// ---- key layout ---------------------------------------------------------------------

TEST(WindowKey, Format) {
  EXPECT_EQ(window_key("redcount", "views", "page:/home", 3'600'000, 498'960),
            "redcount:views:{page:/home}:3600000:498960");
  EXPECT_EQ(window_key("p", "n", "k", 1, -5), "p:n:{k}:1:-5");
  EXPECT_EQ(window_key("rc", "pv", "caf\xC3\xA9", 60'000, 0), "rc:pv:{caf\xC3\xA9}:60000:0");
  const std::string wk = window_key("rc", "pv", "u", 60'000, 7);
  EXPECT_EQ(request_id_key(wk, "req-1"), "rc:pv:{u}:60000:7:rid:req-1");
}

TEST(WindowKey, MatchesLocate) {
  const WindowSpec spec{3'600'000, 1000, false};
  const WindowPos p = locate(spec, "page:/home", 498'960LL * 3'600'000 + 17);
  EXPECT_EQ(window_key("redcount", "views", "page:/home", spec.window_ms, p.index),
            "redcount:views:{page:/home}:3600000:498960");
}

}  // namespace
