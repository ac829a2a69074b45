// What runs in front of a limiter's decisions (policies.h): allow and deny lists, the
// refusal cache on a ManualClock, penalty validation, and the Guard's operations on the
// memory store and (when REDCOUNT_TEST_REDIS_URL is set) on Redis.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <functional>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "redcount/common/clock.h"
#include "redcount/common/errors.h"
#include "redcount/common/keys.h"
#include "redcount/common/limit_string.h"
#include "redcount/common/options.h"
#include "redcount/limiters/limiter.h"
#include "redcount/limiters/policies.h"
#include "redcount/memory/memory_store.h"
#include "redcount/redis/redis_store.h"
#include "test_support.h"

using namespace redcount;
using rctest::contains;
using rctest::kT0;

namespace {

std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "<no error>";
}

Guard::Options options(std::vector<std::string> allow = {}, std::vector<std::string> deny = {},
                       std::size_t refusal_cache = 0, std::optional<PenaltyConfig> penalty = std::nullopt,
                       OnUnavailable on_unavailable = OnUnavailable::Raise) {
  Guard::Options o;
  o.allow = std::move(allow);
  o.deny = std::move(deny);
  o.refusal_cache = refusal_cache;
  o.penalty = penalty;
  o.on_unavailable = on_unavailable;
  return o;
}

// --- AccessLists ---------------------------------------------------------------------------

TEST(AccessLists, MatchesKeysExactlyAndAddressesByNetwork) {
  AccessLists lists({"user:admin", "10.0.0.0/8", "2001:db8::/32"}, {"user:bad", "203.0.113.0/24", "10.9.0.0/16"});
  EXPECT_EQ(lists.lookup("user:admin"), true);
  EXPECT_EQ(lists.lookup("user:bad"), false);
  EXPECT_EQ(lists.lookup("user:other"), std::nullopt);
  EXPECT_EQ(lists.lookup("10.1.2.3"), true);
  EXPECT_EQ(lists.lookup("ip:10.1.2.3"), true);           // "<prefix>:<address>"
  EXPECT_EQ(lists.lookup("10.9.1.1"), false);             // the longer prefix wins
  EXPECT_EQ(lists.lookup("203.0.113.9"), false);
  EXPECT_EQ(lists.lookup("198.51.100.1"), std::nullopt);
  EXPECT_EQ(lists.lookup("2001:db8::1"), true);           // IPv6, bare
  EXPECT_EQ(lists.lookup("ip:2001:db8:0:1::5"), true);    // IPv6 after a prefix
  EXPECT_EQ(lists.lookup("2001:db8:1::/64"), true);       // a network the web layer groups clients into
  EXPECT_EQ(lists.lookup("2001:db9::1"), std::nullopt);
  EXPECT_EQ(lists.lookup("::ffff:10.1.2.3"), std::nullopt);  // IPv6 never matches an IPv4 network
  EXPECT_EQ(lists.lookup("10.0.0.0/4"), std::nullopt);    // wider than the entry: not inside it
  EXPECT_EQ(lists.lookup("not-an-ip"), std::nullopt);
  EXPECT_EQ(lists.lookup("010.1.2.3"), std::nullopt);     // leading zeros are not an address
}

TEST(AccessLists, DenyWinsATieAndAnAddressIsAHostNetwork) {
  AccessLists lists({"k", "10.0.0.0/8", "192.0.2.7"}, {"k", "10.0.0.0/8"});
  EXPECT_EQ(lists.lookup("k"), false);
  EXPECT_EQ(lists.lookup("10.1.1.1"), false);
  EXPECT_EQ(lists.lookup("192.0.2.7"), true);
  EXPECT_EQ(lists.lookup("192.0.2.8"), std::nullopt);
  EXPECT_EQ(lists.network_count(), 2u);  // the allowed 10.0.0.0/8 was dropped: denied already
}

TEST(AccessLists, KeysThatAreNotUtf8MatchByteForByte) {
  const std::string raw = std::string("user:\xff\xfe", 7);
  AccessLists lists({"user:\xc3\xa9"}, {});
  EXPECT_EQ(lists.lookup("user:\xc3\xa9"), true);
  EXPECT_EQ(lists.lookup(raw), std::nullopt);  // no crash, no match
  AccessLists nets({"10.0.0.0/8"}, {});
  EXPECT_EQ(nets.lookup(raw), std::nullopt);
}

TEST(AccessLists, BadEntriesNameTheListAndTheEntry) {
  EXPECT_TRUE(contains(message_of([] { AccessLists({""}, {}); }), "allow: an empty entry"));
  EXPECT_TRUE(contains(message_of([] { AccessLists({}, {std::string("\xff", 1)}); }), "deny: entry"));
  EXPECT_TRUE(contains(message_of([] { AccessLists({}, {std::string("\xff", 1)}); }), "is not UTF-8"));
  EXPECT_TRUE(contains(message_of([] { AccessLists({"10.0.0.1/8"}, {}); }), "'10.0.0.1/8' is not a valid CIDR"));
  EXPECT_TRUE(contains(message_of([] { AccessLists({"10.0.0.0/33"}, {}); }), "is not a valid CIDR"));
  EXPECT_TRUE(contains(message_of([] { AccessLists({}, {"2001:db8::/129"}); }), "deny: entry"));
  // Not an address before the slash: a key like any other.
  AccessLists keys({"a/b"}, {});
  EXPECT_EQ(keys.lookup("a/b"), true);
}

// --- RefusalCache ----------------------------------------------------------------------------

Decision refusal(std::int64_t retry_ms, std::int64_t reset_ms, std::int64_t limit = 5) {
  Decision d;
  d.allowed = false;
  d.limit = limit;
  d.retry_after_ms = retry_ms;
  d.reset_after_ms = reset_ms;
  return d;
}

TEST(RefusalCache, RepeatsARefusalUntilItsRetryTimeByTheGivenClock) {
  auto clock = std::make_shared<ManualClock>(kT0);
  RefusalCache cache(10, [clock] { return clock->now_ms(); });
  cache.put("5/minute", "k", 2, refusal(3000, 10'000));
  EXPECT_FALSE(cache.get("5/minute", "k", 1));  // a smaller cost may fit
  auto d = cache.get("5/minute", "k", 2);
  ASSERT_TRUE(d);
  EXPECT_FALSE(d->allowed);
  EXPECT_EQ(d->limit, 5);
  EXPECT_EQ(d->retry_after_ms, 3000);
  EXPECT_EQ(d->reset_after_ms, 10'000);
  clock->advance(1000);
  d = cache.get("5/minute", "k", 3);
  ASSERT_TRUE(d);
  EXPECT_EQ(d->retry_after_ms, 2000);
  EXPECT_EQ(cache.hits(), 2u);
  EXPECT_FALSE(cache.get("6/minute", "k", 2));  // other limits: the entry goes
  EXPECT_EQ(cache.size(), 0u);
  cache.put("5/minute", "k", 1, refusal(3000, 10'000));
  clock->advance(3000);
  EXPECT_FALSE(cache.get("5/minute", "k", 1));  // expired
  EXPECT_EQ(cache.size(), 0u);
}

TEST(RefusalCache, KeepsOnlyRefusalsTheStoreMadeAndStaysBounded) {
  auto clock = std::make_shared<ManualClock>(kT0);
  RefusalCache cache(2, [clock] { return clock->now_ms(); });
  Decision allowed;
  allowed.allowed = true;
  cache.put("5/minute", "a", 1, allowed);
  Decision unavailable = refusal(1000, 1000);
  unavailable.unavailable = true;
  cache.put("5/minute", "a", 1, unavailable);
  cache.put("5/minute", "a", 1, refusal(0, 1000));
  EXPECT_EQ(cache.size(), 0u);
  cache.put("5/minute", "a", 1, refusal(1000, 1000));
  cache.put("5/minute", "b", 1, refusal(5000, 5000));
  cache.put("5/minute", "a", 1, refusal(1000, 1000));  // replaced in place: still the oldest
  cache.put("5/minute", "c", 1, refusal(5000, 5000));  // full: the oldest ("a") goes
  EXPECT_FALSE(cache.get("5/minute", "a", 1));
  EXPECT_TRUE(cache.get("5/minute", "b", 1));
  clock->advance(5000);                                // both expire...
  cache.put("5/minute", "d", 1, refusal(100, 100));    // ...and go first
  cache.put("5/minute", "e", 1, refusal(100, 100));
  EXPECT_TRUE(cache.get("5/minute", "d", 1));
  EXPECT_TRUE(cache.get("5/minute", "e", 1));
  cache.drop("d");
  EXPECT_FALSE(cache.get("5/minute", "d", 1));
  RefusalCache off(0, [clock] { return clock->now_ms(); });
  off.put("5/minute", "a", 1, refusal(1000, 1000));
  EXPECT_EQ(off.size(), 0u);
}

TEST(RefusalCache, ThreadsShareOneCache) {
  auto clock = std::make_shared<ManualClock>(kT0);
  RefusalCache cache(64, [clock] { return clock->now_ms(); });
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&cache, t] {
      for (int i = 0; i < 2000; ++i) {
        const std::string k = rctest::cat("k", (i * 7 + t) % 100);
        cache.put("5/minute", k, 1, refusal(1000, 1000));
        (void)cache.get("5/minute", k, 1);
        if (i % 5 == 0) cache.drop(k);
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_LE(cache.size(), 64u);
}

TEST(RefusalCache, StateKeysUnderATagAreApart) {
  EXPECT_EQ(refusal_state_key("k", ""), "k");
  EXPECT_EQ(refusal_state_key("k", "org"), "@{org}:k");
}

// --- PenaltyConfig ----------------------------------------------------------------------------

TEST(PenaltyConfig, OutOfRangeValuesNameTheFieldAndTheRange) {
  EXPECT_NO_THROW(PenaltyConfig::make(5, 60, 60, 2, 3600));
  EXPECT_NO_THROW(PenaltyConfig::make(1, 0.001, 1.0009, 1, 1.0005));  // 1000 ms each: equal is fine
  EXPECT_EQ(message_of([] { PenaltyConfig::make(0, 60, 60, 2, 3600); }),
            "Penalty(after=) must be an int >= 1 (refusals), got 0");
  EXPECT_EQ(message_of([] { PenaltyConfig::make(5, NAN, 60, 2, 3600); }),
            "Penalty(within=) must be a finite number, got nan");
  EXPECT_EQ(message_of([] { PenaltyConfig::make(5, 60, 60, 0.5, 3600); }),
            "Penalty(factor=) must be between 1 and 1,000,000 (1: every block as long), got 0.5");
  EXPECT_EQ(message_of([] { PenaltyConfig::make(5, 60, 60, 2e6, 3600); }),
            "Penalty(factor=) must be between 1 and 1,000,000 (1: every block as long), got 2000000.0");
  EXPECT_EQ(message_of([] { PenaltyConfig::make(5, 0.0005, 60, 2, 3600); }),
            "Penalty(within=) must be between 0.001 and 4398046511.104 seconds (1 ms to 2^42 ms, about 139 "
            "years), got 0.0005");
  EXPECT_TRUE(contains(message_of([] { PenaltyConfig::make(5, 60, -1, 2, 3600); }), "Penalty(block=)"));
  EXPECT_TRUE(contains(message_of([] { PenaltyConfig::make(5, 60, 60, 2, 4398046511.105); }), "Penalty(max_block=)"));
  EXPECT_EQ(message_of([] { PenaltyConfig::make(5, 60, 2, 2, 1.999); }),
            "Penalty(max_block=) must be >= block (2.0), got 1.999");
  EXPECT_EQ(PenaltyConfig::make(3, 1.5, 2, 1.5, 10).script_args(),
            (std::vector<std::string>{"3", "1500", "2000", "1.5", "10000"}));
}

// --- the Guard -----------------------------------------------------------------------------

class GuardTest : public ::testing::Test {
 protected:
  std::shared_ptr<ManualClock> clock_ = std::make_shared<ManualClock>(kT0);
  std::shared_ptr<MemoryStore> store_ = rctest::memory_store(clock_);
  std::unique_ptr<LimiterStrategy> lim_ = make_limiter(store_, "fixed-window", "rl");
  const std::vector<RateLimit> limits_ = parse_limits("2/minute");

  Guard guard(Guard::Options o) { return Guard(store_, "rl", std::move(o)); }
};

TEST_F(GuardTest, ListedKeysAreDecidedWithoutABatch) {
  Guard g = guard(options({"10.0.0.0/8"}, {"bad"}));
  auto op = g.make_hit(*lim_, limits_, "ip:10.1.2.3", 1);
  EXPECT_TRUE(op->prepare().empty());  // complete before it starts: no round trip
  EXPECT_TRUE(op->done());
  EXPECT_TRUE(op->result().allowed);
  EXPECT_EQ(op->result().remaining, 2);
  for (int i = 0; i < 5; ++i) EXPECT_TRUE(run(*store_, *g.make_hit(*lim_, limits_, "10.0.0.1", 1)).allowed);
  const Decision d = run(*store_, *g.make_test(*lim_, limits_, "bad", 1));
  EXPECT_FALSE(d.allowed);
  EXPECT_EQ(d.retry_after_ms, kDeniedRetryAfterMs);
  EXPECT_TRUE(rctest::keys(*store_).empty());
  // hit_all: a denied key refuses all; allowed keys are left out of the store's decision.
  const std::vector<KeyedLimits> items{{limits_, "10.0.0.1"}, {limits_, "user"}};
  EXPECT_TRUE(run(*store_, *g.make_hit_all(*lim_, items, 1)).allowed);
  EXPECT_EQ(lim_->stats(limits_, "user")[0].count, 1);
  EXPECT_EQ(lim_->stats(limits_, "10.0.0.1")[0].count, 0);
  EXPECT_FALSE(run(*store_, *g.make_hit_all(*lim_, {{limits_, "user"}, {limits_, "bad"}}, 1)).allowed);
  EXPECT_EQ(lim_->stats(limits_, "user")[0].count, 1);
  // Bad input is refused even for a listed key.
  EXPECT_THROW(g.make_hit(*lim_, limits_, "10.0.0.1", 0), InvalidArgument);
}

TEST_F(GuardTest, TheCacheRepeatsTheStoresRefusalUntilItsRetryTime) {
  Guard g = guard(options({}, {}, 100));
  EXPECT_TRUE(run(*store_, *g.make_hit(*lim_, limits_, "k", 1)).allowed);
  EXPECT_TRUE(run(*store_, *g.make_hit(*lim_, limits_, "k", 1)).allowed);
  const Decision refused = run(*store_, *g.make_hit(*lim_, limits_, "k", 1));
  EXPECT_FALSE(refused.allowed);
  auto op = g.make_hit(*lim_, limits_, "k", 1);
  EXPECT_TRUE(op->prepare().empty());
  EXPECT_EQ(op->result().retry_after_ms, refused.retry_after_ms);
  EXPECT_EQ(g.cache()->hits(), 1u);
  // Under a tag the state is another one: not answered from the untagged refusal.
  EXPECT_TRUE(run(*store_, *g.make_hit(*lim_, limits_, "k", 1, "t")).allowed);
  clock_->advance(refused.retry_after_ms);
  EXPECT_TRUE(run(*store_, *g.make_hit(*lim_, limits_, "k", 1)).allowed);
  // reset forgets the refusal.
  run(*store_, *g.make_hit(*lim_, limits_, "k", 1));
  EXPECT_FALSE(run(*store_, *g.make_hit(*lim_, limits_, "k", 1)).allowed);
  run(*store_, *g.make_reset(*lim_, limits_, "k"));
  EXPECT_TRUE(run(*store_, *g.make_hit(*lim_, limits_, "k", 1)).allowed);
  // hit_all files the refusing item's refusal.
  const std::vector<KeyedLimits> items{{parse_limits("100/minute"), "org"}, {limits_, "user"}};
  run(*store_, *g.make_hit_all(*lim_, items, 1));
  run(*store_, *g.make_hit_all(*lim_, items, 1));
  EXPECT_FALSE(run(*store_, *g.make_hit_all(*lim_, items, 1)).allowed);
  EXPECT_TRUE(g.make_hit_all(*lim_, items, 1)->prepare().empty());
  EXPECT_TRUE(g.make_hit(*lim_, limits_, "user", 1)->prepare().empty());
}

TEST_F(GuardTest, APenaltyBlocksAfterRepeatedRefusalsInTheDecisionsRoundTrip) {
  Guard g = guard(options({}, {}, 100, PenaltyConfig::make(2, 60, 30, 2, 3600)));
  const auto one = parse_limits("1/hour");
  EXPECT_TRUE(run(*store_, *g.make_hit(*lim_, one, "k", 1)).allowed);
  EXPECT_FALSE(run(*store_, *g.make_hit(*lim_, one, "k", 1)).allowed);  // counted: 1
  EXPECT_FALSE(g.make_hit(*lim_, one, "k", 1)->prepare().empty());     // a penalty's refusals are not cached
  const Decision blocked = run(*store_, *g.make_hit(*lim_, one, "k", 1));  // counted: 2, block starts
  EXPECT_FALSE(blocked.allowed);
  EXPECT_EQ(blocked.retry_after_ms, 30'000);
  EXPECT_EQ(rctest::run(*store_, {"PTTL", penalty_key("rl", "k", "b")}).integer, 30'000);
  // The block is cached: answered without a round trip.
  auto cached = g.make_test(*lim_, one, "k", 1);
  EXPECT_TRUE(cached->prepare().empty());
  EXPECT_EQ(cached->result().retry_after_ms, 30'000);
  // Without the cache, the gate in the script answers with the block's remainder.
  g.cache()->clear();
  clock_->advance(10'000);
  const Decision gated = run(*store_, *g.make_hit(*lim_, parse_limits("100/hour"), "k", 1));
  EXPECT_FALSE(gated.allowed);
  EXPECT_EQ(gated.retry_after_ms, 20'000);
  EXPECT_EQ(lim_->stats(parse_limits("100/hour"), "k")[0].count, 1);  // the first hit only
  // penalty=False for this call: no gate.
  EXPECT_TRUE(run(*store_, *g.make_hit(*lim_, parse_limits("100/hour"), "k", 1, {}, CallPenalty::off())).allowed);
  // A tagged call checks the block with a PTTL of its own.
  g.cache()->clear();
  const Decision tagged = run(*store_, *g.make_hit(*lim_, parse_limits("100/hour"), "k", 1, "t"));
  EXPECT_FALSE(tagged.allowed);
  EXPECT_EQ(tagged.retry_after_ms, 20'000);
  // hit_all: blocked while any key is.
  const std::vector<KeyedLimits> items{{parse_limits("100/hour"), "other"}, {parse_limits("100/hour"), "k"}};
  EXPECT_FALSE(run(*store_, *g.make_hit_all(*lim_, items, 1)).allowed);
  EXPECT_EQ(lim_->stats(parse_limits("100/hour"), "other")[0].count, 0);
  clock_->advance(20'000);
  EXPECT_TRUE(run(*store_, *g.make_hit_all(*lim_, items, 1)).allowed);
}

TEST_F(GuardTest, ACallsOwnPenaltyCountsUnderTheLimitersPrefix) {
  Guard g = guard(options());
  EXPECT_FALSE(g.active());
  const auto one = parse_limits("1/hour");
  const CallPenalty p = CallPenalty::of(PenaltyConfig::make(1, 60, 5, 2, 60));
  EXPECT_TRUE(run(*store_, *g.make_hit(*lim_, one, "k", 1, {}, p)).allowed);
  EXPECT_FALSE(run(*store_, *g.make_test(*lim_, one, "k", 1, {}, p)).allowed);  // test never counts
  EXPECT_EQ(rctest::run(*store_, {"EXISTS", penalty_key("rl", "k", "b")}).integer, 0);
  const Decision d = run(*store_, *g.make_hit(*lim_, one, "k", 1, {}, p));
  EXPECT_EQ(d.retry_after_ms, 5000);
  // hit_all counts the refusing key.
  const std::vector<KeyedLimits> items{{parse_limits("100/hour"), "org"}, {one, "u"}};
  EXPECT_TRUE(run(*store_, *g.make_hit_all(*lim_, items, 1, {}, p)).allowed);
  EXPECT_EQ(run(*store_, *g.make_hit_all(*lim_, items, 1, {}, p)).retry_after_ms, 5000);
  EXPECT_EQ(rctest::run(*store_, {"PTTL", penalty_key("rl", "u", "b")}).integer, 5000);
  EXPECT_EQ(rctest::run(*store_, {"EXISTS", penalty_key("rl", "org", "b")}).integer, 0);
}

// A store whose every batch fails in transport: on_unavailable decides.
class DeadStore final : public Store {
 public:
  explicit DeadStore(std::shared_ptr<MemoryStore> inner) : inner_(std::move(inner)) {}
  std::vector<Reply> execute(const std::vector<Request>&) override { throw ConnectionError("down (simulated)"); }
  // A cluster that cannot be reached cannot list its nodes either.
  std::vector<std::shared_ptr<Store>> nodes() override { throw ConnectionError("down (simulated)"); }
  std::int64_t now_ms() const override { return inner_->now_ms(); }
  std::string describe() const override { return "dead"; }
  bool is_memory() const noexcept override { return false; }
  void close() override { inner_->close(); }

 private:
  std::shared_ptr<MemoryStore> inner_;
};

TEST_F(GuardTest, OnUnavailableDecidesWhenTheStoreFails) {
  auto dead = std::make_shared<DeadStore>(store_);
  auto lim = make_limiter(dead, "fixed-window", "rl");
  Guard raise(dead, "rl", options({}, {}, 10));
  EXPECT_THROW(run(*dead, *raise.make_hit(*lim, limits_, "k", 1)), ConnectionError);
  Guard allow(dead, "rl", options({}, {}, 0, PenaltyConfig{}, OnUnavailable::Allow));
  Decision d = run(*dead, *allow.make_hit(*lim, limits_, "k", 1));
  EXPECT_TRUE(d.allowed);
  EXPECT_TRUE(d.unavailable);
  Guard deny(dead, "rl", options({}, {}, 10, std::nullopt, OnUnavailable::Deny));
  d = run(*dead, *deny.make_hit_all(*lim, {{limits_, "a"}, {limits_, "b"}}, 1));
  EXPECT_FALSE(d.allowed);
  EXPECT_TRUE(d.unavailable);
  EXPECT_EQ(d.retry_after_ms, kUnavailableRetryAfterMs);
  EXPECT_EQ(deny.cache()->size(), 0u);  // not a refusal the store made
  // hit_all under a penalty on a store that cannot list its nodes: the block check is a
  // batch of its own, whose failure is no block; the decision's failure is on_unavailable.
  d = run(*dead, *allow.make_hit_all(*lim, {{limits_, "a"}, {limits_, "b"}}, 1));
  EXPECT_TRUE(d.allowed && d.unavailable);
  // A tagged call under a penalty: the PTTL's failure is no block; the decision's is on_unavailable.
  d = run(*dead, *allow.make_hit(*lim, limits_, "k", 1, "t"));
  EXPECT_TRUE(d.allowed && d.unavailable);
}

// The same guarded calls against a real server.
class GuardRedisTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* url = std::getenv("REDCOUNT_TEST_REDIS_URL");
    if (url == nullptr || *url == '\0') GTEST_SKIP() << "REDCOUNT_TEST_REDIS_URL is not set";
    redis_ = std::make_shared<RedisStore>(parse_url(url));
    rctest::run(*redis_, {"DEL", penalty_key("rlg", "k", "b"), penalty_key("rlg", "k", "n"),
                          penalty_key("rlg", "k", "l")});
  }
  void TearDown() override {
    if (redis_) redis_->close();
  }
  std::shared_ptr<RedisStore> redis_;
};

TEST_F(GuardRedisTest, ListsCacheAndPenaltyOnRedis) {
  auto lim = make_limiter(redis_, "gcra", "rlg");
  const auto one = parse_limits("1/hour");
  lim->reset(one, "k");
  Guard g(redis_, "rlg", options({}, {"203.0.113.0/24"}, 10, PenaltyConfig::make(2, 60, 30, 2, 3600)));
  EXPECT_FALSE(run(*redis_, *g.make_hit(*lim, one, "203.0.113.5", 1)).allowed);
  EXPECT_TRUE(run(*redis_, *g.make_hit(*lim, one, "k", 1)).allowed);
  EXPECT_FALSE(run(*redis_, *g.make_hit(*lim, one, "k", 1)).allowed);
  const Decision blocked = run(*redis_, *g.make_hit(*lim, one, "k", 1));
  EXPECT_FALSE(blocked.allowed);
  EXPECT_GT(blocked.retry_after_ms, 0);
  EXPECT_LE(blocked.retry_after_ms, 30'000);
  EXPECT_TRUE(g.make_hit(*lim, one, "k", 1)->prepare().empty());  // the block is cached
  g.cache()->clear();
  const Decision gated = run(*redis_, *g.make_hit(*lim, parse_limits("100/hour"), "k", 1));
  EXPECT_FALSE(gated.allowed);
  EXPECT_GT(gated.retry_after_ms, 0);
  EXPECT_LE(gated.retry_after_ms, 30'000);
  // Asynchronously: the same operation through run_async.
  g.cache()->clear();
  std::promise<Decision> got;
  auto op = g.make_test(*lim, parse_limits("100/hour"), "k", 1);
  run_async(redis_, op, [&got, op](std::exception_ptr e) {
    if (e) got.set_exception(e);
    else got.set_value(op->take());
  });
  const Decision async = got.get_future().get();
  EXPECT_FALSE(async.allowed);
  EXPECT_GT(async.retry_after_ms, 0);
  lim->reset(one, "k");
  lim->reset(parse_limits("100/hour"), "k");
}

}  // namespace
