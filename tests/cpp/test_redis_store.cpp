// Against a real redis-server, only when REDCOUNT_TEST_REDIS_URL is set (skipped otherwise):
//
//   REDCOUNT_TEST_REDIS_URL=redis://127.0.0.1:6379/15 ./redcount_tests --gtest_filter='Redis*'
//
// Every key lives under a per-run prefix and is deleted afterwards; nothing else on the
// server is touched except the script cache (one test runs SCRIPT FLUSH).
//
// The command tests run each sequence on Redis and on the memory store and compare the
// replies, so the embedded store's "Redis semantics" are checked against Redis itself, and
// the counter/limiter tests run the Lua scripts that the memory store only has twins of.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "redcount/common/errors.h"
#include "redcount/counters/fixed_window.h"
#include "redcount/limiters/limiter.h"
#include "redcount/common/limit_string.h"
#include "redcount/memory/memory_store.h"
#include "redcount/common/options.h"
#include "redcount/redis/redis_store.h"
#include "redcount/common/window.h"
#include "test_support.h"

using namespace redcount;
using rctest::contains;
using Mode = FixedWindowOptions::Mode;

namespace {

// About a year: no window turns over while a test runs, so counts are exact on the
// system clock. Not a multiple of 365 days, so the boundary is not on New Year either.
constexpr std::int64_t kLongWindow = 400LL * 86'400'000;

class RedisTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* url = std::getenv("REDCOUNT_TEST_REDIS_URL");
    if (url == nullptr || *url == '\0') GTEST_SKIP() << "REDCOUNT_TEST_REDIS_URL is not set";
    redis_ = std::make_shared<RedisStore>(parse_url(url));
    static int run = 0;
    prefix_ = rctest::cat("rctest", ::getpid(), "x", ++run);
    memory_ = std::make_shared<MemoryStore>();
  }
  void TearDown() override {
    if (!redis_) return;
    Reply keys = rctest::run(*redis_, {"KEYS", prefix_ + "*"});
    if (!keys.elements.empty()) {
      Command del{{"DEL"}};
      for (const auto& k : keys.elements) del.args.push_back(k.str);
      rctest::run(*redis_, del.args);
    }
    redis_->close();
  }
  std::string k(const std::string& name) const { return prefix_ + ":" + name; }

  std::shared_ptr<RedisStore> redis_;
  std::shared_ptr<MemoryStore> memory_;
  std::string prefix_;
};

void expect_same_reply(const Reply& redis, const Reply& memory, const std::string& what) {
  EXPECT_EQ(redis.type, memory.type) << what << ": redis '" << redis.str << "' memory '" << memory.str << "'";
  EXPECT_EQ(redis.str, memory.str) << what;
  EXPECT_EQ(redis.integer, memory.integer) << what;
  ASSERT_EQ(redis.elements.size(), memory.elements.size()) << what;
  for (std::size_t i = 0; i < redis.elements.size(); ++i) {
    expect_same_reply(redis.elements[i], memory.elements[i], rctest::cat(what, "[", i, "]"));
  }
}

TEST_F(RedisTest, Ping) {
  EXPECT_EQ(rctest::run(*redis_, {"PING"}).str, "PONG");
  EXPECT_FALSE(redis_->is_memory());
  EXPECT_TRUE(contains(redis_->describe(), "redis://") || contains(redis_->describe(), "unix://"));
}

TEST_F(RedisTest, MemoryStoreRepliesLikeRedis) {
  const std::string a = k("a"), b = k("b"), n = k("n");
  const std::string max = std::to_string(std::numeric_limits<std::int64_t>::max());
  const std::string min = std::to_string(std::numeric_limits<std::int64_t>::min());
  const std::vector<std::vector<std::string>> script = {
      {"GET", a},
      {"SET", a, "1"},
      {"SET", a, "2", "NX"},
      {"SET", b, "2", "XX"},
      {"SET", a, "3", "XX"},
      {"GET", a},
      {"SET", a, "v", "NX", "XX"},
      {"SET", a, "v", "EX", "10", "PX", "10"},
      {"SET", a, "v", "KEEPTTL", "EX", "10"},
      {"SET", a, "v", "EX", "0"},
      {"SET", a, "v", "PX", "-1"},
      {"SET", a, "v", "EX", "x"},
      {"SET", a, "v", "BOGUS"},
      {"INCR", n},
      {"INCRBY", n, "41"},
      {"DECRBY", n, "2"},
      {"DECR", n},
      {"INCRBY", n, "x"},
      {"SET", b, "abc"},
      {"INCR", b},
      {"INCRBY", b, "1"},
      {"SET", b, "1.5"},
      {"INCR", b},
      {"SET", b, "-0"},
      {"INCR", b},
      {"SET", b, "01"},
      {"INCR", b},
      {"SET", b, max},
      {"INCR", b},
      {"INCRBY", b, "1"},
      {"GET", b},
      {"SET", b, min},
      {"DECR", b},
      {"SET", b, "-1"},
      {"DECRBY", b, min},
      {"EXISTS", a, b, k("none"), a},
      {"DEL", a, k("none")},
      {"PTTL", a},
      {"TTL", a},
      {"PTTL", b},
      {"TTL", b},
      {"PERSIST", b},
      {"PEXPIRE", b, "100000", "XX"},
      {"PEXPIRE", b, "100000", "GT"},
      {"PEXPIRE", b, "100000", "NX"},
      {"PEXPIRE", b, "200000", "NX"},
      {"PEXPIRE", b, "50000", "GT"},
      {"PEXPIRE", b, "200000", "GT"},
      {"PEXPIRE", b, "300000", "LT"},
      {"PEXPIRE", b, "100000", "LT"},
      {"PEXPIRE", b, "10", "NX", "XX"},
      {"PEXPIRE", b, "10", "GT", "LT"},
      {"PEXPIRE", b, "10", "BOGUS"},
      {"PEXPIRE", k("none"), "10"},
      {"EXPIRE", b, "x"},
      {"PERSIST", b},
      {"PERSIST", b},
      {"PEXPIRE", b, "0"},
      {"EXISTS", b},
      {"SET", a, "1"},
      {"SET", a, "2", "PXAT", "1"},
      {"EXISTS", a},
      {"GET"},
      {"SET", a},
      {"INCRBY", a},
      {"PTTL"},
      {"PERSIST"},
      {"FROBNICATE", a, "x"},
  };
  for (const auto& c : script) {
    std::vector<std::string> mem_args = c;
    for (auto& arg : mem_args) {
      if (arg.starts_with(prefix_)) arg = "m" + arg.substr(prefix_.size());  // same length not needed
    }
    const Reply r = rctest::run(*redis_, c);
    const Reply m = rctest::run(*memory_, mem_args);
    std::string what;
    for (const auto& arg : c) what += arg + " ";
    if (c[0] == "FROBNICATE") {  // the key name is echoed; compare the shape only
      EXPECT_TRUE(r.is_error());
      EXPECT_TRUE(m.is_error());
      EXPECT_TRUE(r.str.starts_with("ERR unknown command 'FROBNICATE'")) << r.str;
      EXPECT_TRUE(m.str.starts_with("ERR unknown command 'FROBNICATE'")) << m.str;
      continue;
    }
    expect_same_reply(r, m, what);
  }
}

class RedisCounterTest : public RedisTest, public ::testing::WithParamInterface<Mode> {
 protected:
  std::unique_ptr<FixedWindowCounter> counter(std::size_t max_script_batch = 512) {
    FixedWindowOptions o;
    o.prefix = prefix_;
    o.name = "pv";
    o.window_ms = kLongWindow;
    o.grace_ms = 1000;
    o.mode = GetParam();
    o.max_script_batch = max_script_batch;
    return std::make_unique<FixedWindowCounter>(redis_, o);
  }
  std::int64_t pttl(const std::string& key) { return rctest::run(*redis_, {"PTTL", key}).as_integer(); }
};

INSTANTIATE_TEST_SUITE_P(Modes, RedisCounterTest, ::testing::Values(Mode::Script, Mode::Commands),
                         [](const ::testing::TestParamInfo<Mode>& i) {
                           return std::string(i.param == Mode::Script ? "Script" : "Commands");
                         });

TEST_P(RedisCounterTest, CountsAndCompensatedTtl) {
  auto c = counter();
  const WindowPos pos = c->window("k");
  const std::int64_t before = SystemClock().now_ms();
  EXPECT_EQ(c->incr("k", 1), 1);
  EXPECT_EQ(c->incr("k", 4), 5);
  EXPECT_EQ(c->get("k"), 5);
  const std::int64_t ttl = pttl(c->storage_key("k"));
  EXPECT_GT(ttl, 0);
  EXPECT_LE(ttl, pos.expire_at_ms - before);
  EXPECT_EQ(c->incr_many({{"a", 1}, {"b", 2}, {"a", 3}}), (std::vector<std::int64_t>{1, 2, 4}));
}

TEST_P(RedisCounterTest, LostTtlIsRepaired) {
  auto c = counter();
  c->incr("k", 1);
  const std::string key = c->storage_key("k");
  rctest::run(*redis_, {"PERSIST", key});
  EXPECT_EQ(pttl(key), -1);
  EXPECT_EQ(c->incr("k", 1), 2);
  EXPECT_GT(pttl(key), 0);
  rctest::run(*redis_, {"SET", key, "41"});  // a foreign write without TTL
  EXPECT_EQ(c->incr("k", 1), 42);
  EXPECT_GT(pttl(key), 0);
}

TEST_P(RedisCounterTest, ErrorsLeaveTheValueUnchanged) {
  auto c = counter();
  const std::string key = c->storage_key("k");
  rctest::run(*redis_, {"SET", key, "junk"});
  EXPECT_EQ(rctest::error_of<ReplyError>([&] { c->incr("k", 1); }), "ERR value is not an integer or out of range");
  EXPECT_EQ(rctest::run(*redis_, {"GET", key}).str, "junk");
  const std::string max = std::to_string(std::numeric_limits<std::int64_t>::max());
  rctest::run(*redis_, {"SET", key, max, "PX", "100000"});
  EXPECT_EQ(rctest::error_of<ReplyError>([&] { c->incr("k", 1); }), "ERR increment or decrement would overflow");
  EXPECT_EQ(rctest::run(*redis_, {"GET", key}).str, max);
}

TEST_P(RedisCounterTest, CountsPast2To53AreExact) {
  auto c = counter();
  rctest::run(*redis_, {"SET", c->storage_key("k"), "9007199254740993", "PX", "100000"});
  EXPECT_EQ(c->incr("k", 1), 9007199254740994);
  EXPECT_EQ(c->incr_many({{"k", 2}}), std::vector<std::int64_t>{9007199254740996});
}

TEST_P(RedisCounterTest, LargeBatchesAcrossManyScriptCalls) {
  auto c = counter(7);
  std::vector<std::pair<std::string, std::int64_t>> items;
  for (int i = 0; i < 300; ++i) items.emplace_back(rctest::cat("k", i % 37), 1 + i % 3);
  const auto counts = c->incr_many(items);
  std::vector<std::int64_t> running(37, 0);
  for (std::size_t i = 0; i < items.size(); ++i) {
    running[i % 37] += items[i].second;
    ASSERT_EQ(counts[i], running[i % 37]) << i;
  }
}

TEST_P(RedisCounterTest, ScriptCacheFlushIsRecovered) {
  auto c = counter();
  EXPECT_EQ(c->incr("k", 1), 1);
  rctest::run(*redis_, {"SCRIPT", "FLUSH"});
  EXPECT_EQ(c->incr("k", 1), 2);  // NOSCRIPT -> SCRIPT LOAD -> rerun, counted once
  EXPECT_EQ(c->get("k"), 2);
}

TEST_F(RedisTest, RequestIdDedup) {
  FixedWindowOptions o;
  o.prefix = prefix_;
  o.name = "pv";
  o.window_ms = kLongWindow;
  FixedWindowCounter c(redis_, o);
  EXPECT_EQ(c.incr("k", 1, "r1"), 1);
  EXPECT_EQ(c.incr("k", 1, "r1"), 1);
  EXPECT_EQ(c.incr("k", 1, "r2"), 2);
  const std::string rid = request_id_key(c.storage_key("k"), "r1");
  EXPECT_EQ(rctest::run(*redis_, {"GET", rid}).str, "1");
  EXPECT_GT(rctest::run(*redis_, {"PTTL", rid}).integer, 0);
  rctest::run(*redis_, {"SET", c.storage_key("j"), "junk"});
  rctest::error_of<ReplyError>([&] { c.incr("j", 1, "r3"); });
  EXPECT_EQ(rctest::run(*redis_, {"EXISTS", request_id_key(c.storage_key("j"), "r3")}).integer, 0);
}

TEST_F(RedisTest, LimiterAllOrNothingAndTtlRepair) {
  auto lim = make_limiter(redis_, "fixed-window", prefix_);
  const auto limits = parse_limits("2/400 days;3/401 days");
  EXPECT_TRUE(lim->hit(limits, "ip", 1).allowed);
  EXPECT_TRUE(lim->hit(limits, "ip", 1).allowed);
  const Decision d = lim->hit(limits, "ip", 1);
  EXPECT_FALSE(d.allowed);
  EXPECT_EQ(d.limit, 2);
  EXPECT_GT(d.retry_after_ms, 0);
  const auto stats = lim->stats(limits, "ip");
  EXPECT_EQ(stats[0].count, 2);
  EXPECT_EQ(stats[1].count, 2);  // the denied hit charged neither limit
  Reply keys = rctest::run(*redis_, {"KEYS", prefix_ + ":fw:{ip}:34560000000:*"});
  ASSERT_EQ(keys.elements.size(), 1u);
  const std::string key = keys.elements[0].str;
  rctest::run(*redis_, {"PERSIST", key});
  EXPECT_FALSE(lim->hit(limits, "ip", 1).allowed);
  EXPECT_GT(rctest::run(*redis_, {"PTTL", key}).integer, 0);
  EXPECT_EQ(rctest::run(*redis_, {"GET", key}).str, "2");
}

TEST_F(RedisTest, UnreachablePortIsAConnectionError) {
  StoreOptions o = parse_url("redis://127.0.0.1:1");  // nothing listens there
  o.connect_timeout = std::chrono::milliseconds(500);
  RedisStore nowhere(o);
  rctest::error_of<ConnectionError>([&] { rctest::run(nowhere, {"PING"}); });
}

}  // namespace

// On Redis >= 7.0 an increment without a request id is MULTI/INCRBY/PEXPIREAT LT/EXEC, not
// the script: the commands the server counted show which path ran, and the TTL guarantees
// (set on the first increment, restored after PERSIST, lowered from a foreign far-future
// expiry) must hold on it as they do on the script.
TEST_F(RedisTest, IncrementsWithoutIdsUseTheTransactionOnRedis7) {
  FixedWindowOptions o;
  o.prefix = prefix_;
  o.name = "tx";
  o.window_ms = 60'000;
  o.grace_ms = 1000;
  FixedWindowCounter c(redis_, o);
  c.incr("warm", 1);  // the first call sets the connection up (and learns the version)
  if (!redis_->has_expire_options()) GTEST_SKIP() << "the server is older than Redis 7.0";
  auto calls = [&](const std::string& cmd) -> std::int64_t {
    const std::string info = rctest::run(*redis_, {"INFO", "commandstats"}).str;
    const std::size_t at = info.find("cmdstat_" + cmd + ":calls=");
    return at == std::string::npos ? 0 : std::stoll(info.substr(at + 15 + cmd.size()));
  };
  rctest::run(*redis_, {"CONFIG", "RESETSTAT"});
  const std::string key = c.storage_key("k");
  const std::int64_t deadline = c.window("k").expire_at_ms;
  EXPECT_EQ(c.incr("k", 2), 2);
  EXPECT_EQ(rctest::run(*redis_, {"PEXPIRETIME", key}).as_integer(), deadline);
  rctest::run(*redis_, {"PERSIST", key});
  EXPECT_EQ(c.incr("k", 1), 3);
  EXPECT_EQ(rctest::run(*redis_, {"PEXPIRETIME", key}).as_integer(), deadline);
  rctest::run(*redis_, {"PEXPIRE", key, "1000000000000"});
  EXPECT_EQ(c.incr_many({{"k", 1}, {"other", 5}}), (std::vector<std::int64_t>{4, 5}));
  EXPECT_EQ(rctest::run(*redis_, {"PEXPIRETIME", key}).as_integer(), deadline);
  rctest::run(*redis_, {"SET", key, "junk"});
  EXPECT_EQ(rctest::error_of<ReplyError>([&] { c.incr("k", 1); }), "ERR value is not an integer or out of range");
  EXPECT_EQ(rctest::run(*redis_, {"GET", key}).str, "junk");
  EXPECT_EQ(rctest::run(*redis_, {"PEXPIRETIME", key}).as_integer(), deadline);  // healed, not counted
  EXPECT_EQ(calls("evalsha"), 0);
  EXPECT_EQ(calls("exec"), 4);
  EXPECT_EQ(c.incr("r", 1, "request-1"), 1);  // request ids keep the script
  EXPECT_EQ(c.incr("r", 1, "request-1"), 1);
  EXPECT_EQ(calls("evalsha"), 2);
}
