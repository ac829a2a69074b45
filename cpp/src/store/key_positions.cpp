#include "redcount/store/key_positions.h"

#include <string>
#include <unordered_map>

#include "redcount/common/errors.h"
#include "redcount/common/util.h"

namespace redcount {
namespace {

// Key positions in argv (argv[0] is the name): keys at first, first + step, ... up to
// last (negative: counted from the end, -1 = the last argument).
struct Spec {
  KeyRole role = KeyRole::Keyed;
  int first = 1;
  int last = 1;
  int step = 1;
  enum class Special { None, NumKeysAt2, NumKeysAt1, DestNumKeysAt2, Streams, SubKeyAt2, MemoryUsage } special =
      Special::None;
};

const std::unordered_map<std::string, Spec>& table() {
  static const auto* t = [] {
    auto* m = new std::unordered_map<std::string, Spec>;
    auto add = [m](std::initializer_list<const char*> names, Spec s) {
      for (const char* n : names) (*m)[n] = s;
    };
    add({"get",        "set",          "setnx",        "setex",        "psetex",      "getset",
         "getdel",     "getex",        "incr",         "incrby",       "incrbyfloat", "decr",
         "decrby",     "append",       "strlen",       "getrange",     "setrange",    "substr",
         "expire",     "pexpire",      "expireat",     "pexpireat",    "persist",     "ttl",
         "pttl",       "expiretime",   "pexpiretime",  "type",         "dump",        "restore",
         "hget",       "hset",         "hsetnx",       "hmset",        "hmget",       "hdel",
         "hlen",       "hexists",      "hkeys",        "hvals",        "hgetall",     "hincrby",
         "hincrbyfloat", "hstrlen",    "hrandfield",   "hscan",        "lpush",       "rpush",
         "lpushx",     "rpushx",       "lpop",         "rpop",         "llen",        "lrange",
         "lindex",     "lset",         "lrem",         "ltrim",        "linsert",     "lpos",
         "sadd",       "srem",         "smembers",     "sismember",    "smismember",  "scard",
         "spop",       "srandmember",  "sscan",        "zadd",         "zrem",        "zcard",
         "zscore",     "zmscore",      "zincrby",      "zrank",        "zrevrank",    "zrange",
         "zrangebyscore", "zrevrangebyscore", "zrevrange", "zrangebylex", "zrevrangebylex", "zcount",
         "zlexcount",  "zremrangebyscore", "zremrangebyrank", "zremrangebylex", "zpopmin", "zpopmax",
         "zrandmember", "zscan",       "xadd",         "xrange",       "xrevrange",   "xlen",
         "xack",       "xdel",         "xtrim",        "xautoclaim",   "xclaim",      "xpending",
         "xsetid",     "pfadd",        "setbit",       "getbit",       "bitcount",    "bitpos",
         "bitfield",   "bitfield_ro",  "geoadd",       "geopos",       "geodist",     "geohash",
         "geosearch",  "sort_ro",      "lcs"},
        Spec{});
    add({"del", "unlink", "exists", "touch", "mget", "sinter", "sunion", "sdiff", "pfcount", "sinterstore",
         "sunionstore", "sdiffstore", "pfmerge"},
        Spec{KeyRole::Keyed, 1, -1, 1});
    add({"mset", "msetnx"}, Spec{KeyRole::Keyed, 1, -1, 2});
    add({"rename", "renamenx", "copy", "smove", "lmove", "rpoplpush", "zrangestore", "geosearchstore"},
        Spec{KeyRole::Keyed, 1, 2, 1});
    Spec numkeys2;
    numkeys2.special = Spec::Special::NumKeysAt2;
    add({"eval", "evalsha", "eval_ro", "evalsha_ro", "fcall", "fcall_ro"}, numkeys2);
    Spec numkeys1;
    numkeys1.special = Spec::Special::NumKeysAt1;
    add({"zunion", "zinter", "zdiff", "zintercard", "sintercard", "lmpop", "zmpop"}, numkeys1);
    Spec dest;
    dest.special = Spec::Special::DestNumKeysAt2;
    add({"zunionstore", "zinterstore", "zdiffstore"}, dest);
    Spec streams;
    streams.special = Spec::Special::Streams;
    add({"xread", "xreadgroup"}, streams);
    Spec sub;
    sub.special = Spec::Special::SubKeyAt2;
    add({"xgroup", "xinfo", "object"}, sub);
    Spec memory;
    memory.special = Spec::Special::MemoryUsage;
    add({"memory"}, memory);
    add({"ping", "echo"}, Spec{KeyRole::Free});
    add({"wait", "waitaof", "exec", "discard"}, Spec{KeyRole::JoinBefore});
    add({"time", "multi"}, Spec{KeyRole::JoinAfter});
    add({"keys", "scan", "dbsize", "flushall", "flushdb", "info", "randomkey", "config", "cluster", "debug", "script",
         "slowlog", "latency", "lastsave", "save", "bgsave", "bgrewriteaof", "client", "command", "function",
         "swapdb", "move", "role", "lolwut"},
        Spec{KeyRole::NodeOnly});
    return m;
  }();
  return *t;
}

void take(const std::vector<std::string>& args, int first, int last, int step, std::vector<std::string_view>& keys) {
  const int n = static_cast<int>(args.size());
  if (last < 0) last = n + last;
  for (int i = first; i <= last && i < n; i += step) keys.emplace_back(args[static_cast<std::size_t>(i)]);
}

int numkeys(const std::vector<std::string>& args, std::size_t at) {
  if (args.size() <= at) return 0;
  auto v = parse_int64(args[at]);
  if (!v || *v < 0 || static_cast<std::size_t>(*v) > args.size()) return 0;
  return static_cast<int>(*v);
}

}  // namespace

KeyRole keys_of(const Request& request, std::vector<std::string_view>& keys) {
  if (const auto* s = std::get_if<ScriptCall>(&request)) {
    for (const auto& k : s->keys) keys.emplace_back(k);
    return s->keys.empty() ? KeyRole::Free : KeyRole::Keyed;
  }
  const auto& args = std::get<Command>(request).args;
  if (args.empty()) throw InvalidArgument("empty command");
  const auto& t = table();
  // What counters and limiters send in every call, found without hashing a lowered copy.
  static const std::pair<std::string_view, const Spec*> common[] = {
      {"incrby", &t.at("incrby")}, {"pexpireat", &t.at("pexpireat")}, {"evalsha", &t.at("evalsha")},
      {"get", &t.at("get")},       {"multi", &t.at("multi")},         {"exec", &t.at("exec")},
  };
  const Spec* found = nullptr;
  for (const auto& [name, candidate] : common) {
    if (ascii_iequals(args[0], name)) {
      found = candidate;
      break;
    }
  }
  if (found == nullptr) {
    auto it = t.find(ascii_lower(args[0]));
    if (it == t.end()) return KeyRole::Unknown;
    found = &it->second;
  }
  const Spec& spec = *found;
  if (spec.role != KeyRole::Keyed) return spec.role;
  const std::size_t before = keys.size();
  switch (spec.special) {
    case Spec::Special::None:
      take(args, spec.first, spec.last, spec.step, keys);
      break;
    case Spec::Special::NumKeysAt2:
      take(args, 3, 2 + numkeys(args, 2), 1, keys);
      break;
    case Spec::Special::NumKeysAt1:
      take(args, 2, 1 + numkeys(args, 1), 1, keys);
      break;
    case Spec::Special::DestNumKeysAt2:
      take(args, 1, 1, 1, keys);
      take(args, 3, 2 + numkeys(args, 2), 1, keys);
      break;
    case Spec::Special::Streams:
      for (std::size_t i = 1; i < args.size(); ++i) {
        if (ascii_lower(args[i]) == "streams") {
          const std::size_t rest = args.size() - i - 1;
          take(args, static_cast<int>(i + 1), static_cast<int>(i + rest / 2), 1, keys);
          break;
        }
      }
      break;
    case Spec::Special::SubKeyAt2:
      take(args, 2, 2, 1, keys);
      break;
    case Spec::Special::MemoryUsage:
      if (args.size() >= 2 && ascii_lower(args[1]) == "usage") {
        take(args, 2, 2, 1, keys);
      } else {
        return KeyRole::NodeOnly;
      }
      break;
  }
  return keys.size() > before ? KeyRole::Keyed : KeyRole::Free;
}

}  // namespace redcount
