// Where the keys of a command are: which arguments of GET, INCRBY, XADD, EVALSHA... are
// keys, and what a keyless command is about. Pure functions, no I/O; the Redis Cluster
// router (redis/topology/command_keys.h) cuts batches by it and hot-key observation
// (store/hot_keys.h) counts the keys it names.
//
//   std::vector<std::string_view> keys;
//   if (keys_of(Command{{"MSET", "a", "1", "b", "2"}}, keys) == KeyRole::Keyed) ...  // keys: a, b
#pragma once

#include <string_view>
#include <vector>

#include "redcount/store/store.h"

namespace redcount {

enum class KeyRole {
  Keyed,       // has keys (`keys` holds them)
  Free,        // keyless, runs anywhere: PING, ECHO, EVAL with no keys
  JoinBefore,  // keyless, about the write before it: WAIT, WAITAOF, EXEC, DISCARD
  JoinAfter,   // keyless, belongs with what follows: TIME, MULTI
  NodeOnly,    // about one node (KEYS, SCAN, INFO...): refused on a cluster
  Unknown,     // not in the table: refused on a cluster
};

// The request's role, with its keys appended to `keys` (views into the request).
KeyRole keys_of(const Request& request, std::vector<std::string_view>& keys);

}  // namespace redcount
