#include "redcount/redis/io/role.h"

#include "redcount/common/errors.h"

namespace redcount::redis {
namespace {

const char* role_name(Role r) {
  switch (r) {
    case Role::Master:
      return "master";
    case Role::Replica:
      return "replica";
    case Role::Sentinel:
      return "sentinel";
    default:
      return "unknown";
  }
}

}  // namespace

Command role_command() { return Command{{"ROLE"}}; }

Role parse_role(const Reply& reply) {
  if (reply.type != Reply::Type::Array || reply.elements.empty()) return Role::Unknown;
  const Reply& first = reply.elements.front();
  if (first.type != Reply::Type::String && first.type != Reply::Type::Status) return Role::Unknown;
  if (first.str == "master") return Role::Master;
  if (first.str == "slave" || first.str == "replica") return Role::Replica;
  if (first.str == "sentinel") return Role::Sentinel;
  return Role::Unknown;
}

void expect_master(const Reply& reply, const std::string& where) {
  if (reply.is_error()) throw_reply_error(reply.str + " (ROLE at " + where + ")");
  const Role role = parse_role(reply);
  if (role == Role::Master) return;
  throw ConnectionError(where + " is not the master (ROLE says " + role_name(role) +
                        "): the service failed over, or is failing over; re-resolve the master");
}

}  // namespace redcount::redis
