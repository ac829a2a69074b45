// The client-side ring's slot table (rendezvous hashing over node names), and the ring as a
// store with a breaker per node.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <vector>

#include "redcount/common/errors.h"
#include "redcount/common/options.h"
#include "redcount/common/slot.h"
#include "redcount/redis/redis_store.h"
#include "redcount/redis/topology/ring.h"
#include "redcount/store/resilient_store.h"
#include "test_servers.h"
#include "test_support.h"

using rctest::free_port;
using redcount::InvalidArgument;
using redcount::redis::fnv1a64;
using redcount::redis::kRingSlots;
using redcount::redis::Ring;
using redcount::redis::ring_weight;
using rctest::contains;

namespace {

// How many slots change owner between two rings, and whether every moved slot went to
// (or came from) `node`.
struct Moves {
  std::size_t moved = 0;
  bool only_via_node = true;
};

Moves compare(const Ring& before, const Ring& after, const std::string& node) {
  Moves m;
  for (std::uint32_t s = 0; s < kRingSlots; ++s) {
    const std::string& a = before.name_of(s);
    const std::string& b = after.name_of(s);
    if (a == b) continue;
    ++m.moved;
    if (a != node && b != node) m.only_via_node = false;
  }
  return m;
}

}  // namespace

TEST(Ring, HashIsTheDocumentedFnv1a64) {
  // Published FNV-1a 64 test vectors.
  EXPECT_EQ(fnv1a64(""), 0xcbf29ce484222325ULL);
  EXPECT_EQ(fnv1a64("a"), 0xaf63dc4c8601ec8cULL);
  EXPECT_EQ(fnv1a64("foobar"), 0x85944171f73967e8ULL);
}

TEST(Ring, WeightsArePinned) {
  // The weight function decides where every key of an existing ring lives: a change to it
  // (or to the hash) moves keys between servers, so these values must never change.
  EXPECT_EQ(ring_weight("node-a", 0), 0x40a36dc372dab80aULL);
  EXPECT_EQ(ring_weight("node-a", 16383), 0x28c67c749708b698ULL);
  EXPECT_EQ(ring_weight("node-b", 7), 0x728b120bbf9baa10ULL);
  // A fingerprint of a whole table: FNV-1a over the owner ('0'..'2') of every slot.
  const Ring ring({"node-a", "node-b", "node-c"});
  std::string owners;
  for (auto n : ring.table()) owners.push_back(static_cast<char>('0' + n));
  EXPECT_EQ(fnv1a64(owners), 0xb08b9423f103707dULL);
  EXPECT_EQ(ring.slot_counts(), (std::vector<std::size_t>{5461, 5482, 5441}));
}

TEST(Ring, DeterministicAndIndependentOfOrder) {
  const Ring a({"alpha", "beta", "gamma"});
  const Ring b({"gamma", "alpha", "beta"});
  ASSERT_EQ(a.table().size(), kRingSlots);
  for (std::uint32_t s = 0; s < kRingSlots; ++s) EXPECT_EQ(a.name_of(s), b.name_of(s)) << "slot " << s;
  EXPECT_EQ(a.node_of(kRingSlots + 5), a.node_of(5));
}

TEST(Ring, Balanced) {
  for (std::size_t n : {2u, 3u, 4u, 5u, 8u}) {
    std::vector<std::string> names;
    for (std::size_t i = 0; i < n; ++i) names.push_back(rctest::cat("redis-", static_cast<std::int64_t>(i)));
    const Ring ring(names);
    const double fair = static_cast<double>(kRingSlots) / static_cast<double>(n);
    for (std::size_t i = 0; i < n; ++i) {
      const double share = static_cast<double>(ring.slot_counts()[i]);
      // Binomial spread: 3 standard deviations is under 3% of the fair share for these n.
      EXPECT_NEAR(share, fair, 0.05 * fair) << n << " nodes, node " << names[i];
    }
  }
}

TEST(Ring, AddingAFourthNodeMovesAQuarterOnlyToIt) {
  const Ring three({"cache-1", "cache-2", "cache-3"});
  const Ring four({"cache-1", "cache-2", "cache-3", "cache-4"});
  const Moves m = compare(three, four, "cache-4");
  const double fraction = static_cast<double>(m.moved) / static_cast<double>(kRingSlots);
  EXPECT_NEAR(fraction, 0.25, 0.03);
  EXPECT_TRUE(m.only_via_node) << "a slot moved between two old nodes";
  for (std::uint32_t s = 0; s < kRingSlots; ++s) {
    if (three.name_of(s) != four.name_of(s)) {
      EXPECT_EQ(four.name_of(s), "cache-4");
    }
  }
}

TEST(Ring, RemovingANodeMovesOnlyItsSlots) {
  const Ring four({"a", "b", "c", "d"});
  const Ring three({"a", "c", "d"});
  const Moves m = compare(four, three, "b");
  EXPECT_EQ(m.moved, four.slot_counts()[1]);  // exactly b's slots
  EXPECT_TRUE(m.only_via_node);
  // And b's slots spread over the survivors, not onto one of them.
  std::vector<std::size_t> received(3, 0);
  for (std::uint32_t s = 0; s < kRingSlots; ++s) {
    if (four.name_of(s) == "b") ++received[three.node_of(s)];
  }
  for (auto r : received) EXPECT_NEAR(static_cast<double>(r), static_cast<double>(m.moved) / 3, 0.1 * m.moved / 3);
}

TEST(Ring, RefusesBadNames) {
  EXPECT_THROW(Ring({}), InvalidArgument);
  try {
    Ring({"a", "", "b"});
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_TRUE(contains(e.what(), "#2")) << e.what();
  }
  try {
    Ring({"a", "b", "a"});
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_TRUE(contains(e.what(), "'a' is given twice")) << e.what();
  }
}

TEST(Ring, OneNodeOwnsEverything) {
  const Ring one({"solo"});
  EXPECT_EQ(one.slot_counts(), std::vector<std::size_t>{kRingSlots});
}

// The ring as a store: a RedisStore over ring members routes by hash slot with the table
// above; no server is needed for what is checked here (the live tests, keys on real
// servers, a node killed and restarted, are in tests/python/scaling_out/test_ring.py).
namespace {

redcount::StoreOptions ring_options(const std::vector<int>& ports, std::vector<std::string> names = {}) {
  redcount::StoreOptions o;
  for (int p : ports) {
    redcount::StoreOptions m = redcount::parse_url("redis://127.0.0.1:" + std::to_string(p) + "/0");
    m.command_timeout = std::chrono::milliseconds(300);
    m.connect_timeout = std::chrono::milliseconds(300);
    o.ring.push_back(m);
  }
  o.kind = redcount::StoreOptions::Kind::Tcp;
  o.command_timeout = std::chrono::milliseconds(300);
  o.connect_timeout = std::chrono::milliseconds(300);
  o.ring_names = std::move(names);
  return o;
}

}  // namespace

TEST(RingStore, RoutesBySlotAndDescribesItsMembers) {
  const int a = free_port(), b = free_port();
  redcount::RedisStore store(ring_options({a, b}, {"a", "b"}));
  EXPECT_TRUE(store.is_ring());
  EXPECT_EQ(store.shard_of("foo"), 12182u);
  EXPECT_EQ(store.shard_of("{user1000}.following"), 3443u);
  EXPECT_EQ(store.describe(), "ring:a=redis://127.0.0.1:" + std::to_string(a) + "/0,b=redis://127.0.0.1:" +
                                  std::to_string(b) + "/0");
  auto nodes = store.nodes();
  ASSERT_EQ(nodes.size(), 2u);
  EXPECT_EQ(nodes[0]->describe(), "redis://127.0.0.1:" + std::to_string(a) + "/0");
  EXPECT_EQ(nodes[1]->describe(), "redis://127.0.0.1:" + std::to_string(b) + "/0");
  // Nothing listens: the call fails as on one server, without asking anyone for a table.
  EXPECT_THROW(store.execute_one(redcount::Command{{"GET", "foo"}}), redcount::ConnectionError);
  store.close();
}

TEST(RingStore, RefusesBadMembers) {
  const int a = free_port();
  auto o = ring_options({a, a});
  EXPECT_TRUE(contains(rctest::error_of<InvalidArgument>([&] { redcount::RedisStore s(o); }), "distinct servers"));
  o = ring_options({a, free_port()}, {"x"});
  EXPECT_TRUE(contains(rctest::error_of<InvalidArgument>([&] { redcount::RedisStore s(o); }), "one name per server"));
  o = ring_options({a, free_port()}, {"x", "x"});
  EXPECT_TRUE(contains(rctest::error_of<InvalidArgument>([&] { redcount::RedisStore s(o); }), "given twice"));
  o = ring_options({a});
  o.ring[0] = redcount::parse_url("unix:///tmp/nowhere.sock");
  EXPECT_TRUE(contains(rctest::error_of<InvalidArgument>([&] { redcount::RedisStore s(o); }),
                       "redis://, rediss:// or redis+sentinel://"));
  // The same Sentinel group (service and first sentinel) twice.
  o = ring_options({a});
  o.ring[0] = redcount::parse_url("redis+sentinel://127.0.0.1:1,127.0.0.1:2/cache");
  o.ring.push_back(redcount::parse_url("redis+sentinel://127.0.0.1:1/cache"));
  EXPECT_TRUE(contains(rctest::error_of<InvalidArgument>([&] { redcount::RedisStore s(o); }), "given twice"));
}

TEST(RingStore, SentinelGroupsAreMembers) {
  // Two services behind the same sentinels, and a server: three members, named by default
  // "service@first-sentinel" (a group has no fixed server address).
  const int a = free_port();
  auto o = ring_options({a});
  auto group = [](const std::string& service) {
    redcount::StoreOptions m = redcount::parse_url("redis+sentinel://127.0.0.1:1,127.0.0.1:2/" + service);
    m.command_timeout = std::chrono::milliseconds(300);
    m.connect_timeout = std::chrono::milliseconds(300);
    return m;
  };
  o.ring.insert(o.ring.begin(), group("cache-b"));
  o.ring.insert(o.ring.begin(), group("cache-a"));
  redcount::RedisStore s(o);
  EXPECT_EQ(s.address(), "cache-a@127.0.0.1:1,cache-b@127.0.0.1:1,127.0.0.1:" + std::to_string(a));
  EXPECT_TRUE(contains(s.describe(), "cache-a@127.0.0.1:1=redis+sentinel://127.0.0.1:1,127.0.0.1:2/cache-a/0"));
  auto nodes = s.nodes();
  ASSERT_EQ(nodes.size(), 3u);
  EXPECT_EQ(nodes[0]->describe(), "redis+sentinel://127.0.0.1:1,127.0.0.1:2/cache-a/0");
  EXPECT_EQ(nodes[2]->describe(), "redis://127.0.0.1:" + std::to_string(a) + "/0");
  // A key of the first member's slots goes to its sentinels, none of which answers: the
  // follower's error, naming the service, reaches the caller.
  const Ring ring({"cache-a@127.0.0.1:1", "cache-b@127.0.0.1:1", "127.0.0.1:" + std::to_string(a)});
  std::string key;
  for (int i = 0; key.empty(); ++i) {
    const std::string k = "k" + std::to_string(i);
    if (ring.name_of(redcount::key_slot(k)) == "cache-a@127.0.0.1:1") key = k;
  }
  EXPECT_TRUE(contains(rctest::error_of<redcount::ConnectionError>([&] {
                         s.execute_one(redcount::Command{{"GET", key}});
                       }),
                       "service 'cache-a'"));
  s.close();
}

TEST(RingStore, EachDeadNodeOpensItsOwnBreaker) {
  redcount::take_breaker_events();
  const int a = free_port(), b = free_port();
  redcount::ResilienceOptions r;
  r.budget = std::chrono::milliseconds(100);
  auto store = redcount::open_resilient_store(ring_options({a, b}, {"a", "b"}), r, "");
  auto* resilient = dynamic_cast<redcount::ResilientStore*>(store.get());
  ASSERT_NE(resilient, nullptr);
  ASSERT_TRUE(resilient->per_node());
  // Keys on node "a" only: "a"'s breaker opens, "b"'s stays closed.
  const Ring ring({"a", "b"});
  std::string key_a;
  for (int i = 0; key_a.empty(); ++i) {
    const std::string k = "k" + std::to_string(i);
    if (ring.name_of(redcount::key_slot(k)) == "a") key_a = k;
  }
  for (int i = 0; i < 5; ++i) {
    EXPECT_THROW(store->execute_one(redcount::Command{{"GET", key_a}}), redcount::Unavailable);
  }
  auto states = store->node_breakers();
  ASSERT_EQ(states.size(), 2u);
  EXPECT_TRUE(contains(states[0].where, "ring node 'a'"));
  EXPECT_EQ(states[0].state, redcount::BreakerState::Open);
  EXPECT_EQ(states[1].state, redcount::BreakerState::Closed);
  EXPECT_EQ(resilient->state(), redcount::BreakerState::Open);
  const std::string refused =
      rctest::error_of<redcount::Unavailable>([&] { store->execute_one(redcount::Command{{"GET", key_a}}); });
  EXPECT_TRUE(contains(refused, "circuit breaker is open")) << refused;
  store->close();
}
