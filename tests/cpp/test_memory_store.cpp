// MemoryStore: Redis semantics of the commands redcount uses (strings, sorted sets,
// hashes), exact expiry on a ManualClock, the sweeper, and thread-safety.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <limits>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "redcount/common/clock.h"
#include "redcount/common/errors.h"
#include "redcount/memory/memory_store.h"
#include "test_support.h"

using namespace redcount;
using rctest::contains;
using rctest::kT0;

namespace {

constexpr const char* kNotInteger = "ERR value is not an integer or out of range";
constexpr const char* kOverflow = "ERR increment or decrement would overflow";
constexpr const char* kSyntax = "ERR syntax error";
constexpr const char* kWrongType = "WRONGTYPE Operation against a key holding the wrong kind of value";
constexpr const char* kNotFloat = "ERR value is not a valid float";
constexpr const char* kBadRange = "ERR min or max is not a float";
const std::string kMax = std::to_string(std::numeric_limits<std::int64_t>::max());
const std::string kMin = std::to_string(std::numeric_limits<std::int64_t>::min());

class MemoryStoreTest : public ::testing::Test {
 protected:
  std::shared_ptr<ManualClock> clock_ = std::make_shared<ManualClock>(kT0);
  std::shared_ptr<MemoryStore> store_ = rctest::memory_store(clock_);

  static std::string show(const std::vector<std::string>& args) {
    std::string out;
    for (const auto& a : args) out += (out.empty() ? "" : " ") + a;
    return "[" + out + "]";
  }
  Reply cmd(std::vector<std::string> args) { return rctest::run(*store_, std::move(args)); }
  std::int64_t integer(std::vector<std::string> args) {
    Reply r = cmd(std::move(args));
    EXPECT_EQ(r.type, Reply::Type::Integer) << r.str;
    return r.integer;
  }
  void expect_error(std::vector<std::string> args, const std::string& text) {
    Reply r = cmd(args);
    EXPECT_TRUE(r.is_error()) << "command " << show(args) << " did not fail";
    EXPECT_EQ(r.str, text) << show(args);
  }
  void expect_error_prefix(std::vector<std::string> args, const std::string& prefix) {
    Reply r = cmd(args);
    EXPECT_TRUE(r.is_error()) << "command " << show(args) << " did not fail";
    EXPECT_EQ(r.str.substr(0, prefix.size()), prefix) << r.str;
  }
  std::optional<std::string> get(const std::string& key) { return cmd({"GET", key}).as_string(); }
  bool exists(const std::string& key) { return integer({"EXISTS", key}) == 1; }
  std::int64_t pttl(const std::string& key) { return integer({"PTTL", key}); }
  // An array reply's elements as text ("<nil>" for nil).
  std::vector<std::string> strings(std::vector<std::string> args) {
    Reply r = cmd(args);
    EXPECT_EQ(r.type, Reply::Type::Array) << show(args) << ": " << r.str;
    std::vector<std::string> out;
    for (const auto& e : r.elements) out.push_back(e.is_nil() ? "<nil>" : e.str);
    return out;
  }
  std::string status(std::vector<std::string> args) {
    Reply r = cmd(args);
    EXPECT_EQ(r.type, Reply::Type::Status) << show(args) << ": " << r.str;
    return r.str;
  }
};

using Strings = std::vector<std::string>;

// ---- GET / SET ----------------------------------------------------------------------

TEST_F(MemoryStoreTest, GetMissingKeyIsNil) {
  EXPECT_TRUE(cmd({"GET", "nope"}).is_nil());
  EXPECT_EQ(get("nope"), std::nullopt);
}

TEST_F(MemoryStoreTest, SetThenGet) {
  Reply r = cmd({"SET", "k", "hello"});
  EXPECT_EQ(r.type, Reply::Type::Status);
  EXPECT_EQ(r.str, "OK");
  EXPECT_EQ(get("k"), "hello");
  EXPECT_EQ(pttl("k"), -1);
  cmd({"SET", "k", ""});
  EXPECT_EQ(get("k"), "");
  EXPECT_TRUE(exists("k"));
}

TEST_F(MemoryStoreTest, CommandNamesAndOptionsAreCaseInsensitive) {
  EXPECT_EQ(cmd({"set", "k", "v", "px", "100"}).str, "OK");
  EXPECT_EQ(cmd({"gEt", "k"}).str, "v");
  EXPECT_EQ(pttl("k"), 100);
}

TEST_F(MemoryStoreTest, SetNxOnlyWhenAbsent) {
  EXPECT_EQ(cmd({"SET", "k", "1", "NX"}).str, "OK");
  EXPECT_TRUE(cmd({"SET", "k", "2", "NX"}).is_nil());
  EXPECT_EQ(get("k"), "1");
}

TEST_F(MemoryStoreTest, SetXxOnlyWhenPresent) {
  EXPECT_TRUE(cmd({"SET", "k", "1", "XX"}).is_nil());
  EXPECT_FALSE(exists("k"));
  cmd({"SET", "k", "1"});
  EXPECT_EQ(cmd({"SET", "k", "2", "XX"}).str, "OK");
  EXPECT_EQ(get("k"), "2");
}

TEST_F(MemoryStoreTest, SetNxOnExpiredKeySucceeds) {
  cmd({"SET", "k", "old", "PX", "10"});
  clock_->advance(10);
  EXPECT_EQ(cmd({"SET", "k", "new", "NX"}).str, "OK");
  EXPECT_EQ(get("k"), "new");
  EXPECT_EQ(pttl("k"), -1);
}

TEST_F(MemoryStoreTest, SetExpiryOptions) {
  cmd({"SET", "ex", "v", "EX", "10"});
  EXPECT_EQ(pttl("ex"), 10'000);
  cmd({"SET", "px", "v", "PX", "1500"});
  EXPECT_EQ(pttl("px"), 1500);
  cmd({"SET", "exat", "v", "EXAT", std::to_string(kT0 / 1000 + 5)});
  EXPECT_EQ(pttl("exat"), 5000);
  cmd({"SET", "pxat", "v", "PXAT", std::to_string(kT0 + 1234)});
  EXPECT_EQ(pttl("pxat"), 1234);
  cmd({"SET", "both", "v", "NX", "PX", "77"});
  EXPECT_EQ(pttl("both"), 77);
}

TEST_F(MemoryStoreTest, PlainSetClearsTtlAndKeepTtlKeepsIt) {
  cmd({"SET", "k", "1", "PX", "5000"});
  cmd({"SET", "k", "2", "KEEPTTL"});
  EXPECT_EQ(pttl("k"), 5000);
  EXPECT_EQ(get("k"), "2");
  cmd({"SET", "k", "3"});
  EXPECT_EQ(pttl("k"), -1);
  EXPECT_EQ(get("k"), "3");
  cmd({"SET", "fresh", "1", "KEEPTTL"});
  EXPECT_EQ(pttl("fresh"), -1);
}

TEST_F(MemoryStoreTest, SetWithPastAbsoluteExpiryDeletesTheKey) {
  cmd({"SET", "k", "1"});
  EXPECT_EQ(cmd({"SET", "k", "2", "PXAT", std::to_string(kT0 - 1)}).str, "OK");
  EXPECT_FALSE(exists("k"));
  cmd({"SET", "k", "1"});
  EXPECT_EQ(cmd({"SET", "k", "2", "PXAT", std::to_string(kT0)}).str, "OK");  // "now" is already past
  EXPECT_FALSE(exists("k"));
  cmd({"SET", "k", "1"});
  EXPECT_EQ(cmd({"SET", "k", "2", "EXAT", "1"}).str, "OK");
  EXPECT_FALSE(exists("k"));
  EXPECT_EQ(cmd({"SET", "absent", "2", "NX", "PXAT", "1"}).str, "OK");
  EXPECT_FALSE(exists("absent"));
  EXPECT_EQ(store_->stored_keys(), 0u);
}

TEST_F(MemoryStoreTest, SetSyntaxErrors) {
  expect_error({"SET", "k", "v", "NX", "XX"}, kSyntax);
  expect_error({"SET", "k", "v", "XX", "NX"}, kSyntax);
  expect_error({"SET", "k", "v", "EX", "10", "PX", "10"}, kSyntax);
  expect_error({"SET", "k", "v", "KEEPTTL", "EX", "10"}, kSyntax);
  expect_error({"SET", "k", "v", "EX", "10", "KEEPTTL"}, kSyntax);
  expect_error({"SET", "k", "v", "PX"}, kSyntax);
  expect_error({"SET", "k", "v", "BOGUS"}, kSyntax);
  expect_error({"SET", "k", "v", "EX", "ten"}, kNotInteger);
  expect_error({"SET", "k", "v", "EX", "0"}, "ERR invalid expire time in 'set' command");
  expect_error({"SET", "k", "v", "PX", "-5"}, "ERR invalid expire time in 'set' command");
  expect_error({"SET", "k", "v", "EX", kMax}, "ERR invalid expire time in 'set' command");
  expect_error({"SET", "k", "v", "PX", kMax}, "ERR invalid expire time in 'set' command");
  EXPECT_FALSE(exists("k"));  // nothing was written by any of them
}

// ---- INCR family --------------------------------------------------------------------

TEST_F(MemoryStoreTest, IncrFamilyCounts) {
  EXPECT_EQ(integer({"INCR", "n"}), 1);
  EXPECT_EQ(integer({"INCRBY", "n", "41"}), 42);
  EXPECT_EQ(integer({"DECRBY", "n", "2"}), 40);
  EXPECT_EQ(integer({"DECR", "n"}), 39);
  EXPECT_EQ(integer({"INCRBY", "n", "-50"}), -11);
  EXPECT_EQ(get("n"), "-11");
  EXPECT_EQ(integer({"DECRBY", "m", "3"}), -3);
  cmd({"SET", "s", "100"});
  EXPECT_EQ(integer({"INCRBY", "s", "1"}), 101);
}

TEST_F(MemoryStoreTest, IncrOnNonIntegerValueFailsAndLeavesItUnchanged) {
  for (std::string bad : {"abc", "1.5", " 1", "1 ", "01", "+1", "-0", "", "99999999999999999999", "1e3"}) {
    cmd({"SET", "k", bad});
    expect_error({"INCR", "k"}, kNotInteger);
    expect_error({"INCRBY", "k", "5"}, kNotInteger);
    expect_error({"DECRBY", "k", "5"}, kNotInteger);
    EXPECT_EQ(get("k"), bad);
  }
}

TEST_F(MemoryStoreTest, IncrByWithNonIntegerAmountFails) {
  cmd({"SET", "k", "5"});
  expect_error({"INCRBY", "k", "x"}, kNotInteger);
  expect_error({"INCRBY", "k", "1.0"}, kNotInteger);
  expect_error({"DECRBY", "k", ""}, kNotInteger);
  expect_error({"INCRBY", "k", "9223372036854775808"}, kNotInteger);
  EXPECT_EQ(get("k"), "5");
}

TEST_F(MemoryStoreTest, IncrOverflowFailsAndLeavesValueUnchanged) {
  cmd({"SET", "k", kMax});
  expect_error({"INCR", "k"}, kOverflow);
  expect_error({"INCRBY", "k", "1"}, kOverflow);
  expect_error({"DECRBY", "k", "-1"}, kOverflow);
  EXPECT_EQ(get("k"), kMax);
  cmd({"SET", "k", kMin});
  expect_error({"DECR", "k"}, kOverflow);
  expect_error({"INCRBY", "k", "-1"}, kOverflow);
  EXPECT_EQ(get("k"), kMin);
  cmd({"SET", "k", "-1"});
  expect_error({"DECRBY", "k", kMin}, "ERR decrement would overflow");
  EXPECT_EQ(get("k"), "-1");
  // Right up to the edge is fine.
  cmd({"SET", "k", std::to_string(std::numeric_limits<std::int64_t>::max() - 5)});
  EXPECT_EQ(integer({"INCRBY", "k", "5"}), std::numeric_limits<std::int64_t>::max());
  cmd({"SET", "k", "0"});
  EXPECT_EQ(integer({"INCRBY", "k", kMin}), std::numeric_limits<std::int64_t>::min());
}

TEST_F(MemoryStoreTest, IncrKeepsTtlAndRestartsExpiredKeys) {
  cmd({"SET", "k", "1", "PX", "5000"});
  clock_->advance(1000);
  EXPECT_EQ(integer({"INCR", "k"}), 2);
  EXPECT_EQ(pttl("k"), 4000);
  clock_->advance(4000);
  EXPECT_EQ(integer({"INCR", "k"}), 1);  // the old key is gone; a new one has no TTL
  EXPECT_EQ(pttl("k"), -1);
}

// ---- DEL / EXISTS -------------------------------------------------------------------

TEST_F(MemoryStoreTest, DelAndExistsCountKeys) {
  cmd({"SET", "a", "1"});
  cmd({"SET", "b", "1"});
  cmd({"SET", "c", "1", "PX", "10"});
  EXPECT_EQ(integer({"EXISTS", "a", "b", "c", "nope"}), 3);
  EXPECT_EQ(integer({"EXISTS", "a", "a"}), 2);  // Redis counts repeats
  clock_->advance(10);
  EXPECT_EQ(integer({"EXISTS", "c"}), 0);
  EXPECT_EQ(integer({"DEL", "a", "c", "nope"}), 1);  // an expired key is not deleted "again"
  EXPECT_EQ(integer({"EXISTS", "a", "b"}), 1);
  EXPECT_EQ(integer({"UNLINK", "b", "b"}), 1);
  EXPECT_EQ(integer({"DBSIZE"}), 0);
}

// ---- PTTL / TTL ---------------------------------------------------------------------

TEST_F(MemoryStoreTest, PttlAndTtl) {
  EXPECT_EQ(integer({"PTTL", "absent"}), -2);
  EXPECT_EQ(integer({"TTL", "absent"}), -2);
  cmd({"SET", "k", "v"});
  EXPECT_EQ(integer({"PTTL", "k"}), -1);
  EXPECT_EQ(integer({"TTL", "k"}), -1);
  cmd({"SET", "k", "v", "PX", "1500"});
  EXPECT_EQ(integer({"PTTL", "k"}), 1500);
  EXPECT_EQ(integer({"TTL", "k"}), 2);  // Redis rounds to the nearest second
  cmd({"SET", "k", "v", "PX", "1499"});
  EXPECT_EQ(integer({"TTL", "k"}), 1);
  cmd({"SET", "k", "v", "EX", "30"});
  clock_->advance(10'000);
  EXPECT_EQ(integer({"TTL", "k"}), 20);
  EXPECT_EQ(integer({"PTTL", "k"}), 20'000);
}

TEST_F(MemoryStoreTest, KeyIsVisibleUntilTheMillisecondBeforeItsDeadline) {
  const std::int64_t at = kT0 + 1000;
  cmd({"SET", "k", "v", "PXAT", std::to_string(at)});
  clock_->set(at - 1);
  EXPECT_EQ(get("k"), "v");
  EXPECT_EQ(pttl("k"), 1);
  EXPECT_TRUE(exists("k"));
  EXPECT_EQ(integer({"DBSIZE"}), 1);
  clock_->set(at);
  EXPECT_EQ(get("k"), std::nullopt);
  EXPECT_EQ(pttl("k"), -2);
  EXPECT_FALSE(exists("k"));
  EXPECT_EQ(integer({"DBSIZE"}), 0);
  EXPECT_TRUE(rctest::keys(*store_).empty());
}

// ---- PEXPIREAT / PEXPIRE / EXPIREAT / EXPIRE -----------------------------------------

TEST_F(MemoryStoreTest, ExpireCommandsSetDeadlines) {
  EXPECT_EQ(integer({"PEXPIRE", "absent", "1000"}), 0);
  EXPECT_FALSE(exists("absent"));
  cmd({"SET", "k", "v"});
  EXPECT_EQ(integer({"PEXPIRE", "k", "2000"}), 1);
  EXPECT_EQ(pttl("k"), 2000);
  EXPECT_EQ(integer({"EXPIRE", "k", "3"}), 1);
  EXPECT_EQ(pttl("k"), 3000);
  EXPECT_EQ(integer({"PEXPIREAT", "k", std::to_string(kT0 + 500)}), 1);
  EXPECT_EQ(pttl("k"), 500);
  EXPECT_EQ(integer({"EXPIREAT", "k", std::to_string(kT0 / 1000 + 7)}), 1);
  EXPECT_EQ(pttl("k"), 7000);
  expect_error({"EXPIRE", "k", "soon"}, kNotInteger);
  expect_error({"PEXPIRE", "k", "10", "BOGUS"}, "ERR Unsupported option BOGUS");
  expect_error({"EXPIRE", "k", kMax}, "ERR invalid expire time in 'expire' command");
  expect_error({"PEXPIRE", "k", kMax}, "ERR invalid expire time in 'pexpire' command");
  EXPECT_EQ(pttl("k"), 7000);
}

TEST_F(MemoryStoreTest, ExpireInThePastDeletes) {
  for (std::vector<std::string> c : {std::vector<std::string>{"PEXPIREAT", "k", std::to_string(kT0)},
                                     std::vector<std::string>{"PEXPIREAT", "k", "1"},
                                     std::vector<std::string>{"PEXPIRE", "k", "0"},
                                     std::vector<std::string>{"EXPIRE", "k", "-1"},
                                     std::vector<std::string>{"EXPIREAT", "k", "0"}}) {
    cmd({"SET", "k", "v"});
    EXPECT_EQ(integer(c), 1) << c[0];
    EXPECT_FALSE(exists("k")) << c[0];
  }
  EXPECT_EQ(store_->stored_keys(), 0u);
}

TEST_F(MemoryStoreTest, ExpireNxXx) {
  cmd({"SET", "k", "v"});
  EXPECT_EQ(integer({"PEXPIRE", "k", "1000", "XX"}), 0);  // no TTL yet
  EXPECT_EQ(pttl("k"), -1);
  EXPECT_EQ(integer({"PEXPIRE", "k", "1000", "NX"}), 1);
  EXPECT_EQ(pttl("k"), 1000);
  EXPECT_EQ(integer({"PEXPIRE", "k", "2000", "NX"}), 0);  // has one now
  EXPECT_EQ(pttl("k"), 1000);
  EXPECT_EQ(integer({"PEXPIRE", "k", "2000", "xx"}), 1);
  EXPECT_EQ(pttl("k"), 2000);
}

TEST_F(MemoryStoreTest, ExpireGtLt) {
  cmd({"SET", "k", "v"});
  // No TTL counts as an infinite one: GT never beats it, LT always does.
  EXPECT_EQ(integer({"PEXPIRE", "k", "1000", "GT"}), 0);
  EXPECT_EQ(pttl("k"), -1);
  EXPECT_EQ(integer({"PEXPIRE", "k", "1000", "LT"}), 1);
  EXPECT_EQ(pttl("k"), 1000);
  EXPECT_EQ(integer({"PEXPIRE", "k", "500", "GT"}), 0);
  EXPECT_EQ(integer({"PEXPIRE", "k", "1000", "GT"}), 0);  // equal is not greater
  EXPECT_EQ(integer({"PEXPIRE", "k", "2000", "GT"}), 1);
  EXPECT_EQ(pttl("k"), 2000);
  EXPECT_EQ(integer({"PEXPIRE", "k", "3000", "LT"}), 0);
  EXPECT_EQ(integer({"PEXPIRE", "k", "2000", "LT"}), 0);
  EXPECT_EQ(integer({"PEXPIRE", "k", "1500", "LT"}), 1);
  EXPECT_EQ(pttl("k"), 1500);
  EXPECT_EQ(integer({"PEXPIRE", "k", "1800", "XX", "GT"}), 1);
  EXPECT_EQ(pttl("k"), 1800);
  expect_error({"PEXPIRE", "k", "10", "NX", "XX"},
               "ERR NX and XX, GT or LT options at the same time are not compatible");
  expect_error({"PEXPIRE", "k", "10", "NX", "GT"},
               "ERR NX and XX, GT or LT options at the same time are not compatible");
  expect_error({"PEXPIRE", "k", "10", "GT", "LT"}, "ERR GT and LT options at the same time are not compatible");
  EXPECT_EQ(pttl("k"), 1800);
}

TEST_F(MemoryStoreTest, Persist) {
  EXPECT_EQ(integer({"PERSIST", "absent"}), 0);
  cmd({"SET", "k", "v"});
  EXPECT_EQ(integer({"PERSIST", "k"}), 0);  // no TTL to remove
  cmd({"SET", "k", "v", "PX", "100"});
  EXPECT_EQ(integer({"PERSIST", "k"}), 1);
  EXPECT_EQ(pttl("k"), -1);
  clock_->advance(1'000'000);
  EXPECT_EQ(get("k"), "v");
  EXPECT_EQ(store_->sweep(), 0u);  // the old deadline was really removed
  EXPECT_EQ(store_->stored_keys(), 1u);
}

// ---- KEYS / DBSIZE / FLUSHALL -------------------------------------------------------

TEST_F(MemoryStoreTest, KeysGlob) {
  for (std::string k : {"user:1", "user:2", "user:10", "admin:1", "hello", "hallo", "hxllo", "hllo", "a*b", "axb",
                        "dead"}) {
    cmd({"SET", k, "1"});
  }
  cmd({"PEXPIRE", "dead", "5"});
  clock_->advance(5);
  using V = std::vector<std::string>;
  EXPECT_EQ(rctest::keys(*store_, "*"),
            (V{"a*b", "admin:1", "axb", "hallo", "hello", "hllo", "hxllo", "user:1", "user:10", "user:2"}));
  EXPECT_EQ(rctest::keys(*store_, "user:*"), (V{"user:1", "user:10", "user:2"}));
  EXPECT_EQ(rctest::keys(*store_, "user:?"), (V{"user:1", "user:2"}));
  EXPECT_EQ(rctest::keys(*store_, "*:1"), (V{"admin:1", "user:1"}));
  EXPECT_EQ(rctest::keys(*store_, "h?llo"), (V{"hallo", "hello", "hxllo"}));
  EXPECT_EQ(rctest::keys(*store_, "h*llo"), (V{"hallo", "hello", "hllo", "hxllo"}));
  EXPECT_EQ(rctest::keys(*store_, "h[ae]llo"), (V{"hallo", "hello"}));
  EXPECT_EQ(rctest::keys(*store_, "h[^e]llo"), (V{"hallo", "hxllo"}));
  EXPECT_EQ(rctest::keys(*store_, "h[a-b]llo"), (V{"hallo"}));
  EXPECT_EQ(rctest::keys(*store_, "a\\*b"), (V{"a*b"}));
  EXPECT_EQ(rctest::keys(*store_, "a*b"), (V{"a*b", "axb"}));
  EXPECT_EQ(rctest::keys(*store_, "hello"), (V{"hello"}));
  EXPECT_EQ(rctest::keys(*store_, "dead"), (V{}));
  EXPECT_EQ(rctest::keys(*store_, "nomatch*"), (V{}));
}

TEST_F(MemoryStoreTest, DbsizeAndFlushall) {
  EXPECT_EQ(integer({"DBSIZE"}), 0);
  cmd({"SET", "a", "1"});
  cmd({"SET", "b", "1", "PX", "10"});
  cmd({"INCR", "c"});
  EXPECT_EQ(integer({"DBSIZE"}), 3);
  clock_->advance(10);
  EXPECT_EQ(integer({"DBSIZE"}), 2);
  Reply r = cmd({"FLUSHALL"});
  EXPECT_EQ(r.type, Reply::Type::Status);
  EXPECT_EQ(r.str, "OK");
  EXPECT_EQ(integer({"DBSIZE"}), 0);
  EXPECT_EQ(store_->stored_keys(), 0u);
  EXPECT_EQ(store_->sweep(), 0u);  // the expiry index was cleared too
  cmd({"SET", "x", "1"});
  EXPECT_EQ(cmd({"FLUSHDB"}).str, "OK");
  EXPECT_EQ(integer({"DBSIZE"}), 0);
}

// ---- sorted sets --------------------------------------------------------------------

TEST_F(MemoryStoreTest, ZsetOrdersByScoreThenMemberBytes) {
  EXPECT_EQ(integer({"ZADD", "z", "2", "b", "1", "c", "2", "a", "1", "\xff", "1", "", "2", "A"}), 6);
  // Ties at one score go by member bytes: "" first, uppercase before lowercase, 0xff last.
  EXPECT_EQ(strings({"ZRANGE", "z", "0", "-1"}), (Strings{"", "c", "\xff", "A", "a", "b"}));
  EXPECT_EQ(integer({"ZADD", "z", "0", "b"}), 0);  // re-scored, not added
  EXPECT_EQ(strings({"ZRANGE", "z", "0", "-1", "WITHSCORES"}),
            (Strings{"b", "0", "", "1", "c", "1", "\xff", "1", "A", "2", "a", "2"}));
  EXPECT_EQ(integer({"ZCARD", "z"}), 6);
  EXPECT_EQ(status({"TYPE", "z"}), "zset");
}

TEST_F(MemoryStoreTest, ZaddFlags) {
  EXPECT_EQ(integer({"ZADD", "z", "XX", "1", "a"}), 0);
  EXPECT_FALSE(exists("z"));  // XX never creates the key
  EXPECT_EQ(integer({"ZADD", "z", "1", "a", "2", "b"}), 2);
  EXPECT_EQ(integer({"ZADD", "z", "NX", "5", "a", "3", "c"}), 1);
  EXPECT_EQ(cmd({"ZSCORE", "z", "a"}).str, "1");
  EXPECT_EQ(integer({"ZADD", "z", "XX", "CH", "5", "a", "9", "new"}), 1);
  EXPECT_EQ(cmd({"ZSCORE", "z", "a"}).str, "5");
  EXPECT_TRUE(cmd({"ZSCORE", "z", "new"}).is_nil());
  EXPECT_EQ(integer({"ZADD", "z", "GT", "CH", "4", "a", "7", "b", "1", "d"}), 2);  // b raised, d added
  EXPECT_EQ(cmd({"ZSCORE", "z", "a"}).str, "5");
  EXPECT_EQ(cmd({"ZSCORE", "z", "b"}).str, "7");
  EXPECT_EQ(integer({"ZADD", "z", "lt", "ch", "6", "a", "2", "b"}), 1);
  EXPECT_EQ(cmd({"ZSCORE", "z", "b"}).str, "2");
  EXPECT_EQ(integer({"ZADD", "z", "CH", "2", "b"}), 0);  // same score: not a change
  EXPECT_EQ(integer({"ZADD", "z", "XX", "GT", "3", "b"}), 0);  // XX with GT: a plain ZADD count
  EXPECT_EQ(cmd({"ZSCORE", "z", "b"}).str, "3");
  expect_error({"ZADD", "z", "NX", "XX", "1", "a"}, "ERR XX and NX options at the same time are not compatible");
  const std::string gt_lt_nx = "ERR GT, LT, and/or NX options at the same time are not compatible";
  expect_error({"ZADD", "z", "NX", "GT", "1", "a"}, gt_lt_nx);
  expect_error({"ZADD", "z", "GT", "LT", "1", "a"}, gt_lt_nx);
  expect_error({"ZADD", "z", "INCR", "1", "a", "2", "b"}, "ERR INCR option supports a single increment-element pair");
  expect_error_prefix({"ZADD", "z", "INCR", "1", "a"}, "ERR the memory:// store does not support ZADD INCR");
  expect_error({"ZADD", "z", "1", "a", "2"}, kSyntax);
  expect_error({"ZADD", "z", "NX", "1"}, kSyntax);
  expect_error({"ZADD", "z", "1", "a", "NX"}, kSyntax);  // flags only come first
  expect_error({"ZADD", "z", "BOGUS", "1", "a"}, kSyntax);
  // A bad score anywhere refuses the whole command.
  expect_error({"ZADD", "z", "1", "x", "nope", "y"}, kNotFloat);
  EXPECT_TRUE(cmd({"ZSCORE", "z", "x"}).is_nil());
  EXPECT_EQ(integer({"ZCARD", "z"}), 4);
}

TEST_F(MemoryStoreTest, ZaddScoreParsingAndZscoreFormatting) {
  const std::vector<std::pair<std::string, std::string>> cases{
      {"1.5", "1.5"},       {"100", "100"},    {"1e20", "1e+20"},
      {"-inf", "-inf"},     {"+inf", "inf"},   {"inf", "inf"},
      {"-Infinity", "-inf"}, {"0x10", "16"},   {"0.1", "0.10000000000000001"},
      {"-0", "0"},          {"+2.5", "2.5"},   {"12345678901234567890", "1.2345678901234567e+19"},
      {"4503599627370497", "4503599627370497"}, {"-1.5e-5", "-1.5e-05"}};
  for (const auto& [in, out] : cases) {
    EXPECT_EQ(integer({"ZADD", "z", in, "m"}), 0 + (in == cases.front().first)) << in;
    Reply r = cmd({"ZSCORE", "z", "m"});
    EXPECT_EQ(r.type, Reply::Type::String) << in;
    EXPECT_EQ(r.str, out) << in;
  }
  for (const std::string& bad : Strings{"nan", "NaN", "-nan", "", " 1", "1 ", "1e400", "-1e400", "1e-400", "abc",
                                        "1,5", std::string("1\0", 2)}) {
    expect_error({"ZADD", "z", bad, "m"}, kNotFloat);
  }
}

TEST_F(MemoryStoreTest, ZrangeByRankWithNegativeIndexes) {
  cmd({"ZADD", "z", "1", "a", "2", "b", "3", "c", "4", "d", "5", "e"});
  EXPECT_EQ(strings({"ZRANGE", "z", "0", "-1"}), (Strings{"a", "b", "c", "d", "e"}));
  EXPECT_EQ(strings({"ZRANGE", "z", "1", "2"}), (Strings{"b", "c"}));
  EXPECT_EQ(strings({"ZRANGE", "z", "-2", "-1"}), (Strings{"d", "e"}));
  EXPECT_EQ(strings({"ZRANGE", "z", "-100", "1"}), (Strings{"a", "b"}));
  EXPECT_EQ(strings({"ZRANGE", "z", "3", "100"}), (Strings{"d", "e"}));
  EXPECT_EQ(strings({"ZRANGE", "z", "-1", "-1", "withscores"}), (Strings{"e", "5"}));
  EXPECT_EQ(strings({"ZRANGE", "z", "4", "4"}), (Strings{"e"}));
  EXPECT_EQ(strings({"ZRANGE", "z", "5", "10"}), Strings{});
  EXPECT_EQ(strings({"ZRANGE", "z", "2", "1"}), Strings{});
  EXPECT_EQ(strings({"ZRANGE", "z", "-1", "-2"}), Strings{});
  EXPECT_EQ(strings({"ZRANGE", "z", "0", "-6"}), Strings{});
  EXPECT_EQ(strings({"ZRANGE", "nope", "0", "-1"}), Strings{});
  EXPECT_EQ(strings({"ZRANGE", "z", "0", "0", "LIMIT", "3", "-1"}), (Strings{"a"}));  // Redis lets this pass
  expect_error({"ZRANGE", "z", "0", "1", "LIMIT", "0", "1"},
               "ERR syntax error, LIMIT is only supported in combination with either BYSCORE or BYLEX");
  expect_error({"ZRANGE", "z", "a", "1"}, kNotInteger);
  expect_error({"ZRANGE", "z", "0", "1.0"}, kNotInteger);
  expect_error({"ZRANGE", "z", "0", "1", "BOGUS"}, kSyntax);
  expect_error_prefix({"ZRANGE", "z", "0", "1", "REV"},
                      "ERR syntax error, the memory:// store supports ZRANGE by rank");
  expect_error_prefix({"ZRANGE", "z", "0", "1", "BYSCORE"}, kSyntax);
}

// Score ranges over a set longer than the few steps a short range takes from its start
// (then a binary search): every range of random bounds, open or closed, inclusive or
// exclusive, selects exactly the members a scan of the whole set selects, for ZCOUNT,
// ZRANGEBYSCORE and ZREMRANGEBYSCORE alike.
TEST_F(MemoryStoreTest, ScoreRangesOfEveryLengthSelectWhatAScanSelects) {
  std::mt19937 rng(7);
  std::vector<std::pair<double, std::string>> all;  // (score, member), as Redis orders them
  std::vector<std::string> zadd = {"ZADD", "z"};
  const double inf = std::numeric_limits<double>::infinity();
  for (int i = 0; i < 60; ++i) {
    const int pick = static_cast<int>(rng() % 24);
    const double score = pick == 0 ? -inf : pick == 23 ? inf : static_cast<double>(pick / 2);
    const std::string member = "m" + std::to_string(i);
    all.emplace_back(score, member);
    zadd.push_back(pick == 0 ? "-inf" : pick == 23 ? "inf" : std::to_string(pick / 2));
    zadd.push_back(member);
  }
  std::sort(all.begin(), all.end());
  ASSERT_EQ(integer(zadd), 60);
  auto bound = [&](double& v, bool& ex) {
    const int pick = static_cast<int>(rng() % 28);
    ex = rng() % 2 == 0;
    v = pick == 0 ? -inf : pick == 27 ? inf : (pick - 2) / 2.0;
    if (pick == 0) return std::string(ex ? "(-inf" : "-inf");
    if (pick == 27) return std::string(ex ? "(+inf" : "+inf");
    std::ostringstream text;
    text << (ex ? "(" : "") << v;
    return text.str();
  };
  for (int round = 0; round < 400; ++round) {
    double lo = 0, hi = 0;
    bool lo_ex = false, hi_ex = false;
    const std::string min = bound(lo, lo_ex), max = bound(hi, hi_ex);
    Strings expected;
    for (const auto& [score, member] : all) {
      if ((lo_ex ? score > lo : score >= lo) && (hi_ex ? score < hi : score <= hi)) expected.push_back(member);
    }
    const std::string what = min + " " + max;
    EXPECT_EQ(integer({"ZCOUNT", "z", min, max}), static_cast<std::int64_t>(expected.size())) << what;
    EXPECT_EQ(strings({"ZRANGEBYSCORE", "z", min, max}), expected) << what;
  }
  // Removal, on copies of the set: what is left is the rest of the scan.
  for (int round = 0; round < 100; ++round) {
    double lo = 0, hi = 0;
    bool lo_ex = false, hi_ex = false;
    const std::string min = bound(lo, lo_ex), max = bound(hi, hi_ex);
    cmd({"DEL", "c"});
    std::vector<std::string> copy = zadd;
    copy[1] = "c";
    ASSERT_EQ(integer(copy), 60);
    Strings left;
    std::int64_t removed = 0;
    for (const auto& [score, member] : all) {
      if ((lo_ex ? score > lo : score >= lo) && (hi_ex ? score < hi : score <= hi)) {
        ++removed;
      } else {
        left.push_back(member);
      }
    }
    const std::string what = min + " " + max;
    EXPECT_EQ(integer({"ZREMRANGEBYSCORE", "c", min, max}), removed) << what;
    if (left.empty()) {
      EXPECT_FALSE(exists("c")) << what;
    } else {
      EXPECT_EQ(strings({"ZRANGE", "c", "0", "-1"}), left) << what;
    }
  }
}

// A log trimmed at the front and grown at the back, as a limiter uses it, with members
// removed and re-scored in the middle now and then: the set always holds exactly what a
// model of it holds, in order, through every trim and compaction of its array.
TEST_F(MemoryStoreTest, ALogTrimmedAtTheFrontAndGrownAtTheBackStaysExact) {
  std::vector<std::pair<double, std::string>> model;
  std::mt19937 rng(11);
  int next = 0;
  for (int round = 0; round < 300; ++round) {
    for (int k = static_cast<int>(rng() % 5); k > 0; --k, ++next) {
      const std::string m = "m" + std::to_string(next);
      ASSERT_EQ(integer({"ZADD", "log", std::to_string(next), m}), 1);
      model.emplace_back(next, m);
    }
    std::sort(model.begin(), model.end());
    const int cut = next - 20 - static_cast<int>(rng() % 10);
    std::int64_t gone = 0;
    while (!model.empty() && model.front().first <= cut) {
      model.erase(model.begin());
      ++gone;
    }
    ASSERT_EQ(integer({"ZREMRANGEBYSCORE", "log", "-inf", std::to_string(cut)}), gone) << round;
    if (round % 7 == 0 && model.size() > 3) {  // one from the middle: removed, or moved to the back
      const std::size_t at = 1 + rng() % (model.size() - 2);
      const std::string m = model[at].second;
      model.erase(model.begin() + static_cast<std::ptrdiff_t>(at));
      if (round % 2 == 0) {
        ASSERT_EQ(integer({"ZREM", "log", m}), 1);
      } else {
        ASSERT_EQ(integer({"ZADD", "log", std::to_string(next + 1000), m}), 0);
        model.emplace_back(next + 1000, m);
        std::sort(model.begin(), model.end());  // as Redis orders it: later adds go before it
      }
    }
    Strings expected;
    for (const auto& item : model) expected.push_back(item.second);
    if (expected.empty()) {
      ASSERT_FALSE(exists("log")) << round;
    } else {
      ASSERT_EQ(strings({"ZRANGE", "log", "0", "-1"}), expected) << round;
      ASSERT_EQ(integer({"ZCARD", "log"}), static_cast<std::int64_t>(expected.size())) << round;
    }
  }
}

TEST_F(MemoryStoreTest, ZrangeByScoreBoundsAndLimit) {
  cmd({"ZADD", "z", "-inf", "lo", "1", "a", "2", "b", "2", "c", "3", "d", "inf", "hi"});
  EXPECT_EQ(strings({"ZRANGEBYSCORE", "z", "1", "2"}), (Strings{"a", "b", "c"}));
  EXPECT_EQ(strings({"ZRANGEBYSCORE", "z", "(1", "2"}), (Strings{"b", "c"}));
  EXPECT_EQ(strings({"ZRANGEBYSCORE", "z", "1", "(2"}), (Strings{"a"}));
  EXPECT_EQ(strings({"ZRANGEBYSCORE", "z", "(1", "(3"}), (Strings{"b", "c"}));
  EXPECT_EQ(strings({"ZRANGEBYSCORE", "z", "(2", "(2"}), Strings{});
  EXPECT_EQ(strings({"ZRANGEBYSCORE", "z", "2", "2"}), (Strings{"b", "c"}));
  EXPECT_EQ(strings({"ZRANGEBYSCORE", "z", "3", "1"}), Strings{});
  EXPECT_EQ(strings({"ZRANGEBYSCORE", "z", "-inf", "+inf"}), (Strings{"lo", "a", "b", "c", "d", "hi"}));
  EXPECT_EQ(strings({"ZRANGEBYSCORE", "z", "(-inf", "(inf"}), (Strings{"a", "b", "c", "d"}));
  EXPECT_EQ(strings({"ZRANGEBYSCORE", "z", "2.5", "1e400", "WITHSCORES"}), (Strings{"d", "3", "hi", "inf"}));
  EXPECT_EQ(strings({"ZRANGEBYSCORE", "z", "1", "3", "LIMIT", "1", "2"}), (Strings{"b", "c"}));
  EXPECT_EQ(strings({"ZRANGEBYSCORE", "z", "1", "3", "limit", "1", "-1", "withscores"}),
            (Strings{"b", "2", "c", "2", "d", "3"}));
  EXPECT_EQ(strings({"ZRANGEBYSCORE", "z", "1", "3", "LIMIT", "1", "0"}), Strings{});
  EXPECT_EQ(strings({"ZRANGEBYSCORE", "z", "1", "3", "LIMIT", "-1", "2"}), Strings{});  // as in Redis
  EXPECT_EQ(strings({"ZRANGEBYSCORE", "z", "1", "3", "LIMIT", "9", "2"}), Strings{});
  // Bounds parse like Redis's zslParseRange: strtod to the end, '(' for exclusive.
  EXPECT_EQ(strings({"ZRANGEBYSCORE", "z", " 1", "1"}), (Strings{"a"}));
  EXPECT_EQ(strings({"ZRANGEBYSCORE", "z", "", "1"}), (Strings{"a"}));
  for (std::string bad : {"x", "nan", "(nan", "1x", "((1", "[1"}) {
    expect_error({"ZRANGEBYSCORE", "z", bad, "2"}, kBadRange);
    expect_error({"ZRANGEBYSCORE", "z", "0", bad}, kBadRange);
    expect_error({"ZCOUNT", "z", bad, "2"}, kBadRange);
    expect_error({"ZREMRANGEBYSCORE", "z", "0", bad}, kBadRange);
  }
  expect_error({"ZRANGEBYSCORE", "z", "1", "2", "LIMIT", "0"}, kSyntax);
  expect_error({"ZRANGEBYSCORE", "z", "1", "2", "LIMIT", "0", "x"}, kNotInteger);
  expect_error({"ZRANGEBYSCORE", "z", "1", "2", "REV"}, kSyntax);
  EXPECT_EQ(strings({"ZRANGEBYSCORE", "nope", "-inf", "inf"}), Strings{});
}

TEST_F(MemoryStoreTest, ZcountZremAndZremrangebyscore) {
  cmd({"ZADD", "z", "1", "a", "2", "b", "3", "c", "4", "d", "5", "e"});
  EXPECT_EQ(integer({"ZCOUNT", "z", "-inf", "inf"}), 5);
  EXPECT_EQ(integer({"ZCOUNT", "z", "(1", "(4"}), 2);
  EXPECT_EQ(integer({"ZCOUNT", "z", "4", "2"}), 0);
  EXPECT_EQ(integer({"ZCOUNT", "nope", "-inf", "inf"}), 0);
  EXPECT_EQ(integer({"ZREM", "z", "a", "zz", "a"}), 1);
  EXPECT_EQ(integer({"ZREM", "nope", "a"}), 0);
  EXPECT_EQ(integer({"ZREMRANGEBYSCORE", "z", "(2", "4"}), 2);
  EXPECT_EQ(strings({"ZRANGE", "z", "0", "-1", "WITHSCORES"}), (Strings{"b", "2", "e", "5"}));
  EXPECT_EQ(integer({"ZREMRANGEBYSCORE", "z", "10", "20"}), 0);
  EXPECT_EQ(integer({"ZREMRANGEBYSCORE", "nope", "-inf", "inf"}), 0);
  EXPECT_EQ(integer({"ZCARD", "z"}), 2);
  EXPECT_EQ(integer({"ZCARD", "nope"}), 0);
  EXPECT_TRUE(cmd({"ZSCORE", "nope", "a"}).is_nil());
  EXPECT_TRUE(cmd({"ZSCORE", "z", "a"}).is_nil());
}

TEST_F(MemoryStoreTest, EmptiedZsetIsDeletedWithItsTtl) {
  cmd({"ZADD", "z", "1", "a", "2", "b"});
  EXPECT_EQ(integer({"PEXPIRE", "z", "1000"}), 1);
  EXPECT_EQ(integer({"ZREM", "z", "a", "b"}), 2);
  EXPECT_FALSE(exists("z"));
  EXPECT_EQ(status({"TYPE", "z"}), "none");
  EXPECT_EQ(store_->stored_keys(), 0u);
  cmd({"ZADD", "z", "1", "a"});
  EXPECT_EQ(pttl("z"), -1);  // the new set did not inherit the old deadline
  clock_->advance(1000);
  EXPECT_EQ(store_->sweep(), 0u);  // and the old deadline left the expiry index
  EXPECT_EQ(integer({"ZCARD", "z"}), 1);

  cmd({"PEXPIRE", "z", "500"});
  EXPECT_EQ(integer({"ZREMRANGEBYSCORE", "z", "-inf", "+inf"}), 1);
  EXPECT_FALSE(exists("z"));
  EXPECT_EQ(store_->stored_keys(), 0u);
  clock_->advance(500);
  EXPECT_EQ(store_->sweep(), 0u);
}

// ---- hashes -------------------------------------------------------------------------

TEST_F(MemoryStoreTest, HashBasics) {
  EXPECT_EQ(integer({"HSET", "h", "f1", "v1", "f2", "v2"}), 2);
  EXPECT_EQ(integer({"HSET", "h", "f1", "x", "f3", "v3", "f3", "v3b"}), 1);  // f3 new once
  EXPECT_EQ(status({"TYPE", "h"}), "hash");
  EXPECT_EQ(cmd({"HGET", "h", "f1"}).str, "x");
  EXPECT_TRUE(cmd({"HGET", "h", "nope"}).is_nil());
  EXPECT_TRUE(cmd({"HGET", "nope", "f1"}).is_nil());
  EXPECT_EQ(strings({"HMGET", "h", "f3", "nope", "f1"}), (Strings{"v3b", "<nil>", "x"}));
  EXPECT_EQ(strings({"HMGET", "nope", "a", "b"}), (Strings{"<nil>", "<nil>"}));
  // Insertion order, as a small Redis hash keeps it; an update keeps its place.
  EXPECT_EQ(strings({"HGETALL", "h"}), (Strings{"f1", "x", "f2", "v2", "f3", "v3b"}));
  EXPECT_EQ(strings({"HGETALL", "nope"}), Strings{});
  EXPECT_EQ(integer({"HLEN", "h"}), 3);
  EXPECT_EQ(integer({"HLEN", "nope"}), 0);
  EXPECT_EQ(integer({"HEXISTS", "h", "f2"}), 1);
  EXPECT_EQ(integer({"HEXISTS", "h", "zz"}), 0);
  EXPECT_EQ(integer({"HEXISTS", "nope", "f2"}), 0);
  EXPECT_EQ(integer({"HDEL", "h", "f2", "zz", "f2"}), 1);
  EXPECT_EQ(integer({"HDEL", "nope", "f2"}), 0);
  EXPECT_EQ(integer({"HSET", "h", "f2", "again"}), 1);
  EXPECT_EQ(strings({"HGETALL", "h"}), (Strings{"f1", "x", "f3", "v3b", "f2", "again"}));
}

TEST_F(MemoryStoreTest, Hincrby) {
  EXPECT_EQ(integer({"HINCRBY", "h", "n", "5"}), 5);
  EXPECT_EQ(integer({"HINCRBY", "h", "n", "-7"}), -2);
  EXPECT_EQ(cmd({"HGET", "h", "n"}).str, "-2");
  cmd({"HSET", "h", "s", "abc", "pad", "01", "max", kMax});
  expect_error({"HINCRBY", "h", "s", "1"}, "ERR hash value is not an integer");
  expect_error({"HINCRBY", "h", "pad", "1"}, "ERR hash value is not an integer");
  expect_error({"HINCRBY", "h", "max", "1"}, kOverflow);
  expect_error({"HINCRBY", "h", "n", "x"}, kNotInteger);
  expect_error({"HINCRBY", "nope", "n", "1.5"}, kNotInteger);
  EXPECT_FALSE(exists("nope"));
  EXPECT_EQ(cmd({"HGET", "h", "max"}).str, kMax);
  EXPECT_EQ(integer({"HINCRBY", "h", "max", kMin}), -1);
}

TEST_F(MemoryStoreTest, EmptiedHashIsDeletedWithItsTtl) {
  cmd({"HSET", "h", "a", "1", "b", "2"});
  cmd({"PEXPIRE", "h", "1000"});
  EXPECT_EQ(integer({"HDEL", "h", "a"}), 1);
  EXPECT_EQ(pttl("h"), 1000);
  EXPECT_EQ(integer({"HDEL", "h", "b", "a"}), 1);
  EXPECT_FALSE(exists("h"));
  EXPECT_EQ(store_->stored_keys(), 0u);
  EXPECT_EQ(integer({"HSET", "h", "c", "3"}), 1);
  EXPECT_EQ(pttl("h"), -1);
  clock_->advance(1000);
  EXPECT_EQ(store_->sweep(), 0u);
  EXPECT_EQ(strings({"HGETALL", "h"}), (Strings{"c", "3"}));
}

// ---- types --------------------------------------------------------------------------

TEST_F(MemoryStoreTest, WrongTypeBothDirections) {
  cmd({"SET", "s", "1"});
  cmd({"ZADD", "z", "1", "a"});
  cmd({"HSET", "h", "f", "1"});
  for (std::string key : {"z", "h"}) {
    for (std::vector<std::string> c : {Strings{"GET", key}, Strings{"INCR", key}, Strings{"DECR", key},
                                       Strings{"INCRBY", key, "1"}, Strings{"DECRBY", key, "1"}}) {
      expect_error(c, kWrongType);
    }
  }
  for (std::string key : {"s", "h"}) {
    for (std::vector<std::string> c :
         {Strings{"ZADD", key, "1", "a"}, Strings{"ZADD", key, "XX", "1", "a"}, Strings{"ZREM", key, "a"},
          Strings{"ZCARD", key}, Strings{"ZSCORE", key, "a"}, Strings{"ZCOUNT", key, "0", "1"},
          Strings{"ZRANGE", key, "0", "-1"}, Strings{"ZRANGEBYSCORE", key, "0", "1"},
          Strings{"ZREMRANGEBYSCORE", key, "0", "1"}}) {
      expect_error(c, kWrongType);
    }
  }
  for (std::string key : {"s", "z"}) {
    for (std::vector<std::string> c :
         {Strings{"HSET", key, "f", "v"}, Strings{"HGET", key, "f"}, Strings{"HMGET", key, "f"},
          Strings{"HGETALL", key}, Strings{"HDEL", key, "f"}, Strings{"HLEN", key}, Strings{"HEXISTS", key, "f"},
          Strings{"HINCRBY", key, "f", "1"}}) {
      expect_error(c, kWrongType);
    }
  }
  // Argument errors are reported before the key's type is looked at, as in Redis.
  expect_error({"ZADD", "s", "x", "a"}, kNotFloat);
  expect_error({"ZRANGE", "s", "a", "1"}, kNotInteger);
  expect_error({"ZCOUNT", "s", "a", "1"}, kBadRange);
  expect_error({"HINCRBY", "s", "f", "x"}, kNotInteger);
  // Nothing was changed by any of them.
  EXPECT_EQ(get("s"), "1");
  EXPECT_EQ(strings({"ZRANGE", "z", "0", "-1", "WITHSCORES"}), (Strings{"a", "1"}));
  EXPECT_EQ(strings({"HGETALL", "h"}), (Strings{"f", "1"}));
  EXPECT_EQ((Strings{status({"TYPE", "s"}), status({"TYPE", "z"}), status({"TYPE", "h"}), status({"TYPE", "x"})}),
            (Strings{"string", "zset", "hash", "none"}));
}

TEST_F(MemoryStoreTest, SetReplacesAnyTypeAndKeyCommandsWorkOnEveryType) {
  cmd({"ZADD", "z", "1", "a"});
  cmd({"HSET", "h", "f", "v"});
  EXPECT_TRUE(cmd({"SET", "z", "x", "NX"}).is_nil());  // NX sees a key of any type
  cmd({"PEXPIRE", "z", "700"});
  EXPECT_EQ(cmd({"SET", "z", "str", "KEEPTTL"}).str, "OK");
  EXPECT_EQ(get("z"), "str");
  EXPECT_EQ(pttl("z"), 700);
  EXPECT_EQ(cmd({"SET", "h", "5", "XX"}).str, "OK");
  EXPECT_EQ(integer({"INCR", "h"}), 6);
  EXPECT_EQ(integer({"HSET", "n", "f", "v"}), 1);
  EXPECT_EQ(integer({"EXISTS", "z", "h", "n"}), 3);
  EXPECT_EQ(integer({"DEL", "n"}), 1);
  EXPECT_EQ(integer({"ZADD", "n", "1", "m"}), 1);  // a deleted hash leaves room for a zset
  EXPECT_EQ(integer({"PERSIST", "n"}), 0);
}

TEST_F(MemoryStoreTest, ZsetAndHashKeysExpire) {
  cmd({"ZADD", "z", "1", "a"});
  cmd({"HSET", "h", "f", "v"});
  cmd({"SET", "s", "v"});
  EXPECT_EQ(integer({"PEXPIRE", "z", "100"}), 1);
  EXPECT_EQ(integer({"EXPIRE", "h", "1"}), 1);
  EXPECT_EQ(integer({"TTL", "h"}), 1);
  clock_->advance(99);
  EXPECT_EQ(integer({"ZCARD", "z"}), 1);
  EXPECT_EQ(rctest::keys(*store_), (Strings{"h", "s", "z"}));
  clock_->advance(1);
  // Invisible at once, to every command, though not yet freed.
  EXPECT_EQ(integer({"ZCARD", "z"}), 0);
  EXPECT_EQ(integer({"DBSIZE"}), 2);
  EXPECT_EQ(rctest::keys(*store_), (Strings{"h", "s"}));
  EXPECT_EQ(store_->stored_keys(), 2u);  // ZCARD's lazy expiry freed z
  clock_->advance(900);
  EXPECT_EQ(integer({"DBSIZE"}), 1);
  EXPECT_EQ(store_->stored_keys(), 2u);
  EXPECT_EQ(store_->sweep(), 1u);  // the sweeper frees a hash too
  EXPECT_EQ(status({"TYPE", "h"}), "none");
  EXPECT_TRUE(cmd({"HGET", "h", "f"}).is_nil());
  // An expired zset is gone for good: ZADD starts afresh, with no TTL.
  cmd({"ZADD", "z", "5", "b", "PX"});  // (syntax error: nothing written)
  EXPECT_EQ(integer({"ZADD", "z", "5", "b"}), 1);
  EXPECT_EQ(strings({"ZRANGE", "z", "0", "-1"}), (Strings{"b"}));
  EXPECT_EQ(pttl("z"), -1);
  cmd({"PEXPIREAT", "z", std::to_string(kT0)});  // in the past: deleted at once
  EXPECT_FALSE(exists("z"));
  cmd({"HSET", "h2", "f", "v", "g", "w"});
  cmd({"PEXPIRE", "h2", "10"});
  EXPECT_EQ(integer({"PERSIST", "h2"}), 1);
  clock_->advance(10);
  EXPECT_EQ(integer({"HLEN", "h2"}), 2);
  cmd({"FLUSHALL"});
  EXPECT_EQ(store_->stored_keys(), 0u);
}

TEST_F(MemoryStoreTest, WrongArityForZsetAndHashCommands) {
  auto arity = [](const std::string& name) { return "ERR wrong number of arguments for '" + name + "' command"; };
  expect_error({"TYPE"}, arity("type"));
  expect_error({"ZADD", "z", "1"}, arity("zadd"));
  expect_error({"ZADD", "z", "CH"}, arity("zadd"));
  expect_error({"ZREM", "z"}, arity("zrem"));
  expect_error({"ZCARD", "z", "x"}, arity("zcard"));
  expect_error({"ZSCORE", "z"}, arity("zscore"));
  expect_error({"ZCOUNT", "z", "0"}, arity("zcount"));
  expect_error({"ZRANGE", "z", "0"}, arity("zrange"));
  expect_error({"ZRANGEBYSCORE", "z", "0"}, arity("zrangebyscore"));
  expect_error({"ZREMRANGEBYSCORE", "z", "0", "1", "2"}, arity("zremrangebyscore"));
  expect_error({"HSET", "h", "f"}, arity("hset"));
  expect_error({"HSET", "h", "f", "v", "g"}, arity("hset"));
  expect_error({"HGET", "h"}, arity("hget"));
  expect_error({"HMGET", "h"}, arity("hmget"));
  expect_error({"HGETALL"}, arity("hgetall"));
  expect_error({"HDEL", "h"}, arity("hdel"));
  expect_error({"HLEN"}, arity("hlen"));
  expect_error({"HEXISTS", "h"}, arity("hexists"));
  expect_error({"HINCRBY", "h", "f"}, arity("hincrby"));
  EXPECT_EQ(integer({"DBSIZE"}), 0);
}

// ---- the Keyspace as native scripts see it ---------------------------------------------

// A sliding-window log: drop entries older than the window, then count and record one.
Reply native_log_hit(Keyspace& ks, const std::vector<std::string>& keys, const std::vector<std::string>& args) {
  const double now = static_cast<double>(ks.now_ms());
  const double window = std::stod(args[0]);
  ks.zremrangebyscore(keys[0], -std::numeric_limits<double>::infinity(), now - window);
  const std::int64_t before = ks.zcard(keys[0]);
  ks.zadd(keys[0], now, args[1]);
  ks.pexpireat(keys[0], ks.now_ms() + static_cast<std::int64_t>(window));
  ks.hset(keys[1], args[1], std::to_string(before));
  return Reply::of_integer(before);
}
const Script kLogHit{"test_log_hit", "-- native only", "0000000000000000000000000000000000000000", &native_log_hit};

// Runs every Keyspace method on its argument key and reports what it saw.
Reply native_probe(Keyspace& ks, const std::vector<std::string>& keys, const std::vector<std::string>&) {
  const std::string& k = keys[0];
  std::vector<Reply> out;
  auto push = [&](std::string s) { out.push_back(Reply::of_string(std::move(s))); };
  push(ks.exists(k) ? "exists" : "absent");
  push(ks.zadd(k, 2, "b") ? "new" : "old");
  push(ks.zadd(k, 1, "a") ? "new" : "old");
  push(ks.zadd(k, 3, "b") ? "new" : "old");
  push(ks.zadd(k, 1, "c") ? "new" : "old");
  push(std::to_string(ks.zcard(k)));
  push(std::to_string(ks.zscore(k, "b").value_or(-1)));
  push(ks.zscore(k, "zz") ? "score" : "no score");
  for (const auto& [m, s] : ks.zrange(k, -2, -1)) push(m + "=" + std::to_string(static_cast<int>(s)));
  for (const auto& [m, s] : ks.zrangebyscore(k, 1, 1)) push(m);
  for (const auto& [m, s] : ks.zrangebyscore(k, 0, 10, 1)) push("limited:" + m);
  push(std::to_string(ks.zrangebyscore(k, 0, 10, 0).size()));
  push(ks.zrem(k, "a") ? "removed" : "kept");
  push(ks.zrem(k, "a") ? "removed" : "kept");
  push(std::to_string(ks.zremrangebyscore(k, 1, 3)));
  push(ks.exists(k) ? "exists" : "absent");  // the emptied set is gone
  push(std::to_string(ks.zcard(k)));
  return Reply::of_array(std::move(out));
}
const Script kProbe{"test_probe", "-- native only", "0000000000000000000000000000000000000000", &native_probe};

Reply native_hash_probe(Keyspace& ks, const std::vector<std::string>& keys, const std::vector<std::string>&) {
  const std::string& k = keys[0];
  std::vector<Reply> out;
  auto push = [&](std::string s) { out.push_back(Reply::of_string(std::move(s))); };
  ks.hset(k, "x", "1");
  ks.hset(k, "y", "2");
  ks.hset(k, "x", "3");
  push(ks.hget(k, "x").value_or("<nil>"));
  push(ks.hget(k, "nope").value_or("<nil>"));
  for (const auto& [f, v] : ks.hgetall(k)) push(f + "=" + v);
  push(ks.hdel(k, "x") ? "deleted" : "kept");
  push(ks.hdel(k, "x") ? "deleted" : "kept");
  push(ks.hdel(k, "y") ? "deleted" : "kept");
  push(ks.exists(k) ? "exists" : "absent");
  push(std::to_string(ks.hgetall(k).size()));
  return Reply::of_array(std::move(out));
}
const Script kHashProbe{"test_hash_probe", "-- native only", "0000000000000000000000000000000000000000",
                        &native_hash_probe};

Reply native_wrong_type(Keyspace& ks, const std::vector<std::string>& keys, const std::vector<std::string>& args) {
  const std::string& k = keys[0];
  const std::string& op = args[0];
  if (op == "get") ks.get(k);
  if (op == "incrby") ks.incrby(k, 1);
  if (op == "zadd") ks.zadd(k, 1, "m");
  if (op == "zrem") ks.zrem(k, "m");
  if (op == "zcard") ks.zcard(k);
  if (op == "zscore") ks.zscore(k, "m");
  if (op == "zremrangebyscore") ks.zremrangebyscore(k, 0, 1);
  if (op == "zrange") ks.zrange(k, 0, -1);
  if (op == "zrangebyscore") ks.zrangebyscore(k, 0, 1);
  if (op == "hget") ks.hget(k, "f");
  if (op == "hset") ks.hset(k, "f", "v");
  if (op == "hdel") ks.hdel(k, "f");
  if (op == "hgetall") ks.hgetall(k);
  return Reply::of_status("no error");
}
const Script kWrongTypeScript{"test_wrong_type", "-- native only", "0000000000000000000000000000000000000000",
                              &native_wrong_type};

TEST_F(MemoryStoreTest, NativeScriptUsesSortedSetsAndHashes) {
  auto hit = [&](const std::string& id) {
    return store_->execute_one(ScriptCall{&kLogHit, {"log", "seen"}, {"1000", id}}).as_integer();
  };
  EXPECT_EQ(hit("r1"), 0);
  clock_->advance(400);
  EXPECT_EQ(hit("r2"), 1);
  clock_->advance(600);  // r1 is exactly one window old: dropped (the bound is inclusive)
  EXPECT_EQ(hit("r3"), 1);
  EXPECT_EQ(strings({"ZRANGE", "log", "0", "-1"}), (Strings{"r2", "r3"}));
  EXPECT_EQ(pttl("log"), 1000);
  EXPECT_EQ(strings({"HGETALL", "seen"}), (Strings{"r1", "0", "r2", "1", "r3", "1"}));
  clock_->advance(1000);
  EXPECT_FALSE(exists("log"));
}

TEST_F(MemoryStoreTest, NativeScriptSeesEveryKeyspaceMethod) {
  Reply r = store_->execute_one(ScriptCall{&kProbe, {"z"}, {}});
  ASSERT_EQ(r.type, Reply::Type::Array) << r.str;
  std::vector<std::string> got;
  for (const auto& e : r.elements) got.push_back(e.str);
  EXPECT_EQ(got, (Strings{"absent", "new", "new", "old", "new", "3", "3.000000", "no score", "c=1", "b=3", "a", "c",
                          "limited:a", "0", "removed", "kept", "2", "absent", "0"}));
  EXPECT_EQ(store_->stored_keys(), 0u);

  r = store_->execute_one(ScriptCall{&kHashProbe, {"h"}, {}});
  ASSERT_EQ(r.type, Reply::Type::Array) << r.str;
  got.clear();
  for (const auto& e : r.elements) got.push_back(e.str);
  EXPECT_EQ(got, (Strings{"3", "<nil>", "x=3", "y=2", "deleted", "kept", "deleted", "absent", "0"}));
  EXPECT_EQ(store_->stored_keys(), 0u);
}

TEST_F(MemoryStoreTest, NativeScriptGetsWrongTypeAsAnErrorReply) {
  cmd({"SET", "s", "1"});
  cmd({"ZADD", "z", "1", "m"});
  cmd({"HSET", "h", "f", "v"});
  const std::vector<std::pair<std::string, Strings>> cases{
      {"s", {"zadd", "zrem", "zcard", "zscore", "zremrangebyscore", "zrange", "zrangebyscore", "hget", "hset", "hdel",
             "hgetall"}},
      {"z", {"get", "incrby", "hget", "hset", "hdel", "hgetall"}},
      {"h", {"get", "incrby", "zadd", "zrem", "zcard", "zscore", "zremrangebyscore", "zrange", "zrangebyscore"}}};
  for (const auto& [key, ops] : cases) {
    for (const auto& op : ops) {
      Reply r = store_->execute_one(ScriptCall{&kWrongTypeScript, {key}, {op}});
      EXPECT_TRUE(r.is_error()) << key << " " << op;
      // Redis's text, then where the script failed (as Redis says it: a ScriptError).
      EXPECT_TRUE(r.str.starts_with(std::string(kWrongType) + " script: ")) << key << " " << op << ": " << r.str;
      EXPECT_TRUE(rctest::contains(rctest::error_of<ScriptError>([&] { r.check(); }), "@user_script")) << key << op;
    }
  }
  // The right type, or no key at all, is fine.
  for (const auto& [key, op] : std::vector<std::pair<std::string, std::string>>{
           {"s", "get"}, {"z", "zrange"}, {"h", "hgetall"}, {"absent", "zcard"}, {"absent", "hget"}}) {
    EXPECT_EQ(store_->execute_one(ScriptCall{&kWrongTypeScript, {key}, {op}}).str, "no error") << key << " " << op;
  }
  EXPECT_EQ(get("s"), "1");
  EXPECT_EQ(integer({"ZCARD", "z"}), 1);
  EXPECT_EQ(integer({"HLEN", "h"}), 1);
  EXPECT_EQ(integer({"DBSIZE"}), 3);
}

// ---- errors -------------------------------------------------------------------------

TEST_F(MemoryStoreTest, UnknownCommand) {
  expect_error_prefix({"FROBNICATE", "a", "b"}, "ERR unknown command 'FROBNICATE'");
  expect_error({"LPUSH", "l", "a", "b"}, "ERR unknown command 'LPUSH', with args beginning with: 'l' 'a' 'b' ");
  expect_error_prefix({"ZINCRBY", "z", "1", "m"}, "ERR unknown command 'ZINCRBY'");
  expect_error_prefix({"HSETNX", "h", "f", "v"}, "ERR unknown command 'HSETNX'");
  expect_error({}, "ERR empty command");
  EXPECT_EQ(integer({"DBSIZE"}), 0);
}

TEST_F(MemoryStoreTest, WrongArity) {
  auto arity = [](const std::string& name) {
    return "ERR wrong number of arguments for '" + name + "' command";
  };
  expect_error({"GET"}, arity("get"));
  expect_error({"GET", "a", "b"}, arity("get"));
  expect_error({"SET", "k"}, arity("set"));
  expect_error({"INCR"}, arity("incr"));
  expect_error({"INCR", "a", "b"}, arity("incr"));
  expect_error({"INCRBY", "k"}, arity("incrby"));
  expect_error({"DECRBY", "k", "1", "2"}, arity("decrby"));
  expect_error({"DEL"}, arity("del"));
  expect_error({"EXISTS"}, arity("exists"));
  expect_error({"PTTL"}, arity("pttl"));
  expect_error({"TTL", "a", "b"}, arity("ttl"));
  expect_error({"PEXPIRE", "k"}, arity("pexpire"));
  expect_error({"EXPIREAT", "k"}, arity("expireat"));
  expect_error({"PERSIST"}, arity("persist"));
  expect_error({"KEYS"}, arity("keys"));
  expect_error({"DBSIZE", "x"}, arity("dbsize"));
  expect_error({"PING", "a", "b"}, arity("ping"));
  expect_error({"TIME", "x"}, arity("time"));
  EXPECT_EQ(integer({"DBSIZE"}), 0);
}

TEST_F(MemoryStoreTest, PingAndTime) {
  Reply pong = cmd({"PING"});
  EXPECT_EQ(pong.type, Reply::Type::Status);
  EXPECT_EQ(pong.str, "PONG");
  EXPECT_EQ(cmd({"PING", "hi"}).str, "hi");
  clock_->set(kT0 + 1234);
  Reply t = cmd({"TIME"});
  ASSERT_EQ(t.type, Reply::Type::Array);
  ASSERT_EQ(t.elements.size(), 2u);
  EXPECT_EQ(t.elements[0].str, std::to_string((kT0 + 1234) / 1000));
  EXPECT_EQ(t.elements[1].str, "234000");
  EXPECT_EQ(store_->now_ms(), kT0 + 1234);
  EXPECT_EQ(store_->describe(), "memory://");
  EXPECT_TRUE(store_->is_memory());
}

TEST_F(MemoryStoreTest, BatchRepliesInOrderWithInlineErrors) {
  std::vector<Request> batch{Command{{"SET", "k", "abc"}}, Command{{"INCR", "k"}}, Command{{"GET", "k"}},
                             Command{{"INCR", "n"}}, Command{{"NOPE"}}, Command{{"INCR", "n"}}};
  std::vector<Reply> r = store_->execute(batch);
  ASSERT_EQ(r.size(), 6u);
  EXPECT_EQ(r[0].str, "OK");
  EXPECT_TRUE(r[1].is_error());
  EXPECT_EQ(r[1].str, kNotInteger);
  EXPECT_EQ(r[2].str, "abc");
  EXPECT_EQ(r[3].integer, 1);
  EXPECT_TRUE(r[4].is_error());
  EXPECT_EQ(r[5].integer, 2);
  EXPECT_TRUE(store_->execute({}).empty());
  // Reply::check() turns an error reply into a ReplyError with its code.
  std::string msg = rctest::error_of<ReplyError>([&] { r[1].check(); });
  EXPECT_EQ(msg, kNotInteger);
}

TEST_F(MemoryStoreTest, ClosedStoreRefusesCommands) {
  cmd({"SET", "k", "v"});
  store_->close();
  rctest::error_of<ConnectionError>([&] { cmd({"GET", "k"}); });
  store_->close();  // idempotent
}

// ---- expiry sweeping ----------------------------------------------------------------

TEST_F(MemoryStoreTest, SweepFreesExpiredKeys) {
  cmd({"SET", "forever", "1"});
  for (int i = 0; i < 3000; ++i) {  // more than one sweep slice
    cmd({"SET", rctest::cat("short:", i), "1", "PX", "100"});
  }
  cmd({"SET", "long", "1", "PX", "1000"});
  EXPECT_EQ(store_->stored_keys(), 3002u);
  EXPECT_EQ(store_->sweep(), 0u);
  clock_->advance(99);
  EXPECT_EQ(store_->sweep(), 0u);
  EXPECT_EQ(store_->stored_keys(), 3002u);
  clock_->advance(1);
  // Expired but not yet touched: invisible, yet still stored until a sweep.
  EXPECT_EQ(integer({"DBSIZE"}), 2);
  EXPECT_EQ(store_->stored_keys(), 3002u);
  EXPECT_EQ(store_->sweep(), 3000u);
  EXPECT_EQ(store_->stored_keys(), 2u);
  clock_->advance(900);
  EXPECT_EQ(store_->sweep(), 1u);
  EXPECT_EQ(store_->stored_keys(), 1u);
  EXPECT_EQ(get("forever"), "1");
}

TEST_F(MemoryStoreTest, SweepAfterTtlChangesFreesOnlyWhatIsDue) {
  cmd({"SET", "a", "1", "PX", "100"});
  cmd({"PEXPIRE", "a", "500"});           // moved later
  cmd({"SET", "b", "1", "PX", "100"});
  cmd({"SET", "b", "2", "KEEPTTL"});      // value changed, deadline kept
  cmd({"SET", "c", "1", "PX", "100"});
  cmd({"SET", "c", "2"});                 // deadline dropped
  clock_->advance(100);
  EXPECT_EQ(store_->sweep(), 1u);  // only b
  EXPECT_EQ(rctest::keys(*store_), (std::vector<std::string>{"a", "c"}));
  clock_->advance(400);
  EXPECT_EQ(store_->sweep(), 1u);  // a
  EXPECT_EQ(store_->stored_keys(), 1u);
}

TEST(MemoryStoreSweeper, BackgroundSweeperEventuallyFreesExpiredKeys) {
  auto clock = std::make_shared<ManualClock>(kT0);
  auto store = rctest::memory_store(clock, std::chrono::milliseconds(5));
  for (int i = 0; i < 100; ++i) rctest::run(*store, {"SET", rctest::cat("k", i), "v", "PX", "50"});
  rctest::run(*store, {"SET", "keep", "v"});
  EXPECT_EQ(store->stored_keys(), 101u);
  clock->advance(50);
  // Bounded poll: no assertion on how fast the sweeper is, only that it gets there.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (store->stored_keys() != 1u && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_EQ(store->stored_keys(), 1u);
  EXPECT_EQ(rctest::run(*store, {"GET", "keep"}).str, "v");
  store->close();  // joins the sweeper
}

// ---- threads ------------------------------------------------------------------------

TEST(MemoryStoreThreads, ConcurrentIncrByGivesTheExactTotal) {
  // System clock and a running sweeper, to let every thread in the store race.
  StoreOptions o;
  o.sweep_interval = std::chrono::milliseconds(1);
  auto store = std::make_shared<MemoryStore>(o);
  constexpr int kThreads = 8;
  constexpr int kIters = 5000;
  std::atomic<bool> go{false};
  std::atomic<int> errors{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      while (!go.load()) std::this_thread::yield();
      for (int i = 0; i < kIters; ++i) {
        Reply r = store->execute_one(Command{{"INCRBY", "total", std::to_string(t + 1)}});
        if (r.type != Reply::Type::Integer) ++errors;
        // Some churn on other keys, including expiring ones, so the sweeper has work.
        if (i % 50 == 0) {
          store->execute({Command{{"SET", rctest::cat("tmp:", t), "x", "PX", "1"}},
                          Command{{"INCR", rctest::cat("side:", t)}}});
        }
      }
    });
  }
  go = true;
  for (auto& th : threads) th.join();
  EXPECT_EQ(errors.load(), 0);
  std::int64_t expected = 0;
  for (int t = 0; t < kThreads; ++t) expected += static_cast<std::int64_t>(t + 1) * kIters;
  EXPECT_EQ(store->execute_one(Command{{"GET", "total"}}).as_integer(), expected);
  for (int t = 0; t < kThreads; ++t) {
    EXPECT_EQ(store->execute_one(Command{{"GET", rctest::cat("side:", t)}}).as_integer(), kIters / 50);
  }
}

}  // namespace
