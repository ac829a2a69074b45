#include "redcount/redis/command_keys.h"

#include <string>
#include <unordered_map>

#include "redcount/common/slot.h"
#include "redcount/common/errors.h"
#include "redcount/common/util.h"

namespace redcount::redis {
namespace {

char lower(char c) { return (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c; }

// A command name in lowercase (ASCII; std::tolower's answer in the "C" locale, without a
// call per character: this runs for every request of a routed batch).
std::string lowered(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = lower(c);
  return out;
}

// `s` equals the lowercase `word`, ignoring ASCII case.
bool named(std::string_view s, std::string_view word) {
  if (s.size() != word.size()) return false;
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (lower(s[i]) != word[i]) return false;
  }
  return true;
}

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

std::string describe(const Request& r) {
  if (const auto* s = std::get_if<ScriptCall>(&r)) {
    std::string out("script '");
    out.append(s->script->name);
    out.push_back('\'');
    return out;
  }
  const auto& args = std::get<Command>(r).args;
  return printable(args[0], 32);
}

[[noreturn]] void cross_slot(const std::string& what, const std::vector<std::string_view>& keys) {
  std::string shown;
  for (std::size_t i = 0; i < keys.size() && i < 6; ++i) {
    if (i) shown += ", ";
    shown.push_back('\'');
    shown.append(printable(keys[i], 60));
    shown.append("' -> slot ");
    shown.append(std::to_string(key_slot(keys[i])));
  }
  if (keys.size() > 6) shown += ", ... (" + std::to_string(keys.size()) + " keys)";
  throw InvalidArgument(what + " has keys in more than one hash slot on a Redis Cluster (" + shown +
                        "); every key of one call must share a {hash tag}; nothing was sent");
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
  for (const auto& [name, s] : common) {
    if (named(args[0], name)) {
      found = s;
      break;
    }
  }
  if (found == nullptr) {
    auto it = t.find(lowered(args[0]));
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

std::vector<Unit> route_units(const std::vector<Request>& batch) {
  // Items: one request, or a whole transaction; each with its role and slot.
  struct Item {
    std::uint32_t begin, end, ask_at;
    KeyRole role;
    std::int32_t slot;
    bool transaction;
  };
  std::vector<Item> items;
  items.reserve(batch.size());
  std::vector<std::string_view> keys;
  std::vector<std::string_view> block_keys;
  std::int32_t block_slot = kAnySlot;
  std::int64_t block_begin = -1;
  const auto n = static_cast<std::uint32_t>(batch.size());
  // Neighbouring requests often name the same key (INCRBY k, PEXPIREAT k): its slot once.
  std::string_view last_key;
  std::int32_t last_slot = kAnySlot;
  auto slot_of = [&](std::string_view k) {
    if (last_slot == kAnySlot || k != last_key) {
      last_key = k;
      last_slot = static_cast<std::int32_t>(key_slot(k));
    }
    return last_slot;
  };
  for (std::uint32_t i = 0; i < n; ++i) {
    keys.clear();
    const KeyRole role = keys_of(batch[i], keys);
    if (role == KeyRole::Unknown) {
      std::string m("unknown command '");
      m.append(describe(batch[i]));
      m.append("' on a Redis Cluster store: redcount does not know where its keys are, so it cannot route it; run "
               "it on one node through store.nodes() (nothing was sent)");
      throw InvalidArgument(m);
    }
    if (role == KeyRole::NodeOnly) {
      throw InvalidArgument(ascii_lower(describe(batch[i])) +
                            " is about one node, not the whole Redis Cluster: run it on each node of "
                            "store.nodes() (nothing was sent)");
    }
    std::int32_t slot = kAnySlot;
    if (role == KeyRole::Keyed) {
      slot = slot_of(keys[0]);
      for (std::size_t k = 1; k < keys.size(); ++k) {
        if (static_cast<std::int32_t>(key_slot(keys[k])) != slot) {
          std::string what(std::holds_alternative<ScriptCall>(batch[i]) ? "a call to " : "the command ");
          what.append(describe(batch[i]));
          cross_slot(what, keys);
        }
      }
    }
    const auto* cmd = std::get_if<Command>(&batch[i]);
    const std::string_view name = cmd ? std::string_view(cmd->args[0]) : std::string_view();
    if (named(name, "multi")) {
      if (block_begin >= 0) throw InvalidArgument("MULTI inside MULTI: a transaction cannot be nested");
      block_begin = i;
      block_slot = kAnySlot;
      block_keys.clear();
      continue;
    }
    if (block_begin >= 0) {
      if (role == KeyRole::Keyed) {
        block_keys.insert(block_keys.end(), keys.begin(), keys.end());
        if (block_slot == kAnySlot) {
          block_slot = slot;
        } else if (slot != block_slot) {
          cross_slot("a transaction (MULTI ... EXEC)", block_keys);
        }
      }
      if (named(name, "exec") || named(name, "discard")) {
        const auto b = static_cast<std::uint32_t>(block_begin);
        items.push_back(Item{b, i + 1, b, block_slot == kAnySlot ? KeyRole::Free : KeyRole::Keyed, block_slot, true});
        block_begin = -1;
      }
      continue;
    }
    items.push_back(Item{i, i + 1, i, role, slot, false});
  }
  if (block_begin >= 0) {
    throw InvalidArgument("MULTI without EXEC or DISCARD in the same batch: a transaction must be sent whole");
  }

  std::vector<Unit> units;
  units.reserve(items.size());
  std::int64_t pending = -1;  // start of keyless requests waiting for the next keyed item
  for (const Item& it : items) {
    const bool keyed = it.role == KeyRole::Keyed;
    if (keyed) {
      Unit u;
      u.begin = pending >= 0 ? static_cast<std::uint32_t>(pending) : it.begin;
      u.end = it.end;
      u.slot = it.slot;
      u.ask_at = it.ask_at;
      u.transaction = it.transaction;
      units.push_back(u);
      pending = -1;
      continue;
    }
    if (it.role == KeyRole::JoinAfter || units.empty() || pending >= 0) {
      if (pending < 0) pending = it.begin;
      continue;
    }
    // Free or JoinBefore with a unit before it: joins that unit.
    units.back().end = it.end;
    units.back().transaction = units.back().transaction || it.transaction;
  }
  if (pending >= 0) {
    if (!units.empty()) {
      units.back().end = n;
    } else {
      Unit u;
      u.begin = static_cast<std::uint32_t>(pending);
      u.end = n;
      u.ask_at = u.begin;
      units.push_back(u);
    }
  }
  return units;
}

}  // namespace redcount::redis
