// Sharded idempotent counters and the memory store's streams, on the memory store
// and, when REDCOUNT_TEST_REDIS_URL is set, on a real Redis with the same expectations.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <thread>
#include <memory>
#include <string>
#include <vector>

#include <unistd.h>

#include "redcount/sharded/buffered.h"
#include "redcount/common/clock.h"
#include "redcount/common/errors.h"
#include "redcount/memory/memory_store.h"
#include "redcount/common/options.h"
#include "redcount/redis/redis_store.h"
#include "redcount/sharded/quota.h"
#include "redcount/sharded/sharded_counter.h"
#include "redcount/store/scripts.h"
#include "test_support.h"

namespace {

using namespace redcount;
using rctest::kT0;

// The stores every test runs on: memory always, Redis when a URL is given.
class ShardedTest : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    if (std::string(GetParam()) == "redis") {
      const char* url = std::getenv("REDCOUNT_TEST_REDIS_URL");
      if (url == nullptr || *url == '\0') GTEST_SKIP() << "REDCOUNT_TEST_REDIS_URL is not set";
      store_ = std::make_shared<RedisStore>(parse_url(url));
      rctest::run(*store_, {"FLUSHDB"});
    } else {
      store_ = rctest::memory_store(clock_);
    }
  }
  void TearDown() override {
    if (store_) {
      rctest::run(*store_, {"FLUSHDB"});
      store_->close();
    }
  }
  ShardedCounter counter(const std::string& name, std::int64_t shards = 4) {
    ShardedOptions o;
    o.name = name;
    o.shards = shards;
    o.log_maxlen = 5;
    return ShardedCounter(store_, o);
  }
  std::shared_ptr<ManualClock> clock_ = std::make_shared<ManualClock>(kT0);
  std::shared_ptr<Store> store_;
};

INSTANTIATE_TEST_SUITE_P(Stores, ShardedTest, ::testing::Values("memory", "redis"));

TEST_P(ShardedTest, IncrementsDecrementsAndSums) {
  auto c = counter("likes");
  EXPECT_EQ(c.value(), 0);
  EXPECT_TRUE(c.incr(5));
  EXPECT_TRUE(c.incr(-2));
  for (int i = 0; i < 40; ++i) EXPECT_TRUE(c.incr(1));
  EXPECT_EQ(c.value(), 43);
  const auto per = c.shard_values();
  ASSERT_EQ(per.size(), 4u);
  std::int64_t sum = 0, used = 0;
  for (auto v : per) {
    sum += v;
    used += v != 0;
  }
  EXPECT_EQ(sum, 43);
  EXPECT_GT(used, 1) << "random routing spreads writes over the shards";
}

TEST_P(ShardedTest, RequestIdsCountOnceOnTheirOwnShard) {
  auto c = counter("views");
  EXPECT_TRUE(c.incr(3, "req-1"));
  EXPECT_FALSE(c.incr(3, "req-1"));
  EXPECT_FALSE(c.incr(7, "req-1")) << "the id, not the amount, identifies a write";
  EXPECT_TRUE(c.incr(1, "req-2"));
  EXPECT_EQ(c.value(), 4);
  const std::int64_t s = c.shard_of("req-1");
  EXPECT_EQ(c.shard_values()[static_cast<std::size_t>(s)], 3 + (c.shard_of("req-2") == s ? 1 : 0));
  // The id key lives on the shard's tag with the idempotency TTL.
  const Reply ttl = rctest::run(*store_, {"PTTL", c.key_of(s, "rid:req-1")});
  EXPECT_GT(ttl.integer, 86'300'000);
  EXPECT_LE(ttl.integer, 86'400'000);
  EXPECT_EQ(rctest::run(*store_, {"PTTL", c.key_of(s)}).integer, -1) << "values never expire";
}

TEST_P(ShardedTest, EveryAppliedDeltaIsInTheShardLog) {
  auto c = counter("log", 1);
  EXPECT_TRUE(c.incr(2, "a"));
  EXPECT_FALSE(c.incr(2, "a"));
  EXPECT_TRUE(c.incr(-1));
  const Reply r = rctest::run(*store_, {"XRANGE", c.key_of(0, "log"), "-", "+"});
  ASSERT_EQ(r.elements.size(), 2u);
  const auto& f = r.elements[0].elements[1].elements;
  // delta and request id; the counter and shard are the log's key, the time its entry id.
  ASSERT_EQ(f.size(), 4u);
  EXPECT_EQ(f[0].str, "delta");
  EXPECT_EQ(f[1].str, "2");
  EXPECT_EQ(f[2].str, "request_id");
  EXPECT_EQ(f[3].str, "a");
  EXPECT_EQ(r.elements[1].elements[1].elements[1].str, "-1");
  EXPECT_EQ(r.elements[1].elements[1].elements[3].str, "");
  EXPECT_EQ(rctest::run(*store_, {"TYPE", c.key_of(0, "log")}).str, "stream");
  // Trimmed with MAXLEN ~ 5: Redis keeps at least 5 (whole nodes only), memory exactly 5.
  for (int i = 0; i < 300; ++i) c.incr(1);
  const std::int64_t len = rctest::run(*store_, {"XLEN", c.key_of(0, "log")}).integer;
  EXPECT_GE(len, 5);
  EXPECT_LE(len, 302);
}

TEST_P(ShardedTest, AnAdjustmentCarriesItsReasonInTheLog) {
  auto c = counter("adj", 1);
  EXPECT_TRUE(c.incr(3));
  EXPECT_TRUE(c.adjust(-2, "refund 7", "adj-7"));
  EXPECT_FALSE(c.adjust(-2, "refund 7", "adj-7")) << "a retried adjustment is not applied twice";
  EXPECT_THROW(c.adjust(5, ""), InvalidArgument);
  EXPECT_THROW(c.adjust(5, std::string(kMaxAdjustReason + 1, 'x')), InvalidArgument);
  EXPECT_THROW(c.adjust(0, "zero"), InvalidArgument);
  EXPECT_EQ(c.value(), 1);
  const Reply r = rctest::run(*store_, {"XRANGE", c.key_of(0, "log"), "-", "+"});
  ASSERT_EQ(r.elements.size(), 2u) << "refused adjustments write nothing";
  EXPECT_EQ(r.elements[0].elements[1].elements.size(), 4u) << "a plain increment has no reason field";
  const auto& f = r.elements[1].elements[1].elements;
  ASSERT_EQ(f.size(), 6u);
  EXPECT_EQ(f[1].str, "-2");
  EXPECT_EQ(f[3].str, "adj-7");
  EXPECT_EQ(f[4].str, "reason");
  EXPECT_EQ(f[5].str, "refund 7");
}

TEST_P(ShardedTest, ALogThatRefusesTheEntryUndoesTheWrite) {
  auto c = counter("broken", 1);
  rctest::run(*store_, {"SET", c.key_of(0, "log"), "not a stream"});
  EXPECT_THROW(c.incr(4, "x"), ReplyError);
  EXPECT_EQ(c.value(), 0);
  EXPECT_EQ(rctest::run(*store_, {"EXISTS", c.key_of(0, "rid:x")}).integer, 0) << "the id is not used up";
  rctest::run(*store_, {"DEL", c.key_of(0, "log")});
  EXPECT_TRUE(c.incr(4, "x"));
  EXPECT_EQ(c.value(), 4);
}

TEST_P(ShardedTest, IncrManyAndValues) {
  auto c = counter("a");
  auto r = c.incr_many({{"a", 2, "i1"}, {"b", 5, ""}, {"a", 2, "i1"}, {"c", -3, "i2"}, {"b", 1, "i1"}});
  EXPECT_EQ(r, (std::vector<bool>{true, true, false, true, true}));
  EXPECT_EQ(c.values({"a", "b", "c", "none"}), (std::vector<std::int64_t>{2, 6, -3, 0}));
  EXPECT_THROW(c.incr_many({{"a", 1, ""}, {"b{x}", 1, ""}}), InvalidArgument);
  EXPECT_THROW(c.incr_many({{"a", 1, ""}, {"b", 0, ""}}), InvalidArgument);
  EXPECT_EQ(c.value(), 2) << "a batch with bad input sends nothing";
}

TEST_P(ShardedTest, ReadServesTheCacheWithinItsStaleness) {
  auto c = counter("hot");
  c.incr(10);
  Reading first = c.read(60'000);
  EXPECT_EQ(first.value, 10);
  c.incr(5);
  Reading cached = c.read(60'000);
  EXPECT_EQ(cached.value, 10) << "within max_staleness the cache answers";
  EXPECT_GE(cached.staleness_ms, first.staleness_ms);
  EXPECT_EQ(c.read(0).value, 15);
  EXPECT_EQ(c.read(60'000).value, 15) << "a fresh read refreshes the cache";
}

TEST_P(ShardedTest, BadInputStoresNothing) {
  auto c = counter("bad");
  EXPECT_THROW(c.incr(0), InvalidArgument);
  EXPECT_THROW(c.incr(kMaxShardedAmount + 1), InvalidArgument);
  EXPECT_THROW(c.incr(1, std::string(300, 'x')), InvalidArgument);
  EXPECT_THROW(c.incr(1, "\xff"), InvalidArgument);
  EXPECT_THROW(c.read(-1), InvalidArgument);
  EXPECT_EQ(rctest::run(*store_, {"DBSIZE"}).integer, 0);
  ShardedOptions o;
  o.name = "x";
  o.shards = 0;
  EXPECT_THROW(ShardedCounter(store_, o), InvalidArgument);
  o.shards = kMaxShards + 1;
  EXPECT_THROW(ShardedCounter(store_, o), InvalidArgument);
  o.shards = 2;
  o.idempotency_ttl_ms = 0;
  EXPECT_THROW(ShardedCounter(store_, o), InvalidArgument);
  o.idempotency_ttl_ms = 1000;
  o.name = "a{b}";
  EXPECT_THROW(ShardedCounter(store_, o), InvalidArgument);
  o.name = "r";
  o.route = ShardedOptions::Route::Random;
  ShardedCounter random(store_, o);
  EXPECT_THROW(random.incr(1, "id"), InvalidArgument) << "a retry could land on another shard";
  EXPECT_TRUE(random.incr(1));
}

TEST_P(ShardedTest, ReshardMovesTheWritesAndSumsEveryGeneration) {
  auto a = counter("rs", 4);
  auto stale = counter("rs", 4);
  for (int i = 0; i < 20; ++i) EXPECT_TRUE(a.incr(1, "r" + std::to_string(i)));
  EXPECT_EQ(stale.value(), 20);  // `stale` now holds the first layout, fresh for a second
  const ShardLayout l = a.reshard(8);
  ASSERT_EQ(l.version, 2);
  ASSERT_EQ(l.generations.size(), 2u);
  EXPECT_EQ(l.generations[0].first, 0);
  EXPECT_EQ(l.generations[0].count, 4);
  EXPECT_GT(l.generations[0].retired_ms, 0);
  EXPECT_EQ(l.generations[1].first, 4);
  EXPECT_EQ(l.generations[1].count, 8);
  EXPECT_EQ(l.generations[1].retired_ms, 0);
  EXPECT_EQ(rctest::run(*store_, {"TYPE", "{redcount:rs}:layout"}).str, "string");
  EXPECT_EQ(rctest::run(*store_, {"PTTL", "{redcount:rs}:layout"}).integer, -1);
  // Retries of ids the first generation applied count once.
  for (int i = 0; i < 20; ++i) EXPECT_FALSE(a.incr(1, "r" + std::to_string(i))) << i;
  // New ids go to the new generation.
  for (int i = 0; i < 10; ++i) {
    const std::string id = "n" + std::to_string(i);
    EXPECT_GE(a.shard_of(id), 4);
    EXPECT_TRUE(a.incr(2, id));
  }
  // A writer that may still believe the first layout (for up to kLayoutRefreshMs) writes a
  // frozen shard: summed, and its id is seen by up-to-date writers (and theirs by it).
  EXPECT_TRUE(stale.incr(5, "late"));
  EXPECT_FALSE(a.incr(5, "late"));
  EXPECT_FALSE(stale.incr(2, "n3"));
  EXPECT_EQ(a.value(), 20 + 20 + 5);
  EXPECT_EQ(stale.value(), 45) << "a read follows the layout it finds";
  EXPECT_EQ(stale.cached_layout().version, 2);
  const auto per = a.shard_values();
  ASSERT_EQ(per.size(), 12u);
  std::int64_t newer = 0;
  for (std::size_t i = 4; i < 12; ++i) newer += per[i];
  EXPECT_EQ(newer, 20);
  const auto many = a.values({"rs", "other"});
  EXPECT_EQ(many, (std::vector<std::int64_t>{45, 0}));
  // A new object reads the layout before its first write.
  auto fresh = counter("rs", 4);
  EXPECT_FALSE(fresh.incr(1, "n5"));
  EXPECT_TRUE(fresh.incr(1, "f1"));
  EXPECT_GE(fresh.shard_of("f1"), 4);
  // Again: the ids of both older generations are checked.
  a.reshard(2);
  EXPECT_FALSE(a.incr(1, "r3"));
  EXPECT_FALSE(a.incr(1, "n3"));
  EXPECT_TRUE(a.incr(1, "x"));
  EXPECT_GE(a.shard_of("x"), 12);
  EXPECT_EQ(a.value(), 47);
  EXPECT_EQ(a.shard_values().size(), 14u);
  EXPECT_EQ(a.read(0).value, 47);
}

// sharded_claim.lua and its twin: the claim step of a write after a reshard when an older
// generation's shard is in another slot (on Redis Cluster; run here directly on each store).
Reply run_script(Store& s, const Script& script, std::vector<std::string> keys, std::vector<std::string> args) {
  std::vector<Request> batch;
  batch.emplace_back(ScriptCall{&script, std::move(keys), std::move(args)});
  return std::move(s.execute(batch).at(0));
}

TEST_P(ShardedTest, TheClaimMarksAnIdOrReportsItApplied) {
  rctest::run(*store_, {"SET", "{c:1}:rid:applied", "1"});
  rctest::run(*store_, {"SET", "{c:1}:rid:claimed", "n"});
  rctest::run(*store_, {"SET", "{c:1}:rid:foreign", "x"});
  Reply r = run_script(*store_, kShardedClaimScript,
                       {"{c:1}:rid:new", "{c:1}:rid:applied", "{c:1}:rid:claimed", "{c:1}:rid:foreign"}, {"60000"});
  ASSERT_EQ(r.type, Reply::Type::Array);
  ASSERT_EQ(r.elements.size(), 4u);
  EXPECT_EQ(r.elements[0].integer, 0);  // not applied there: now claimed
  EXPECT_EQ(r.elements[1].integer, 1);  // applied there: the write is a duplicate
  EXPECT_EQ(r.elements[2].integer, 0);  // claimed before (a crash between claim and write)
  EXPECT_EQ(r.elements[3].integer, 1);  // any other value counts as applied, as in sharded_incr
  EXPECT_EQ(rctest::run(*store_, {"GET", "{c:1}:rid:new"}).str, "n");
  EXPECT_EQ(rctest::run(*store_, {"GET", "{c:1}:rid:applied"}).str, "1");
  EXPECT_EQ(rctest::run(*store_, {"GET", "{c:1}:rid:claimed"}).str, "n");
  const std::int64_t ttl = rctest::run(*store_, {"PTTL", "{c:1}:rid:new"}).integer;
  EXPECT_GT(ttl, 50'000);
  EXPECT_LE(ttl, 60'000);
  EXPECT_GT(rctest::run(*store_, {"PTTL", "{c:1}:rid:claimed"}).integer, 0) << "a claim always expires";
  EXPECT_TRUE(run_script(*store_, kShardedClaimScript, {"{c:1}:a"}, {"0"}).is_error());
  EXPECT_TRUE(run_script(*store_, kShardedClaimScript, {"{c:1}:a"}, {}).is_error());
  rctest::run(*store_, {"HSET", "{c:1}:rid:hash", "f", "x"});
  EXPECT_TRUE(run_script(*store_, kShardedClaimScript, {"{c:1}:rid:hash"}, {"1000"}).is_error());
}

TEST_P(ShardedTest, AWriteMeetingAClaimOnItsOwnIdKeyAnswersMinusOneAndStoresNothing) {
  // Its own id key claimed (a writer on a newer layout): -1, nothing stored, the claim kept.
  rctest::run(*store_, {"SET", "{c:0}:rid:r", "n"});
  Reply r = run_script(*store_, kShardedIncrScript, {"{c:0}", "{c:0}:log", "{c:0}:rid:r"}, {"1", "60000", "5", "2", "3", "r"});
  ASSERT_EQ(r.elements.size(), 1u);
  EXPECT_EQ(r.elements[0].integer, -1);
  EXPECT_EQ(rctest::run(*store_, {"EXISTS", "{c:0}"}).integer, 0);
  EXPECT_EQ(rctest::run(*store_, {"EXISTS", "{c:0}:log"}).integer, 0);
  EXPECT_EQ(rctest::run(*store_, {"GET", "{c:0}:rid:r"}).str, "n");
  // Its own id key applied: 0, as always.
  rctest::run(*store_, {"SET", "{c:0}:rid:s", "1"});
  r = run_script(*store_, kShardedIncrScript, {"{c:0}", "{c:0}:log", "{c:0}:rid:s"}, {"1", "60000", "5", "2", "3", "s"});
  EXPECT_EQ(r.elements[0].integer, 0);
  // A claim on an older shard checked in the same call: not seen (the claiming writer's
  // write, if it comes, meets this one's id); applied, and every id key says so.
  rctest::run(*store_, {"SET", "{c:0}:rid:older", "n"});
  r = run_script(*store_, kShardedIncrScript, {"{c:0}", "{c:0}:log", "{c:0}:rid:t", "{c:0}:rid:older"},
                 {"1", "60000", "5", "4", "3", "t", "1", ""});
  EXPECT_EQ(r.elements[0].integer, 1);
  EXPECT_EQ(rctest::run(*store_, {"GET", "{c:0}"}).str, "3");
  EXPECT_EQ(rctest::run(*store_, {"GET", "{c:0}:rid:t"}).str, "1");
  EXPECT_EQ(rctest::run(*store_, {"GET", "{c:0}:rid:older"}).str, "1");
  // An applied older shard still makes it a duplicate, and the new id key is taken back.
  r = run_script(*store_, kShardedIncrScript, {"{c:0}", "{c:0}:log", "{c:0}:rid:u", "{c:0}:rid:older"},
                 {"1", "60000", "5", "4", "3", "u", "1", ""});
  EXPECT_EQ(r.elements[0].integer, 0);
  EXPECT_EQ(rctest::run(*store_, {"EXISTS", "{c:0}:rid:u"}).integer, 0);
  EXPECT_EQ(rctest::run(*store_, {"GET", "{c:0}"}).str, "3");
}

TEST_P(ShardedTest, AClaimLeftByACrashBeforeItsWriteCountsOnce) {
  auto a = counter("cl", 4);
  auto stale = counter("cl", 4);
  for (int i = 0; i < 8; ++i) EXPECT_TRUE(a.incr(1, "r" + std::to_string(i)));
  EXPECT_EQ(stale.value(), 8);  // holds the first layout
  a.reshard(8);
  // The claim step alone, in the id's first-generation shard: a writer that crashed after it.
  const std::int64_t old_shard = stale.shard_of("c1");
  Reply r = run_script(*store_, kShardedClaimScript, {a.key_of(old_shard, "rid:c1")}, {"60000"});
  EXPECT_EQ(r.elements.at(0).integer, 0);
  // The stale writer meets the claim, reads the layout and writes where the claim points.
  EXPECT_TRUE(stale.incr(1, "c1"));
  EXPECT_EQ(stale.cached_layout().version, 2);
  EXPECT_FALSE(a.incr(1, "c1"));
  // A claim after the write (a retry that crashed in between): still one.
  r = run_script(*store_, kShardedClaimScript, {a.key_of(old_shard, "rid:c1")}, {"60000"});
  EXPECT_FALSE(a.incr(1, "c1"));
  // Retries of ids applied before the reshard are duplicates through either path.
  for (int i = 0; i < 8; ++i) EXPECT_FALSE(a.incr(1, "r" + std::to_string(i)));
  EXPECT_EQ(a.value(), 9);
}

// On Redis Cluster (REDCOUNT_TEST_CLUSTER_URL) the generations' shards are in different
// slots: a write with a request id after a reshard claims the id in the older shards first.
TEST(ShardedCluster, RequestIdsStayExactlyOnceAcrossAReshard) {
  const char* url = std::getenv("REDCOUNT_TEST_CLUSTER_URL");
  if (url == nullptr || *url == '\0') GTEST_SKIP() << "REDCOUNT_TEST_CLUSTER_URL is not set";
  auto o = parse_url(url);
  o.command_timeout = std::chrono::milliseconds(3000);
  auto store = std::make_shared<RedisStore>(o);
  ShardedOptions so;
  so.prefix = "rctest" + std::to_string(::getpid());
  so.name = "claims";
  so.shards = 4;
  ShardedCounter a(store, so), stale(store, so);
  for (int i = 0; i < 20; ++i) EXPECT_TRUE(a.incr(1, "r" + std::to_string(i)));
  EXPECT_EQ(stale.value(), 20);
  a.reshard(8);
  for (int i = 0; i < 20; ++i) EXPECT_FALSE(a.incr(1, "r" + std::to_string(i))) << i;
  // A new id: claimed in its first-generation shard (another slot), written in the new one.
  const std::int64_t old_shard = stale.shard_of("n1");
  EXPECT_TRUE(a.incr(2, "n1"));
  EXPECT_GE(a.shard_of("n1"), 4);
  if (store->shard_of(a.key_of(old_shard)) != store->shard_of(a.key_of(a.shard_of("n1")))) {
    EXPECT_EQ(rctest::run(*store, {"GET", a.key_of(old_shard, "rid:n1")}).str, "n");
  }
  // The stale writer meets the claim and follows it; its own new ids land in frozen shards
  // and the up-to-date writer's claim finds them applied.
  EXPECT_FALSE(stale.incr(2, "n1"));
  EXPECT_EQ(stale.cached_layout().version, 2);
  ShardedCounter fresh(store, so);
  EXPECT_EQ(fresh.layout().version, 2);
  // The claim step alone (a crash before the write), then the retry: once.
  // Its first-generation shard: 4 + h % 8 now, h % 4 then, and h % 8 % 4 == h % 4.
  const std::int64_t s2 = (stale.shard_of("c1") - 4) % 4;
  std::vector<Request> claim;
  claim.emplace_back(ScriptCall{&kShardedClaimScript, {a.key_of(s2, "rid:c1")}, {"60000"}});
  EXPECT_EQ(store->execute(claim).at(0).elements.at(0).integer, 0);
  EXPECT_TRUE(fresh.incr(1, "c1"));
  EXPECT_FALSE(a.incr(1, "c1"));
  EXPECT_EQ(a.value(), 20 + 2 + 1);
  EXPECT_EQ(fresh.incr_many({{"claims", 1, "m1"}, {"claims", 1, "r3"}, {"claims", 1, "c1"}}),
            (std::vector<bool>{true, false, false}));
  EXPECT_EQ(a.value(), 24);
  store->close();
}

TEST_P(ShardedTest, ReshardRefusesBadInputAndALostRace) {
  auto a = counter("rb", 4);
  EXPECT_TRUE(a.incr(1, "r"));
  const std::int64_t keys = rctest::run(*store_, {"DBSIZE"}).integer;
  EXPECT_THROW(a.reshard(0), InvalidArgument);
  EXPECT_THROW(a.reshard(kMaxShards + 1), InvalidArgument);
  EXPECT_THROW(a.reshard(4), InvalidArgument) << "the current count";
  EXPECT_THROW(a.reshard(kMaxShards), InvalidArgument) << "4 + 4096 shards over the generations";
  EXPECT_EQ(rctest::run(*store_, {"DBSIZE"}).integer, keys) << "nothing written";
  // Two reshards that both read the same layout: one wins, the other is told and changes nothing.
  auto b = counter("rb", 4);
  auto op_a = a.make_reshard(8);
  auto op_b = b.make_reshard(16);
  auto step_a = op_a->finish(store_->execute(op_a->prepare()));
  auto step_b = op_b->finish(store_->execute(op_b->prepare()));
  EXPECT_TRUE(op_a->finish(store_->execute(step_a)).empty());
  EXPECT_THROW(op_b->finish(store_->execute(step_b)), Error);
  EXPECT_EQ(b.layout().current().count, 8);
  EXPECT_EQ(b.cached_layout().version, 2);
  // A foreign value in the layout key is reported, never guessed at.
  rctest::run(*store_, {"SET", "{redcount:rb}:layout", "garbage"});
  EXPECT_THROW(b.value(), Error);
  EXPECT_THROW(a.reshard(2), Error);
  EXPECT_EQ(rctest::run(*store_, {"GET", "{redcount:rb}:layout"}).str, "garbage");
}

TEST_P(ShardedTest, QuotaRefusesAtTheFloorAndCeilingAndChangesNothing) {
  QuotaOptions o;
  o.name = "credits";
  o.floor = 0;
  o.ceiling = 100;
  o.soft = 10;
  Quota q(store_, o);
  EXPECT_EQ(q.value(), 0);
  EXPECT_FALSE(q.take(1).applied);
  EXPECT_TRUE(q.set(50).applied);
  QuotaResult r = q.take(45);
  EXPECT_TRUE(r.applied);
  EXPECT_EQ(r.value, 5);
  EXPECT_TRUE(r.soft_exceeded) << "below the soft threshold: reported, not refused";
  r = q.take(6);
  EXPECT_FALSE(r.applied);
  EXPECT_EQ(r.value, 5);
  EXPECT_TRUE(q.take(5).applied);
  EXPECT_EQ(q.value(), 0);
  EXPECT_FALSE(q.give(101).applied);
  EXPECT_TRUE(q.give(100).applied);
  EXPECT_FALSE(q.give(1).applied);
  EXPECT_EQ(q.value(), 100);
  EXPECT_THROW(q.set(101), InvalidArgument);
  EXPECT_THROW(q.take(0), InvalidArgument);
  EXPECT_THROW(q.give(-3), InvalidArgument);
  EXPECT_EQ(q.value(), 100);
}

TEST_P(ShardedTest, QuotaTakeWithARequestIdIsIdempotent) {
  QuotaOptions o;
  o.name = "stock";
  Quota q(store_, o);
  q.set(10);
  EXPECT_FALSE(q.take(11, "order-1").applied);
  EXPECT_EQ(rctest::run(*store_, {"EXISTS", q.storage_key() + ":rid:order-1"}).integer, 0)
      << "a refused take does not use up its id";
  QuotaResult r = q.take(4, "order-1");
  EXPECT_TRUE(r.applied);
  EXPECT_FALSE(r.duplicate);
  r = q.take(4, "order-1");
  EXPECT_TRUE(r.applied);
  EXPECT_TRUE(r.duplicate);
  EXPECT_EQ(r.value, 6);
  EXPECT_EQ(q.value(), 6);
  EXPECT_EQ(q.storage_key(), "redcount:quota:{stock}");
}

TEST(ShardedKeys, EveryShardIsItsOwnHashTag) {
  auto store = rctest::memory_store(std::make_shared<ManualClock>(kT0));
  ShardedOptions o;
  o.prefix = "p";
  o.name = "likes:post:9";
  ShardedCounter c(store, o);
  EXPECT_EQ(c.key_of(3), "{p:likes:post:9:3}");
  EXPECT_EQ(c.key_of(3, "log"), "{p:likes:post:9:3}:log");
  EXPECT_EQ(c.key_of(15, "rid:r1"), "{p:likes:post:9:15}:rid:r1");
  EXPECT_EQ(c.key_of(16), "{p:likes:post:9:16}") << "a later generation's shard";
  EXPECT_THROW(c.key_of(kMaxShards), InvalidArgument);
  EXPECT_THROW(c.key_of(-1), InvalidArgument);
  // Stable routing: the same id always lands on the same shard.
  EXPECT_EQ(c.shard_of("req-1"), c.shard_of("req-1"));
}

TEST(ShardedOperations, RunAsyncOnTheMemoryStore) {
  auto store = rctest::memory_store(std::make_shared<ManualClock>(kT0));
  ShardedOptions o;
  o.name = "ops";
  ShardedCounter c(store, o);
  auto op = c.make_incr(2, "r");
  bool done = false;
  run_async(store, op, [&](std::exception_ptr e) {
    EXPECT_EQ(e, nullptr);
    done = true;
  });
  EXPECT_TRUE(done);
  EXPECT_TRUE(op->result());
  EXPECT_FALSE(run(*store, *c.make_incr(2, "r")));
  EXPECT_EQ(run(*store, *c.make_value()), 2);
}

TEST(QuotaDurable, TheMemoryStoreHasNoReplicasToAcknowledge) {
  auto store = rctest::memory_store(std::make_shared<ManualClock>(kT0));
  QuotaOptions o;
  o.name = "d";
  o.durable = 1;
  Quota q(store, o);
  QuotaResult r = q.set(5);
  EXPECT_EQ(r.replicas, 0);
  EXPECT_FALSE(r.durable_ok);
  r = q.take(10);
  EXPECT_FALSE(r.applied);
  EXPECT_TRUE(r.durable_ok) << "a refused take wrote nothing that could be lost";
  o.durable = -1;
  EXPECT_THROW(Quota(store, o), InvalidArgument);
}

TEST_P(ShardedTest, BufferedWritesFlushOnUnitsOnFlushAndOnClose) {
  ShardedOptions so;
  so.name = "buffered";
  auto counter = std::make_shared<ShardedCounter>(store_, so);
  BufferedOptions bo;
  bo.flush_every = std::chrono::hours(1);  // only max_pending, flush() and close() write
  bo.max_pending = 10;
  BufferedCounter b(counter, bo);
  for (int i = 0; i < 9; ++i) b.incr(1);
  EXPECT_EQ(b.pending(), 9);
  EXPECT_EQ(counter->value(), 0) << "below max_pending and before flush_every nothing is written";
  b.incr(1);  // the 10th unit wakes the flusher
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (counter->value() != 10 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));  // polling the store
  }
  EXPECT_EQ(counter->value(), 10);
  b.incr(5);
  b.incr(-2);
  EXPECT_EQ(b.flush(std::nullopt), 0);
  EXPECT_EQ(counter->value(), 13);
  b.incr(4);
  EXPECT_EQ(b.close(std::chrono::seconds(5)), 0);
  EXPECT_EQ(counter->value(), 17);
  const BufferedStats st = b.stats();
  EXPECT_EQ(st.flushed_units, 17);
  EXPECT_EQ(st.failed_units, 0);
  EXPECT_EQ(st.pending, 0);
  EXPECT_THROW(b.incr(1), Error);
  EXPECT_THROW(b.incr(0), InvalidArgument);
}

// ----------------------------------------------------------------- memory streams

TEST(MemoryStream, XaddIdsTrimAndRanges) {
  auto clock = std::make_shared<ManualClock>(kT0);
  auto s = rctest::memory_store(clock);
  using rctest::run;
  EXPECT_EQ(run(*s, {"XADD", "st", "*", "f", "1"}).str, std::to_string(kT0) + "-0");
  EXPECT_EQ(run(*s, {"XADD", "st", "*", "f", "2"}).str, std::to_string(kT0) + "-1");
  clock->set(kT0 - 5000);  // a clock that went back never makes ids go back
  EXPECT_EQ(run(*s, {"XADD", "st", "*", "f", "3"}).str, std::to_string(kT0) + "-2");
  EXPECT_TRUE(run(*s, {"XADD", "st", "5-0", "f", "x"}).is_error());
  EXPECT_TRUE(run(*s, {"XADD", "st", "*", "f"}).is_error());
  EXPECT_EQ(run(*s, {"XLEN", "st"}).integer, 3);
  EXPECT_EQ(run(*s, {"TYPE", "st"}).str, "stream");
  EXPECT_TRUE(run(*s, {"GET", "st"}).is_error());
  EXPECT_EQ(run(*s, {"XADD", "st", "MAXLEN", "~", "2", "*", "f", "4"}).type, Reply::Type::String);
  EXPECT_EQ(run(*s, {"XLEN", "st"}).integer, 2);
  Reply r = run(*s, {"XRANGE", "st", "-", "+"});
  ASSERT_EQ(r.elements.size(), 2u);
  EXPECT_EQ(r.elements[0].elements[1].elements[1].str, "3");
  r = run(*s, {"XRANGE", "st", "(" + std::to_string(kT0) + "-2", "+", "COUNT", "5"});
  ASSERT_EQ(r.elements.size(), 1u);
  EXPECT_EQ(r.elements[0].elements[1].elements[1].str, "4");
  r = run(*s, {"XREVRANGE", "st", "+", "-", "COUNT", "1"});
  ASSERT_EQ(r.elements.size(), 1u);
  EXPECT_EQ(r.elements[0].elements[1].elements[1].str, "4");
  EXPECT_TRUE(run(*s, {"XRANGE", "st", "x", "+"}).is_error());
  EXPECT_TRUE(run(*s, {"XADD", "st", "MAXLEN", "2", "LIMIT", "5", "*", "f", "1"}).is_error());
  EXPECT_TRUE(run(*s, {"XADD", "new", "NOMKSTREAM", "*", "f", "1"}).is_nil());
  EXPECT_EQ(run(*s, {"EXISTS", "new"}).integer, 0);
}

}  // namespace
