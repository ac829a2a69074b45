// HotKeys (Space-Saving top-K): exact counts under capacity, the error bound and the
// heavy-hitter guarantee on a Zipf stream against exact counts, threads, bad input; the
// HotKeysStore hook on the memory store; the operation metrics the drivers count.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "redcount/common/clock.h"
#include "redcount/common/errors.h"
#include "redcount/counters/fixed_window.h"
#include "redcount/store/hot_keys.h"
#include "redcount/common/metrics.h"
#include "redcount/sharded/sharded_counter.h"
#include "test_support.h"

namespace {

using namespace redcount;

std::map<std::string, std::uint64_t> as_map(const std::vector<HotKey>& top) {
  std::map<std::string, std::uint64_t> m;
  for (const auto& k : top) m[k.key] = k.count;
  return m;
}

TEST(HotKeys, ExactWhileUnderCapacity) {
  HotKeys hk(10);
  for (int i = 0; i < 5; ++i) hk.observe("a");
  hk.observe("b", 7);
  hk.observe("c");
  hk.observe("a", 3);
  EXPECT_EQ(hk.total(), 16u);
  const auto top = hk.top(10);
  ASSERT_EQ(top.size(), 3u);
  EXPECT_EQ(top[0].key, "a");
  EXPECT_EQ(top[0].count, 8u);
  EXPECT_EQ(top[1].key, "b");
  EXPECT_EQ(top[1].count, 7u);
  EXPECT_EQ(top[2].key, "c");
  for (const auto& k : top) EXPECT_EQ(k.error, 0u);
  EXPECT_EQ(hk.top(1).size(), 1u);
  EXPECT_TRUE(hk.top(0).empty());
  hk.reset();
  EXPECT_EQ(hk.total(), 0u);
  EXPECT_TRUE(hk.top().empty());
  hk.observe("z");
  EXPECT_EQ(hk.top().front().count, 1u);
}

TEST(HotKeys, TiesAreOrderedByKey) {
  HotKeys hk(10);
  for (const char* k : {"d", "b", "c", "a"}) hk.observe(k, 2);
  const auto top = hk.top(3);
  ASSERT_EQ(top.size(), 3u);
  EXPECT_EQ(top[0].key, "a");
  EXPECT_EQ(top[1].key, "b");
  EXPECT_EQ(top[2].key, "c");
}

// A stream with far more distinct keys than the table holds: every reported bound holds
// against the exact counts, and every key above total/capacity is in the table.
void check_guarantee(std::int64_t capacity, bool weighted, bool expect_heavy = true) {
  HotKeys hk(capacity);
  std::mt19937_64 rng(12345);
  constexpr int kKeys = 5000;
  std::vector<double> weights(kKeys);
  for (int i = 0; i < kKeys; ++i) weights[static_cast<std::size_t>(i)] = 1.0 / std::pow(i + 1, 1.1);
  std::discrete_distribution<int> zipf(weights.begin(), weights.end());
  std::uniform_int_distribution<int> weight(1, 5);
  std::map<std::string, std::uint64_t> exact;
  std::uint64_t total = 0;
  for (int i = 0; i < 100'000; ++i) {
    const std::string key = "k" + std::to_string(zipf(rng));
    const int n = weighted ? weight(rng) : 1;
    hk.observe(key, n);
    exact[key] += static_cast<std::uint64_t>(n);
    total += static_cast<std::uint64_t>(n);
  }
  ASSERT_GT(exact.size(), static_cast<std::size_t>(capacity));  // the table did overflow
  EXPECT_EQ(hk.total(), total);
  EXPECT_EQ(hk.size(), static_cast<std::size_t>(capacity));
  const auto table = hk.top(capacity);
  ASSERT_EQ(table.size(), static_cast<std::size_t>(capacity));
  const std::uint64_t bound = total / static_cast<std::uint64_t>(capacity);
  for (std::size_t i = 0; i < table.size(); ++i) {
    const HotKey& k = table[i];
    if (i > 0) {
      EXPECT_GE(table[i - 1].count, k.count);
    }
    const std::uint64_t truth = exact.count(k.key) ? exact[k.key] : 0;
    EXPECT_LE(truth, k.count) << k.key;
    EXPECT_GE(truth, k.count - k.error) << k.key;
    EXPECT_LE(k.error, bound) << k.key;
  }
  const auto in_table = as_map(table);
  int heavy = 0;
  for (const auto& [key, truth] : exact) {
    if (truth > bound) {
      ++heavy;
      EXPECT_TRUE(in_table.count(key)) << key << " (" << truth << " > " << bound << ") is missing";
    }
  }
  if (!expect_heavy) return;  // capacity 1: N / m = N, so no key is above it
  EXPECT_GT(heavy, 0);        // the check above checked something
  // The hottest key of a Zipf stream is found with its exact rank.
  EXPECT_EQ(table.front().key, "k0");
}

TEST(HotKeys, ErrorBoundAndHeavyHittersOnAZipfStream) { check_guarantee(100, false); }
TEST(HotKeys, ErrorBoundWithWeightedObservations) { check_guarantee(50, true); }
TEST(HotKeys, CapacityOneKeepsTheBound) { check_guarantee(1, false, false); }

TEST(HotKeys, ThreadsCountExactly) {
  HotKeys hk(100);
  constexpr int kThreads = 4, kPerThread = 20'000, kKeys = 50;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&hk, t] {
      for (int i = 0; i < kPerThread; ++i) hk.observe("key" + std::to_string((i + t) % kKeys));
    });
  }
  std::thread reader([&hk] {
    for (int i = 0; i < 200; ++i) (void)hk.top(5);
  });
  for (auto& th : threads) th.join();
  reader.join();
  EXPECT_EQ(hk.total(), static_cast<std::uint64_t>(kThreads * kPerThread));
  const auto top = hk.top(100);
  ASSERT_EQ(top.size(), static_cast<std::size_t>(kKeys));
  for (const auto& k : top) {
    EXPECT_EQ(k.count, static_cast<std::uint64_t>(kThreads * kPerThread / kKeys)) << k.key;
    EXPECT_EQ(k.error, 0u);
  }
}

TEST(HotKeys, BadInputIsRefusedAndCountsNothing) {
  EXPECT_THROW(HotKeys(0), InvalidArgument);
  EXPECT_THROW(HotKeys(-5), InvalidArgument);
  EXPECT_THROW(HotKeys(HotKeys::kMaxCapacity + 1), InvalidArgument);
  HotKeys hk(3);
  hk.observe("a");
  EXPECT_THROW(hk.observe(""), InvalidArgument);
  EXPECT_THROW(hk.observe("a", 0), InvalidArgument);
  EXPECT_THROW(hk.observe("a", -1), InvalidArgument);
  EXPECT_THROW(hk.observe("a", HotKeys::kMaxWeight + 1), InvalidArgument);
  EXPECT_THROW(hk.observe(std::string(HotKeys::kMaxKeyBytes + 1, 'x')), InvalidArgument);
  EXPECT_THROW((void)hk.top(-1), InvalidArgument);
  EXPECT_EQ(hk.total(), 1u);
  ASSERT_EQ(hk.top().size(), 1u);
  EXPECT_EQ(hk.top().front().count, 1u);
}

TEST(HotKeysStore, SeesTheKeysCountersTouch) {
  auto clock = std::make_shared<ManualClock>(rctest::kT0);
  auto hk = std::make_shared<HotKeys>(100);
  std::shared_ptr<Store> store = observe_hot_keys(rctest::memory_store(clock), hk);
  FixedWindowOptions o;
  o.name = "views";
  o.window_ms = 60'000;
  FixedWindowCounter views(store, o);
  for (int i = 0; i < 7; ++i) views.incr("page:1", 1, {});
  views.incr("page:2", 1, {});
  const std::string hot = views.storage_key("page:1");
  const auto top = hk->top(2);
  ASSERT_EQ(top.size(), 2u);
  EXPECT_EQ(top[0].key, hot);
  EXPECT_EQ(top[0].count, 7u);
  EXPECT_EQ(top[1].key, views.storage_key("page:2"));
  EXPECT_EQ(views.get("page:1"), 7);  // a GET names the key too
  EXPECT_EQ(hk->top(1).front().count, 8u);
  // Keyless commands are not observed.
  const std::uint64_t before = hk->total();
  rctest::run(*store, {"PING"});
  rctest::run(*store, {"MGET", "x", "y"});
  EXPECT_EQ(hk->total(), before + 2);
  // A transaction is one request: its key counts once, as the script it stands in for.
  std::vector<Request> tx;
  for (auto&& args : std::vector<std::vector<std::string>>{
           {"MULTI"}, {"INCRBY", "tx", "1"}, {"PEXPIREAT", "tx", std::to_string(rctest::kT0 + 60'000)}, {"EXEC"}}) {
    tx.emplace_back(Command{args});
  }
  (void)store->execute(tx);
  EXPECT_EQ(hk->total(), before + 3);
}

// Key positions are the cluster router's (redcount/redis/topology/command_keys.h): every key of a
// multi-key command, none of the arguments that are not keys, KEYS[1] of an EVAL.
TEST(HotKeysStore, UsesTheRouterKeyPositions) {
  auto hk = std::make_shared<HotKeys>(100);
  std::shared_ptr<Store> store = observe_hot_keys(rctest::memory_store(std::make_shared<ManualClock>(rctest::kT0)), hk);
  auto send = [&](std::vector<std::string> args) {
    std::vector<Request> batch;
    batch.emplace_back(Command{std::move(args)});
    try {
      (void)store->execute(batch);
    } catch (const Error&) {
      // Observed before it runs: whether the memory store knows the command does not matter.
    }
  };
  send({"MSET", "a", "1", "b", "2"});
  send({"EVAL", "return 1", "2", "k1", "k2", "arg"});
  send({"XREADGROUP", "GROUP", "g", "c", "COUNT", "10", "STREAMS", "s1", "s2", ">", ">"});
  send({"INFO", "server"});
  std::map<std::string, std::uint64_t> seen;
  for (const auto& h : hk->top(100)) seen[h.key] = h.count;
  EXPECT_EQ(seen, (std::map<std::string, std::uint64_t>{{"a", 1}, {"b", 1}, {"k1", 1}, {"s1", 1}, {"s2", 1}}));
}

TEST(Metrics, DriversCountWritesReadsAndIdempotentHits) {
  auto clock = std::make_shared<ManualClock>(rctest::kT0);
  std::shared_ptr<Store> store = rctest::memory_store(clock);
  reset_metrics();
  FixedWindowOptions o;
  o.name = "m";
  o.window_ms = 60'000;
  FixedWindowCounter c(store, o);
  c.incr("k", 1, {});
  (void)c.incr_many({{"a", 1}, {"b", 2}});
  (void)c.get("k");
  ShardedOptions so;
  so.name = "likes";
  so.shards = 4;
  ShardedCounter likes(store, so);
  for (int i = 0; i < 8; ++i) likes.incr(1, "id-" + std::to_string(i));
  for (int i = 0; i < 2; ++i) likes.incr(1, "id-" + std::to_string(i));  // retries
  EXPECT_EQ(likes.value(), 8);
  EXPECT_THROW(c.incr("", 1, {}), InvalidArgument);  // bad input is not a failed write
  const MetricsCounts m = metrics_counts();
  EXPECT_EQ(m.writes_ok, 1u + 2u + 10u);
  EXPECT_EQ(m.writes_failed, 0u);
  EXPECT_EQ(m.reads, 2u);
  EXPECT_EQ(m.idempotent_writes, 10u);
  EXPECT_EQ(m.idempotent_hits, 2u);
  store->close();
  EXPECT_ANY_THROW(c.incr("k", 1, {}));
  EXPECT_EQ(metrics_counts().writes_failed, 1u);
  reset_metrics();
  EXPECT_EQ(metrics_counts().writes_ok, 0u);
}

}  // namespace
