// The memory store's hash commands (HGET, HSET, HINCRBY, HGETALL, HDEL...), parsed and
// answered as Redis does.
#include "redcount/memory/memory_store.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <limits>

#include "redcount/common/errors.h"
#include "redcount/common/util.h"
#include "memory/keyspace.h"

#include "memory/command_support.h"

namespace redcount {

using memory_commands::int64_arg;
using memory_commands::upper;
using memory_commands::wrong_args;

std::optional<Reply> MemoryStore::run_hash_command(Ops& ops, const std::string& cmd,
                                                   const std::vector<std::string>& args) {
  const std::size_t n = args.size();
  if (cmd == "HSET") {
    if (n < 4 || n % 2 != 0) return wrong_args(cmd);
    Hash& h = ops.find_or_create<Hash>(args[1]);
    std::int64_t added = 0;
    for (std::size_t i = 2; i < n; i += 2) added += Ops::hash_set(h, args[i], args[i + 1]);
    return Reply::of_integer(added);
  }
  if (cmd == "HGET") {
    if (n != 3) return wrong_args(cmd);
    auto v = ops.hget(args[1], args[2]);
    return v ? Reply::of_string(std::move(*v)) : Reply::nil();
  }
  if (cmd == "HMGET") {
    if (n < 3) return wrong_args(cmd);
    std::vector<Reply> out;
    out.reserve(n - 2);
    for (std::size_t i = 2; i < n; ++i) {
      auto v = ops.hget(args[1], args[i]);
      out.push_back(v ? Reply::of_string(std::move(*v)) : Reply::nil());
    }
    return Reply::of_array(std::move(out));
  }
  if (cmd == "HGETALL") {
    if (n != 2) return wrong_args(cmd);
    std::vector<Reply> out;
    for (auto& [field, value] : ops.hgetall(args[1])) {
      out.push_back(Reply::of_string(std::move(field)));
      out.push_back(Reply::of_string(std::move(value)));
    }
    return Reply::of_array(std::move(out));
  }
  if (cmd == "HDEL") {
    if (n < 3) return wrong_args(cmd);
    std::int64_t removed = 0;
    for (std::size_t i = 2; i < n; ++i) removed += ops.hdel(args[1], args[i]);
    return Reply::of_integer(removed);
  }
  if (cmd == "HLEN") {
    if (n != 2) return wrong_args(cmd);
    const Hash* h = ops.find_as<Hash>(args[1]);
    return Reply::of_integer(h ? static_cast<std::int64_t>(h->fields.size()) : 0);
  }
  if (cmd == "HEXISTS") {
    if (n != 3) return wrong_args(cmd);
    const Hash* h = ops.find_as<Hash>(args[1]);
    return Reply::of_integer(h && h->index.count(args[2]) ? 1 : 0);
  }
  if (cmd == "HINCRBY") {
    if (n != 4) return wrong_args(cmd);
    const std::int64_t amount = int64_arg(args[3]);
    return Reply::of_integer(ops.hincrby(args[1], args[2], amount));
  }
  return std::nullopt;
}

}  // namespace redcount
