// A client-side hash ring over standalone servers: the same 16384-slot table a Redis
// Cluster has, computed instead of asked for, so the store routes a ring exactly as it
// routes a cluster (key -> CRC16 slot -> node).
//
//   Ring ring({"cache-a", "cache-b", "cache-c"});
//   std::size_t node = ring.node_of(slot);          // index into the names given
//   const std::string& name = ring.name_of(slot);
//
// Each slot goes to the node with the highest weight ring_weight(name, slot) (rendezvous,
// or highest-random-weight, hashing). So the table depends only on the set of names, not
// on their order or on anything else, and when a node joins or leaves, only the slots it
// wins or held move: adding a 4th node to 3 moves about a quarter of the slots, all to the
// newcomer. Names are the stable identity of the nodes (not their addresses), so a node
// can move to another address without moving any key.
//
// Immutable after construction, so thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace redcount::redis {

inline constexpr std::size_t kRingSlots = 16384;

// The 64-bit FNV-1a hash of `bytes` (offset basis 0xcbf29ce484222325, prime
// 0x100000001b3): stable across platforms, compilers and releases, unlike std::hash.
std::uint64_t fnv1a64(std::string_view bytes) noexcept;

// The weight of `slot` on the node called `name`: splitmix64's finalizer over
// fnv1a64(name) + 0x9e3779b97f4a7c15 * (slot + 1). FNV-1a alone mixes its last bytes
// poorly; the finalizer spreads every bit of the name's hash and of the slot over the
// whole result, which is what keeps the table balanced. Part of the on-disk contract of a
// ring (which node holds which key): never change it.
std::uint64_t ring_weight(std::string_view name, std::uint32_t slot) noexcept;

class Ring {
 public:
  // Throws InvalidArgument for an empty list, an empty name or a name given twice.
  explicit Ring(std::vector<std::string> names);

  // The index (into names()) of the node that owns `slot` (< kRingSlots; larger values
  // are taken modulo kRingSlots).
  std::size_t node_of(std::uint32_t slot) const noexcept { return table_[slot % kRingSlots]; }
  const std::string& name_of(std::uint32_t slot) const noexcept { return names_[node_of(slot)]; }
  const std::vector<std::string>& names() const noexcept { return names_; }
  // slot -> node index, kRingSlots entries.
  const std::vector<std::uint16_t>& table() const noexcept { return table_; }
  // How many slots each node owns, by node index.
  std::vector<std::size_t> slot_counts() const;

 private:
  std::vector<std::string> names_;
  std::vector<std::uint16_t> table_;
};

}  // namespace redcount::redis
