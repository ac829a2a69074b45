// The role a server says it has (ROLE): what a connection's handshake checks when the
// address came from a sentinel, and what the Sentinel follower asks to notice a demotion.
//
//   expect_master(reply, "127.0.0.1:6379");  // throws unless the reply says master
#pragma once

#include <string>

#include "redcount/redis/io/pipeline.h"
#include "redcount/store/reply.h"
#include "redcount/store/store.h"

namespace redcount::redis {

enum class Role { Master, Replica, Sentinel, Unknown };

// {"ROLE"}: what a connection's handshake sends to learn whether it reached the master.
Command role_command();
// The role in a ROLE reply ("master", "slave", "sentinel"); Unknown for anything else,
// including an error reply (an ACL that refuses ROLE).
Role parse_role(const Reply& reply);
// Throws ConnectionError (nothing was sent, so maybe_applied is false) unless `reply` says
// master: a connection that reached a replica or a sentinel must not be used, and the
// caller re-resolves. An error reply throws the ReplyError it holds (NOPERM: grant ROLE).
void expect_master(const Reply& reply, const std::string& where);

}  // namespace redcount::redis
