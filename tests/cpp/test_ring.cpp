// The client-side ring's slot table: rendezvous hashing over node names.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "redcount/common/errors.h"
#include "redcount/redis/ring.h"
#include "test_support.h"

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
