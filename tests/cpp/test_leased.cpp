// Leased limits (leased.h) on a MemoryStore with a ManualClock: what a lease charges, local
// admissions, threads admitting exactly the limit, units given back, window rollover.
#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "redcount/common/clock.h"
#include "redcount/common/errors.h"
#include "redcount/common/limit_string.h"
#include "redcount/limiters/leased.h"
#include "redcount/limiters/limiter.h"
#include "redcount/memory/memory_store.h"
#include "test_support.h"

using namespace redcount;
using rctest::kT0;

namespace {

class LeasedTest : public ::testing::Test {
 protected:
  std::shared_ptr<ManualClock> clock_ = std::make_shared<ManualClock>(kT0);
  std::shared_ptr<MemoryStore> store_ = rctest::memory_store(clock_);
  std::unique_ptr<LimiterStrategy> lim_ = make_limiter(store_, "fixed-window", "rl");
  std::shared_ptr<LeaseTable> leases_ = LeaseTable::create(*lim_);

  std::int64_t count(const std::vector<RateLimit>& limits, const std::string& key) {
    return lim_->stats(limits, key).front().count;
  }
  Decision hit(const std::vector<RateLimit>& limits, const std::string& key, std::int64_t cost, std::int64_t units) {
    if (auto d = leases_->admit_local(limits, key, cost)) return *d;
    return leases_->hit(limits, key, cost, units);
  }
};

TEST_F(LeasedTest, ALeaseChargesHalfOfWhatIsLeftAtMostAndAdmitsLocally) {
  const auto limits = parse_limits("100/hour");
  Decision d = hit(limits, "k", 1, 10);
  EXPECT_TRUE(d.allowed);
  EXPECT_EQ(count(limits, "k"), 10);
  EXPECT_EQ(leases_->held(), 9);
  EXPECT_EQ(d.remaining, 90 + 9);
  for (int i = 0; i < 9; ++i) {
    auto local = leases_->admit_local(limits, "k", 1);
    ASSERT_TRUE(local.has_value());
    EXPECT_TRUE(local->allowed);
  }
  EXPECT_FALSE(leases_->admit_local(limits, "k", 1).has_value());  // used up: the next one asks
  EXPECT_EQ(count(limits, "k"), 10);
}

TEST_F(LeasedTest, LeasesShrinkAndTheLastUnitsAreExact) {
  const auto limits = parse_limits("10/hour");
  int admitted = 0;
  while (hit(limits, "k", 1, 100).allowed) ++admitted;
  EXPECT_EQ(admitted, 10);
  Decision no = hit(limits, "k", 1, 100);
  EXPECT_FALSE(no.allowed);
  EXPECT_GT(no.retry_after_ms, 0);
  EXPECT_EQ(no.remaining, 0);
}

TEST_F(LeasedTest, ThreadsAdmitExactlyTheLimit) {
  const auto limits = parse_limits("5000/hour");
  std::atomic<int> admitted{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&] {
      while (hit(limits, "hot", 1, 64).allowed) admitted.fetch_add(1);
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(admitted.load(), 5000);
  EXPECT_EQ(count(limits, "hot"), 5000);
  EXPECT_EQ(leases_->held(), 0);
}

TEST_F(LeasedTest, GiveBacksAndTheSweeperRaceWithAdmissionsAndNeverOverAdmit) {
  // Real time on this store's clock: the sweeper gives back what a 1 ms ttl leaves, while
  // threads take leases and another thread gives everything back, over and over.
  auto real = rctest::memory_store(std::make_shared<SystemClock>());
  auto lim = make_limiter(real, "fixed-window", "rl");
  auto table = LeaseTable::create(*lim);
  table->set_ttl_ms(1);
  const auto limits = parse_limits("3000/hour");
  std::atomic<int> admitted{0};
  std::atomic<bool> done{false};
  std::vector<std::thread> threads;
  for (int t = 0; t < 6; ++t) {
    threads.emplace_back([&] {
      for (;;) {
        auto d = table->admit_local(limits, "hot", 1);
        const bool ok = d ? d->allowed : table->hit(limits, "hot", 1, 16).allowed;
        if (!ok) return;
        admitted.fetch_add(1);
      }
    });
  }
  std::thread giver([&] {
    while (!done.load()) table->give_back_all();
  });
  for (auto& t : threads) t.join();
  done.store(true);
  giver.join();
  table->give_back_all();
  EXPECT_LE(admitted.load(), 3000);
  EXPECT_EQ(lim->stats(limits, "hot").front().count, admitted.load());
}

TEST_F(LeasedTest, UnusedUnitsGoBackWhileTheWindowLasts) {
  const auto limits = parse_limits("100/minute");
  ASSERT_TRUE(hit(limits, "k", 1, 20).allowed);
  EXPECT_EQ(count(limits, "k"), 20);
  EXPECT_EQ(leases_->give_back_all(), 19);
  EXPECT_EQ(count(limits, "k"), 1);
  ASSERT_TRUE(hit(limits, "k", 1, 20).allowed);
  clock_->advance(60'000);  // the window ended: nothing to give back
  EXPECT_EQ(leases_->give_back_all(), 0);
}

TEST_F(LeasedTest, TheTtlSendsUnitsBackAtTheNextCall) {
  leases_->set_ttl_ms(1'000);
  const auto limits = parse_limits("100/hour");
  ASSERT_TRUE(hit(limits, "a", 1, 10).allowed);
  clock_->advance(1'500);
  EXPECT_FALSE(leases_->admit_local(limits, "a", 1).has_value());
  ASSERT_TRUE(hit(limits, "b", 1, 10).allowed);
  EXPECT_EQ(count(limits, "a"), 1);
}

TEST_F(LeasedTest, OtherStrategiesRefuseLeases) {
  auto sliding = make_limiter(store_, "concurrency", "rl");
  auto table = LeaseTable::create(*sliding);
  EXPECT_THROW(table->hit(parse_limits("10/minute"), "k", 1, 5), InvalidArgument);
  EXPECT_THROW(leases_->check(0), InvalidArgument);
  EXPECT_THROW(leases_->set_ttl_ms(0), InvalidArgument);
  EXPECT_NO_THROW(leases_->check(5));
  EXPECT_EQ(lease_refusal("fixed-window"), nullptr);
  EXPECT_EQ(lease_refusal("sliding-window-approx"), nullptr);
  EXPECT_EQ(lease_refusal("token-bucket"), nullptr);
  EXPECT_EQ(lease_refusal("gcra"), nullptr);
  EXPECT_EQ(lease_refusal("sliding-window"), nullptr);
  for (const char* strategy : {"concurrency"}) {
    ASSERT_NE(lease_refusal(strategy), nullptr) << strategy;
    auto other = make_limiter(store_, strategy, "rl");
    auto t = LeaseTable::create(*other);
    try {
      t->check(5);
      ADD_FAILURE() << strategy << " leases";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(lease_refusal(strategy)), std::string::npos) << e.what();
    }
  }
}

TEST_F(LeasedTest, TheApproximateSlidingWindowLeasesItsCurrentSubBucket) {
  LimiterOptions o;
  o.prefix = "rl";
  o.sub_buckets = 6;  // 10 s sub-buckets of a minute
  auto approx = make_limiter(store_, "sliding-window-approx", o);
  auto table = LeaseTable::create(*approx);
  const auto limits = parse_limits("100/minute");
  auto stats = [&] { return approx->stats(limits, "k").front().count; };
  clock_->set(kT0 / 60'000 * 60'000 + 60'000);  // the start of a minute (and of a sub-bucket)
  Decision d = table->hit(limits, "k", 1, 10);
  EXPECT_TRUE(d.allowed);
  EXPECT_EQ(stats(), 10);
  EXPECT_EQ(table->held(), 9);
  EXPECT_EQ(d.reset_after_ms, 10'000);  // the lease ends with the sub-bucket
  for (int i = 0; i < 9; ++i) EXPECT_TRUE(table->admit_local(limits, "k", 1).has_value());
  EXPECT_FALSE(table->admit_local(limits, "k", 1).has_value());
  ASSERT_TRUE(table->hit(limits, "k", 1, 10).allowed);
  clock_->advance(10'000);  // the next sub-bucket: the lease admits nothing more
  EXPECT_FALSE(table->admit_local(limits, "k", 1).has_value());
  EXPECT_EQ(table->give_back_all(), 9);  // to the sub-bucket they were charged to
  EXPECT_EQ(stats(), 11);
  int admitted = 11;
  while (table->hit(limits, "k", 1, 10).allowed) ++admitted;
  EXPECT_EQ(admitted, 100);
  EXPECT_EQ(stats(), 100);
}

TEST_F(LeasedTest, ABucketsLeaseLosesUnitsAsTheBucketRefills) {
  for (const char* strategy : {"token-bucket", "gcra"}) {
    auto bucket = make_limiter(store_, strategy, std::string("rl:") + strategy);
    auto table = LeaseTable::create(*bucket);
    table->set_ttl_ms(3'600'000);  // the refill ends the lease's units, not the ttl
    const auto limits = parse_limits("60/minute");  // one token a second
    auto left = [&] { return bucket->test(limits, "k", 1).remaining; };
    Decision d = table->hit(limits, "k", 1, 100);
    ASSERT_TRUE(d.allowed) << strategy;
    EXPECT_EQ(table->held(), 29) << strategy;  // 30 taken (half of 60), one admitted
    EXPECT_EQ(left(), 30) << strategy;
    clock_->advance(10'000);  // 10 refilled: 10 of the 30 taken are gone from the lease
    EXPECT_EQ(table->held(), 20) << strategy;
    for (int i = 0; i < 20; ++i) EXPECT_TRUE(table->admit_local(limits, "k", 1).has_value()) << strategy;
    EXPECT_FALSE(table->admit_local(limits, "k", 1).has_value()) << strategy;
    EXPECT_EQ(left(), 40) << strategy;
    ASSERT_TRUE(table->hit(limits, "k", 1, 10).allowed);  // takes 10 more, holds 9
    clock_->advance(3'000);  // 3 of the 10 refilled: the lease holds 7 of its 9
    EXPECT_EQ(table->held(), 7) << strategy;
    EXPECT_EQ(table->give_back_all(), 7) << strategy;
    EXPECT_EQ(left(), 30 + 3 + 7) << strategy;  // the refilled 3 are not credited again
  }
}

TEST_F(LeasedTest, PeekDecidesFromTheLeaseWithoutTakingFromIt) {
  const auto limits = parse_limits("100/hour");
  EXPECT_FALSE(leases_->peek_local(limits, "k", 1).has_value());  // no lease: ask the store
  ASSERT_TRUE(hit(limits, "k", 1, 10).allowed);
  auto d = leases_->peek_local(limits, "k", 9);
  ASSERT_TRUE(d.has_value());
  EXPECT_TRUE(d->allowed);
  EXPECT_EQ(d->remaining, 90 + 9);
  EXPECT_FALSE(leases_->peek_local(limits, "k", 10).has_value());  // more than it holds
  EXPECT_EQ(leases_->held(), 9);
  clock_->advance(3'600'000);  // the window ended: the lease decides nothing
  EXPECT_FALSE(leases_->peek_local(limits, "k", 1).has_value());
  EXPECT_EQ(count(limits, "k"), 0);
}

TEST_F(LeasedTest, AnExhaustedKeyIsAskedAgainWithoutWaitingForAnotherCaller) {
  const auto limits = parse_limits("10/hour");
  while (hit(limits, "k", 1, 100).allowed) {
  }
  // The store refused: the lease knows the key is exhausted until the window ends. A caller
  // that may wait (wait=true) does not wait for another's refill in flight, nor make others
  // wait for its own, and asks for just its cost.
  LeaseTable::Step a = leases_->begin(limits, "k", 1, 100, true);
  ASSERT_FALSE(a.decided.has_value());
  EXPECT_FALSE(a.refill.owns_flag);
  LeaseTable::Step b = leases_->begin(limits, "k", 1, 100, true);  // would block behind a flag
  ASSERT_FALSE(b.decided.has_value());
  EXPECT_FALSE(b.refill.owns_flag);
  for (auto* s : {&a, &b}) {
    Decision d = leases_->install(s->refill, run(*store_, *s->refill.op));
    EXPECT_FALSE(d.allowed);
    EXPECT_GT(d.retry_after_ms, 0);
  }
  clock_->advance(3'600'000);  // a new window: a whole lease again, for the caller others wait for
  LeaseTable::Step c = leases_->begin(limits, "k", 1, 100, true);
  EXPECT_TRUE(c.refill.owns_flag);
  EXPECT_TRUE(leases_->install(c.refill, run(*store_, *c.refill.op)).allowed);
  EXPECT_EQ(leases_->held(), 4);  // min(100, 10 / 2) - 1
}

TEST_F(LeasedTest, RefillsSideBySideTakeOneLeaseBetweenThem) {
  const auto limits = parse_limits("1000/hour");
  // Asynchronous callers never wait: both begin before either's grant is in.
  LeaseTable::Step a = leases_->begin(limits, "k", 1, 100, false);
  LeaseTable::Step b = leases_->begin(limits, "k", 1, 100, false);
  LeaseGrant gb = run(*store_, *b.refill.op);
  LeaseGrant ga = run(*store_, *a.refill.op);
  EXPECT_EQ(ga.granted, 100);
  EXPECT_EQ(gb.granted, 1);  // just its cost: the process holds one lease's leftover at most
  EXPECT_TRUE(leases_->install(a.refill, ga).allowed);
  EXPECT_TRUE(leases_->install(b.refill, gb).allowed);
  EXPECT_EQ(leases_->held(), 99);
  EXPECT_EQ(count(limits, "k"), 101);
}

TEST_F(LeasedTest, AHitNeedingMoreThanTheLeaseHoldsGivesThoseBackInTheSameRoundTrip) {
  const auto limits = parse_limits("40/hour");
  ASSERT_TRUE(hit(limits, "k", 1, 10).allowed);
  EXPECT_EQ(leases_->held(), 9);
  ASSERT_TRUE(hit(limits, "k", 12, 10).allowed);
  EXPECT_EQ(leases_->held(), 0);
  EXPECT_EQ(count(limits, "k"), 1 + 12);
}

TEST_F(LeasedTest, EveryTableGivesItsUnitsBackWhenTheProcessEnds) {
  const auto limits = parse_limits("100/hour");
  auto other = make_limiter(store_, "fixed-window", "other");
  auto table = LeaseTable::create(*other);
  const std::int64_t before = LeaseTable::held_everywhere();  // other tests' tables still alive
  ASSERT_TRUE(hit(limits, "k", 1, 10).allowed);
  ASSERT_TRUE(table->hit(limits, "k", 1, 4).allowed);
  EXPECT_EQ(LeaseTable::held_everywhere(), before + 9 + 3);
  EXPECT_GE(LeaseTable::give_back_everything(false), 9 + 3);
  EXPECT_EQ(LeaseTable::held_everywhere(), 0);
  EXPECT_EQ(count(limits, "k"), 1);
  EXPECT_EQ(other->stats(limits, "k").front().count, 1);
}

TEST_F(LeasedTest, AnExhaustedKeyTakesALeaseAgainOnceTheStoreAdmits) {
  const auto limits = parse_limits("10/hour");
  while (hit(limits, "k", 1, 100).allowed) {
  }
  Decision d = hit(limits, "k", 1, 100);  // the store's read-only test refuses
  EXPECT_FALSE(d.allowed);
  EXPECT_GT(d.retry_after_ms, 0);
  EXPECT_EQ(count(limits, "k"), 10);
  run(*store_, *lim_->make_reset(limits, "k", ""));  // units free again before the window ends
  EXPECT_TRUE(hit(limits, "k", 1, 100).allowed);  // the test admits: a lease is taken
  EXPECT_EQ(leases_->held(), 4);                  // min(100, 10 / 2) - 1
  EXPECT_EQ(count(limits, "k"), 5);
}

}  // namespace
