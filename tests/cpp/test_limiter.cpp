// The fixed-window limiter (limiter.h) on a MemoryStore with a ManualClock.
#include <gtest/gtest.h>

#include <atomic>
#include <limits>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "redcount/common/clock.h"
#include "redcount/common/errors.h"
#include "redcount/limiters/limiter.h"
#include "redcount/common/limit_string.h"
#include "redcount/memory/memory_store.h"
#include "redcount/common/window.h"
#include "test_support.h"

using namespace redcount;
using rctest::contains;
using rctest::kT0;

namespace {

// Limiter keys expire one second after their window ends (docs/fixed-windows.md: "Exactly what is
// written to Redis"), so clients whose clocks lag a little still see the window's count.
constexpr std::int64_t kLimiterGrace = 1'000;

class LimiterTest : public ::testing::Test {
 protected:
  std::shared_ptr<ManualClock> clock_ = std::make_shared<ManualClock>(kT0);
  std::shared_ptr<MemoryStore> store_ = rctest::memory_store(clock_);
  std::unique_ptr<LimiterStrategy> lim_ = make_limiter(store_, "fixed-window", "rl");

  Reply cmd(std::vector<std::string> args) { return rctest::run(*store_, std::move(args)); }
  // The storage key of `limit` for `key` in the window containing now.
  std::string key_of(const RateLimit& limit, const std::string& key) const {
    const std::int64_t index = locate(WindowSpec{limit.window_ms, 0, false}, key, clock_->now_ms()).index;
    return window_key("rl", "fw", key, limit.window_ms, index);
  }
  std::string count_at(const std::string& storage_key) {
    return cmd({"GET", storage_key}).as_string().value_or("<absent>");
  }
  Decision hit(const std::string& limits, const std::string& key = "ip:1", std::int64_t cost = 1) {
    return lim_->hit(parse_limits(limits), key, cost);
  }
};

TEST_F(LimiterTest, Names) {
  EXPECT_EQ(lim_->name(), "fixed-window");
  EXPECT_EQ(limiter_strategies(), (std::vector<std::string>{"fixed-window", "sliding-window", "sliding-window-approx",
                                                             "token-bucket", "gcra", "concurrency"}));
}

TEST_F(LimiterTest, AllowsUpToTheLimitThenDenies) {
  clock_->set(kT0 + 10'000);
  for (std::int64_t i = 1; i <= 3; ++i) {
    const Decision d = hit("3/minute");
    EXPECT_TRUE(d.allowed) << i;
    EXPECT_EQ(d.limit, 3);
    EXPECT_EQ(d.remaining, 3 - i);
    EXPECT_EQ(d.reset_after_ms, 50'000);
    EXPECT_EQ(d.retry_after_ms, 0);
  }
  const Decision d = hit("3/minute");
  EXPECT_FALSE(d.allowed);
  EXPECT_EQ(d.limit, 3);
  EXPECT_EQ(d.remaining, 0);
  EXPECT_EQ(d.reset_after_ms, 50'000);
  EXPECT_EQ(d.retry_after_ms, 50'000);
  EXPECT_EQ(count_at(key_of(parse_limits("3/minute")[0], "ip:1")), "3");
  EXPECT_TRUE(hit("3/minute", "ip:2").allowed);  // other keys are independent
}

TEST_F(LimiterTest, StorageKeyLayoutAndTtl) {
  clock_->set(kT0 + 10'000);
  hit("5/minute", "user:42");
  const std::string key = rctest::cat("rl:fw:{user:42}:60000:", kT0 / 60'000);
  EXPECT_EQ(rctest::keys(*store_), std::vector<std::string>{key});
  EXPECT_EQ(cmd({"PTTL", key}).integer, 60'000 - 10'000 + kLimiterGrace);
  clock_->set(kT0 + 20'000);
  hit("5/minute", "user:42");
  EXPECT_EQ(cmd({"PTTL", key}).integer, 60'000 - 20'000 + kLimiterGrace);  // the deadline does not move
}

TEST_F(LimiterTest, DeniedHitStoresNothing) {
  for (int i = 0; i < 2; ++i) ASSERT_TRUE(hit("2/minute").allowed);
  const rctest::Snapshot before = rctest::snapshot(*store_);
  for (int i = 0; i < 10; ++i) {
    clock_->advance(1'000);
    EXPECT_FALSE(hit("2/minute").allowed);
    EXPECT_FALSE(hit("2/minute", "ip:1", 2).allowed);
  }
  clock_->set(kT0);  // compare the TTLs at the same instant
  EXPECT_EQ(rctest::snapshot(*store_), before);
}

TEST_F(LimiterTest, CostIsChargedWhole) {
  clock_->set(kT0 + 30'000);
  Decision d = hit("5/minute", "k", 3);
  EXPECT_TRUE(d.allowed);
  EXPECT_EQ(d.remaining, 2);
  d = hit("5/minute", "k", 3);
  EXPECT_FALSE(d.allowed);
  EXPECT_EQ(d.remaining, 2);
  EXPECT_EQ(d.retry_after_ms, 30'000);
  d = hit("5/minute", "k", 2);
  EXPECT_TRUE(d.allowed);
  EXPECT_EQ(d.remaining, 0);
  EXPECT_EQ(count_at(key_of(parse_limits("5/minute")[0], "k")), "5");
}

TEST_F(LimiterTest, MultipleLimitsAreAllOrNothing) {
  const auto limits = parse_limits("2/second;3/minute");
  auto sec = [&] { return count_at(key_of(limits[0], "ip:1")); };
  auto min = [&] { return count_at(key_of(limits[1], "ip:1")); };
  EXPECT_TRUE(lim_->hit(limits, "ip:1", 1).allowed);
  clock_->set(kT0 + 1);
  Decision d = lim_->hit(limits, "ip:1", 1);
  EXPECT_TRUE(d.allowed);
  EXPECT_EQ(d.remaining, 0);
  clock_->set(kT0 + 2);
  d = lim_->hit(limits, "ip:1", 1);  // the per-second limit refuses
  EXPECT_FALSE(d.allowed);
  EXPECT_EQ(d.limit, 2);
  EXPECT_EQ(d.retry_after_ms, 998);
  EXPECT_EQ(sec(), "2");
  EXPECT_EQ(min(), "2");  // not charged either
  clock_->set(kT0 + 1'000);
  d = lim_->hit(limits, "ip:1", 1);
  EXPECT_TRUE(d.allowed);
  EXPECT_EQ(sec(), "1");
  EXPECT_EQ(min(), "3");
  clock_->set(kT0 + 1'001);
  d = lim_->hit(limits, "ip:1", 1);  // the per-minute limit refuses; the second is not charged
  EXPECT_FALSE(d.allowed);
  EXPECT_EQ(d.limit, 3);
  EXPECT_EQ(d.retry_after_ms, 60'000 - 1'001);
  EXPECT_EQ(d.reset_after_ms, 60'000 - 1'001);
  EXPECT_EQ(sec(), "1");
  EXPECT_EQ(min(), "3");
  clock_->set(kT0 + 2'000);
  EXPECT_FALSE(lim_->hit(limits, "ip:1", 1).allowed);
  EXPECT_EQ(sec(), "<absent>");  // a denied hit does not even create the new second's key
  EXPECT_EQ(rctest::keys(*store_).size(), 2u);  // the minute key and last second's key (in its grace)
}

TEST_F(LimiterTest, RetryAfterIsTheLongestWaitAmongRefusingLimits) {
  const auto limits = parse_limits("1/second;2/minute");
  clock_->set(kT0 + 500);
  EXPECT_TRUE(lim_->hit(limits, "k", 1).allowed);
  clock_->set(kT0 + 600);
  Decision d = lim_->hit(limits, "k", 1);  // refused by the second only
  EXPECT_FALSE(d.allowed);
  EXPECT_EQ(d.retry_after_ms, 400);
  EXPECT_EQ(d.limit, 1);
  EXPECT_EQ(d.reset_after_ms, 400);
  clock_->set(kT0 + 1'000);
  EXPECT_TRUE(lim_->hit(limits, "k", 1).allowed);
  clock_->set(kT0 + 1'100);
  d = lim_->hit(limits, "k", 1);  // refused by both: wait for the minute
  EXPECT_FALSE(d.allowed);
  EXPECT_EQ(d.retry_after_ms, 58'900);
  EXPECT_EQ(d.limit, 2);
  EXPECT_EQ(d.reset_after_ms, 58'900);
  EXPECT_EQ(d.remaining, 0);
}

TEST_F(LimiterTest, AllowedDecisionReportsTheBindingLimit) {
  clock_->set(kT0 + 250);
  // Equal remaining: the limit whose window ends later binds.
  Decision d = hit("10/second;10/minute");
  EXPECT_TRUE(d.allowed);
  EXPECT_EQ(d.remaining, 9);
  EXPECT_EQ(d.reset_after_ms, 60'000 - 250);
  // The tighter limit binds.
  d = hit("3/second;100/minute", "other");
  EXPECT_EQ(d.limit, 3);
  EXPECT_EQ(d.remaining, 2);
  EXPECT_EQ(d.reset_after_ms, 750);
}

TEST_F(LimiterTest, WindowTurnoverAllowsAgain) {
  for (int i = 0; i < 2; ++i) ASSERT_TRUE(hit("2/minute").allowed);
  clock_->set(kT0 + 59'999);
  EXPECT_FALSE(hit("2/minute").allowed);
  clock_->set(kT0 + 60'000);
  const Decision d = hit("2/minute");
  EXPECT_TRUE(d.allowed);
  EXPECT_EQ(d.remaining, 1);
}

TEST_F(LimiterTest, CostOutOfRangeThrowsAndStoresNothing) {
  const std::string big = rctest::error_of<InvalidArgument>([&] { hit("5/minute", "k", 6); });
  EXPECT_TRUE(contains(big, "5/minute")) << big;
  rctest::error_of<InvalidArgument>([&] { hit("5/minute", "k", 0); });
  rctest::error_of<InvalidArgument>([&] { hit("5/minute", "k", -1); });
  rctest::error_of<InvalidArgument>([&] { hit("2/second;10/minute", "k", 3); });  // above the smallest
  rctest::error_of<InvalidArgument>([&] { lim_->test(parse_limits("5/minute"), "k", 6); });
  rctest::error_of<InvalidArgument>([&] { validate_cost(parse_limits("1/second"), 2); });
  validate_cost(parse_limits("5/second"), 5);
  EXPECT_TRUE(hit("5/minute", "k", 5).allowed);  // cost == limit is fine
  EXPECT_EQ(cmd({"DBSIZE"}).integer, 1);
}

TEST_F(LimiterTest, BadKeyOrNoLimitsThrow) {
  rctest::error_of<InvalidArgument>([&] { hit("5/minute", ""); });
  rctest::error_of<InvalidArgument>([&] { hit("5/minute", "\xFF"); });
  rctest::error_of<InvalidArgument>([&] { lim_->hit({}, "k", 1); });
  EXPECT_EQ(cmd({"DBSIZE"}).integer, 0);
}

TEST(LimiterFactory, UnknownStrategyAndBadArgumentsThrow) {
  auto store = rctest::memory_store(std::make_shared<ManualClock>(kT0));
  const std::string msg = rctest::error_of<InvalidArgument>([&] { make_limiter(store, "sliding-log", "rl"); });
  EXPECT_TRUE(contains(msg, "'sliding-log'")) << msg;
  EXPECT_TRUE(contains(msg, "fixed-window")) << msg;
  rctest::error_of<InvalidArgument>([&] { make_limiter(store, "", "rl"); });
  rctest::error_of<InvalidArgument>([&] { make_limiter(nullptr, "fixed-window", "rl"); });
  rctest::error_of<InvalidArgument>([&] { make_limiter(store, "fixed-window", "r{l}"); });
  rctest::error_of<InvalidArgument>([&] { make_limiter(store, "fixed-window", ""); });
}

TEST_F(LimiterTest, TtlIsRepairedOnADeniedKeyThatLostIt) {
  clock_->set(kT0 + 5'000);
  for (int i = 0; i < 2; ++i) ASSERT_TRUE(hit("2/minute").allowed);
  const std::string key = key_of(parse_limits("2/minute")[0], "ip:1");
  EXPECT_EQ(cmd({"PERSIST", key}).integer, 1);
  clock_->set(kT0 + 20'000);
  EXPECT_FALSE(hit("2/minute").allowed);
  EXPECT_EQ(cmd({"PTTL", key}).integer, 60'000 - 20'000 + kLimiterGrace);
  EXPECT_EQ(count_at(key), "2");
}

TEST_F(LimiterTest, TtlIsRepairedOnAnAllowedKeyThatLostIt) {
  clock_->set(kT0 + 5'000);
  const std::string key = key_of(parse_limits("5/minute")[0], "ip:1");
  cmd({"SET", key, "1"});  // a foreign write without TTL
  const Decision d = hit("5/minute");
  EXPECT_TRUE(d.allowed);
  EXPECT_EQ(d.remaining, 3);
  EXPECT_EQ(cmd({"PTTL", key}).integer, 60'000 - 5'000 + kLimiterGrace);
}

TEST_F(LimiterTest, TestChargesNothing) {
  const auto limits = parse_limits("2/minute");
  clock_->set(kT0 + 10'000);
  Decision d = lim_->test(limits, "k", 1);
  EXPECT_TRUE(d.allowed);
  EXPECT_EQ(d.remaining, 2);
  EXPECT_EQ(cmd({"DBSIZE"}).integer, 0);
  lim_->hit(limits, "k", 1);
  lim_->hit(limits, "k", 1);
  d = lim_->test(limits, "k", 1);
  EXPECT_FALSE(d.allowed);
  EXPECT_EQ(d.retry_after_ms, 50'000);
  EXPECT_EQ(count_at(key_of(limits[0], "k")), "2");
}

TEST_F(LimiterTest, StatsAndReset) {
  const auto limits = parse_limits("5/second;10/minute");
  clock_->set(kT0 + 400);
  lim_->hit(limits, "k", 2);
  auto s = lim_->stats(limits, "k");
  ASSERT_EQ(s.size(), 2u);
  EXPECT_EQ(s[0].count, 2);
  EXPECT_EQ(s[0].remaining, 3);
  EXPECT_EQ(s[0].reset_after_ms, 600);
  EXPECT_EQ(s[1].count, 2);
  EXPECT_EQ(s[1].remaining, 8);
  EXPECT_EQ(s[1].reset_after_ms, 59'600);
  EXPECT_EQ(s[1].limit.amount, 10);
  lim_->reset(limits, "k");
  EXPECT_EQ(cmd({"DBSIZE"}).integer, 0);
  s = lim_->stats(limits, "k");
  EXPECT_EQ(s[0].count, 0);
  EXPECT_EQ(s[1].remaining, 10);
}

// A foreign value that is no count is garbage: reads see nothing, the next
// hit deletes it and starts the window afresh, with its deadline.
TEST_F(LimiterTest, NonIntegerValueIsGarbageAndStartsAfresh) {
  const auto limits = parse_limits("5/minute");
  const std::string key = key_of(limits[0], "k");
  for (const auto& foreign : std::vector<std::vector<std::string>>{{"SET", key, "junk"}, {"HSET", key, "f", "v"}}) {
    cmd({"DEL", key});
    cmd(foreign);
    EXPECT_EQ(lim_->test(limits, "k", 1).remaining, 5);
    EXPECT_EQ(lim_->stats(limits, "k")[0].count, 0);
    EXPECT_EQ(lim_->hit(limits, "k", 1).remaining, 4);
    EXPECT_EQ(cmd({"GET", key}).str, "1");
    EXPECT_GT(cmd({"PTTL", key}).integer, 0);
  }
}

TEST_F(LimiterTest, ExtremeForeignCountsDoNotOverflow) {
  const auto limits = parse_limits("5/minute");
  const std::string key = key_of(limits[0], "k");
  const std::string max = std::to_string(std::numeric_limits<std::int64_t>::max());
  cmd({"SET", key, max});
  Decision d = lim_->hit(limits, "k", 1);
  EXPECT_FALSE(d.allowed);
  EXPECT_EQ(d.remaining, 0);
  EXPECT_EQ(d.retry_after_ms, 60'000);
  EXPECT_EQ(count_at(key), max);
  d = lim_->test(limits, "k", 5);
  EXPECT_FALSE(d.allowed);
  EXPECT_EQ(lim_->stats(limits, "k")[0].remaining, 0);
  // A hugely negative foreign count allows, and nothing overflows while deciding.
  cmd({"SET", key, std::to_string(std::numeric_limits<std::int64_t>::min())});
  d = lim_->hit(limits, "k", 1);
  EXPECT_TRUE(d.allowed);
  EXPECT_GE(d.remaining, 5);
  EXPECT_EQ(count_at(key), std::to_string(std::numeric_limits<std::int64_t>::min() + 1));
  EXPECT_GE(lim_->stats(limits, "k")[0].remaining, 5);
  EXPECT_TRUE(lim_->test(limits, "k", 5).allowed);
}

TEST_F(LimiterTest, ConcurrentHitsNeverExceedTheLimit) {
  const auto limits = parse_limits("100/minute");
  std::atomic<int> allowed{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 60; ++i) allowed += lim_->hit(limits, "shared", 1).allowed ? 1 : 0;
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(allowed.load(), 100);
  EXPECT_EQ(count_at(key_of(limits[0], "shared")), "100");
}

}  // namespace
