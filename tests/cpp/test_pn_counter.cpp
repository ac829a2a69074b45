// Multi-region PN-counters on memory stores: one store per region.
// The Lua merge is checked against its twin in test_strategies.cpp (the script registry).
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "redcount/common/clock.h"
#include "redcount/common/errors.h"
#include "redcount/memory/memory_store.h"
#include "redcount/crdt/pn_counter.h"
#include "test_support.h"

namespace {

using namespace redcount;
using rctest::kT0;

PNCounter counter(std::shared_ptr<Store> store, const std::string& region) {
  PNCounterOptions o;
  o.name = "stock";
  o.region = region;
  return PNCounter(std::move(store), o);
}

std::shared_ptr<MemoryStore> fresh() { return rctest::memory_store(std::make_shared<ManualClock>(kT0)); }

TEST(PNCounter, KeysShareOneTag) {
  auto c = counter(fresh(), "eu");
  EXPECT_EQ(c.p_key(), "redcount:pn:{stock}:p");
  EXPECT_EQ(c.n_key(), "redcount:pn:{stock}:n");
}

TEST(PNCounter, IncrDecrTouchOnlyTheOwnRegion) {
  auto store = fresh();
  auto eu = counter(store, "eu");
  auto us = counter(store, "us");  // two regions writing one store: still their own fields
  EXPECT_EQ(eu.incr(5), 5);
  EXPECT_EQ(eu.decr(2), 2);
  EXPECT_EQ(us.incr(), 1);
  EXPECT_EQ(eu.value(), 4);
  EXPECT_EQ(us.value(), 4);
  const std::vector<PNComponent> want{{"eu", 5, 2}, {"us", 1, 0}};
  EXPECT_EQ(eu.components(), want);
}

TEST(PNCounter, MergeTakesTheMaximumAndIsIdempotentAndCommutative) {
  auto a_store = fresh(), b_store = fresh();
  auto a = counter(a_store, "a");
  auto b = counter(b_store, "b");
  a.incr(10);
  a.decr(3);
  b.incr(4);
  b.decr(9);
  EXPECT_EQ(a.merge(*b_store), 2);  // b's p and n are new on a
  EXPECT_EQ(a.merge(*b_store), 0);  // nothing new: a merge is idempotent
  EXPECT_EQ(b.merge(*a_store), 2);  // a's fields (b's own are not lower on a)
  EXPECT_EQ(a.value(), 2);
  EXPECT_EQ(b.value(), 2);
  EXPECT_EQ(a.components(), b.components());
  // A stale copy of a's own region (lower totals) never lowers it.
  EXPECT_EQ(a.merge_components({{"a", 1, 1}}), 0);
  EXPECT_EQ(a.value(), 2);
}

TEST(PNCounter, BadInputChangesNothing) {
  auto store = fresh();
  auto c = counter(store, "eu");
  c.incr(7);
  EXPECT_THROW(c.incr(0), InvalidArgument);
  EXPECT_THROW(c.decr(-1), InvalidArgument);
  EXPECT_THROW(c.incr(kMaxPnAmount + 1), InvalidArgument);
  EXPECT_THROW(c.merge_components({{"x", 3, 0}, {"y", -1, 0}}), InvalidArgument);
  EXPECT_THROW(c.merge_components({{"", 3, 0}}), InvalidArgument);
  EXPECT_THROW(c.merge_components({{"a{b}", 3, 0}}), InvalidArgument);
  EXPECT_EQ(c.value(), 7);
  EXPECT_EQ(c.components().size(), 1u);
  PNCounterOptions o;
  o.name = "stock";
  for (const char* region : {"", "x{y", "}"}) {
    o.region = region;
    EXPECT_THROW((void)PNCounter(store, o), InvalidArgument) << region;
  }
}

TEST(PNCounter, AForeignValueIsReportedAndMergeLeavesEverythingAsItWas) {
  auto store = fresh();
  auto c = counter(store, "eu");
  c.incr(3);
  rctest::run(*store, {"HSET", c.n_key(), "zz", "abc"});
  EXPECT_THROW(c.value(), ProtocolError);
  // The first component would raise eu's P; the foreign value after it stops the whole call.
  EXPECT_THROW(c.merge_components({{"eu", 9, 0}, {"zz", 0, 1}}), ReplyError);
  EXPECT_EQ(rctest::run(*store, {"HGET", c.p_key(), "eu"}).str, "3");
}

TEST(PNCounter, TotalsBeyondTwoToTheFiftyThreeMergeExactly) {
  auto store = fresh();
  auto c = counter(store, "eu");
  const std::int64_t big = (std::int64_t{1} << 60) + 1;
  EXPECT_EQ(c.merge_components({{"far", big, 0}}), 1);
  EXPECT_EQ(c.merge_components({{"far", big - 1, 0}}), 0);
  EXPECT_EQ(c.merge_components({{"far", big + 1, 0}}), 1);
  EXPECT_EQ(c.value(), big + 1);
}

}  // namespace
