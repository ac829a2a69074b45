// MemoryStore: Redis semantics of the commands redcount uses, exact expiry on a
// ManualClock, the sweeper, and thread-safety.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <limits>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "redcount/clock.h"
#include "redcount/errors.h"
#include "redcount/memory_store.h"
#include "test_support.h"

using namespace redcount;
using rctest::contains;
using rctest::kT0;

namespace {

constexpr const char* kNotInteger = "ERR value is not an integer or out of range";
constexpr const char* kOverflow = "ERR increment or decrement would overflow";
constexpr const char* kSyntax = "ERR syntax error";
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
};

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

// ---- errors -------------------------------------------------------------------------

TEST_F(MemoryStoreTest, UnknownCommand) {
  expect_error_prefix({"FROBNICATE", "a", "b"}, "ERR unknown command 'FROBNICATE'");
  expect_error({"HSET", "h", "f", "v"}, "ERR unknown command 'HSET', with args beginning with: 'h' 'f' 'v' ");
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
