// Where the keys of a command are, and how a batch is cut into units that go to one
// Redis Cluster node each. Pure functions: no I/O.
//
//   std::vector<Unit> units = route_units(batch);   // throws InvalidArgument
//   for (const Unit& u : units) { node_for(u.slot) ... requests [u.begin, u.end) ... }
//
// A unit is the smallest run of requests that must reach one node together, in order:
// one keyed request (or a whole MULTI ... EXEC block) with the keyless requests attached
// to it. Keyless requests attach to their neighbours: WAIT, WAITAOF (and EXEC, DISCARD
// inside a transaction) to the request before them, whose write they are about; TIME and
// MULTI to the request after them; PING and ECHO to the one before (or after,
// when they come first). A batch of keyless requests only is one unit for any node.
//
// Refused before anything is sent (InvalidArgument): a script call, a multi-key command
// or a transaction whose keys span hash slots (naming the keys and slots); a command
// whose keys this table does not know (naming it); a command that means one node, not
// the cluster (KEYS, SCAN, DBSIZE, FLUSHALL, FLUSHDB, INFO, RANDOMKEY...): run it on
// each of Store::nodes() instead.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "redcount/store/key_positions.h"
#include "redcount/store/store.h"

namespace redcount::redis {

// KeyRole and keys_of: store/key_positions.h.
using redcount::KeyRole;
using redcount::keys_of;

inline constexpr std::int32_t kAnySlot = -1;

struct Unit {
  std::uint32_t begin = 0;  // requests [begin, end) of the batch
  std::uint32_t end = 0;
  std::int32_t slot = kAnySlot;  // kAnySlot: keyless only, any node
  // Where an ASKING goes when the unit is redirected by ASK: before its keyed request,
  // or before MULTI for a transaction.
  std::uint32_t ask_at = 0;
  bool transaction = false;  // holds MULTI ... EXEC/DISCARD
};

// Cuts `batch` into units (in batch order, covering every request). Throws
// InvalidArgument as described above.
std::vector<Unit> route_units(const std::vector<Request>& batch);

}  // namespace redcount::redis
