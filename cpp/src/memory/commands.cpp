// The memory store's command interpreter: the commands redcount sends (GET, SET NX PXAT,
// INCRBY, PTTL, PEXPIREAT, DEL, TIME, the sorted-set and hash commands its strategies use)
// plus the debugging subset listed in memory_store.h, parsed as Redis parses them and run
// on the keyspace (memory/keyspace.h).
//
//   Reply r = run_command(ops, {"SET", "k", "0", "NX", "PXAT", "1700000000000"});
//
// Runs under the store's lock, like the keyspace.
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

namespace {

// Redis-style glob matching for KEYS: * ? [abc] [^a] [a-z] and \ escapes.
bool glob_match(std::string_view p, std::string_view s) {
  std::size_t pi = 0, si = 0, star_p = std::string_view::npos, star_s = 0;
  auto match_class = [&](std::size_t& i, char c) {
    // p[i] == '['; returns whether c matches and leaves i after ']'.
    ++i;
    bool negate = i < p.size() && p[i] == '^';
    if (negate) ++i;
    bool hit = false;
    while (i < p.size() && p[i] != ']') {
      if (p[i] == '\\' && i + 1 < p.size()) {
        ++i;
        hit |= p[i] == c;
      } else if (i + 2 < p.size() && p[i + 1] == '-' && p[i + 2] != ']') {
        char lo = std::min(p[i], p[i + 2]), hi = std::max(p[i], p[i + 2]);
        hit |= c >= lo && c <= hi;
        i += 2;
      } else {
        hit |= p[i] == c;
      }
      ++i;
    }
    if (i < p.size()) ++i;  // skip ']'
    return negate ? !hit : hit;
  };
  while (si < s.size()) {
    if (pi < p.size() && p[pi] == '*') {
      star_p = pi++;
      star_s = si;
      continue;
    }
    if (pi < p.size()) {
      std::size_t next = pi;
      bool ok = false;
      if (p[pi] == '?') {
        ok = true;
        next = pi + 1;
      } else if (p[pi] == '[') {
        ok = match_class(next, s[si]);
      } else if (p[pi] == '\\' && pi + 1 < p.size()) {
        ok = p[pi + 1] == s[si];
        next = pi + 2;
      } else {
        ok = p[pi] == s[si];
        next = pi + 1;
      }
      if (ok) {
        pi = next;
        ++si;
        continue;
      }
    }
    if (star_p == std::string_view::npos) return false;
    pi = star_p + 1;
    si = ++star_s;
  }
  while (pi < p.size() && p[pi] == '*') ++pi;
  return pi == p.size();
}

}  // namespace

Reply MemoryStore::run_command(Ops& ops, const std::vector<std::string>& args) {
  if (args.empty()) return Reply::of_error("ERR empty command");
  const std::string cmd = upper(args[0]);
  const std::size_t n = args.size();
  auto int_arg = [&](std::size_t i) -> std::int64_t {
    auto v = parse_int64(args[i]);
    if (!v) throw ReplyError(kNotInteger);
    return *v;
  };

  if (cmd == "PING") {
    if (n == 1) return Reply::of_status("PONG");
    if (n == 2) return Reply::of_string(args[1]);
    return wrong_args(cmd);
  }
  if (cmd == "TIME") {
    if (n != 1) return wrong_args(cmd);
    const std::int64_t now = ops.now_ms();
    return Reply::of_array({Reply::of_string(to_string(now / 1000)),
                            Reply::of_string(to_string((now % 1000) * 1000))});
  }
  if (cmd == "GET") {
    if (n != 2) return wrong_args(cmd);
    auto v = ops.get(args[1]);
    return v ? Reply::of_string(std::move(*v)) : Reply::nil();
  }
  if (cmd == "SET") {
    if (n < 3) return wrong_args(cmd);
    bool nx = false, xx = false, keepttl = false;
    std::int64_t at = 0;
    bool have_expiry = false;
    for (std::size_t i = 3; i < n; ++i) {
      const std::string opt = upper(args[i]);
      if (opt == "NX" && !xx) {
        nx = true;
      } else if (opt == "XX" && !nx) {
        xx = true;
      } else if (opt == "KEEPTTL" && !have_expiry) {
        keepttl = true;
      } else if ((opt == "EX" || opt == "PX" || opt == "EXAT" || opt == "PXAT") && !have_expiry &&
                 !keepttl && i + 1 < n) {
        std::int64_t v = int_arg(++i);
        const bool seconds = opt == "EX" || opt == "EXAT";
        if (v <= 0 || (seconds && v > std::numeric_limits<std::int64_t>::max() / 1000)) {
          return Reply::of_error("ERR invalid expire time in 'set' command");
        }
        if (seconds) v *= 1000;
        if (opt == "EX" || opt == "PX") {
          if (v > std::numeric_limits<std::int64_t>::max() - ops.now_ms()) {
            return Reply::of_error("ERR invalid expire time in 'set' command");
          }
          v += ops.now_ms();
        }
        at = v;
        have_expiry = true;
      } else {
        return Reply::of_error(kSyntax);
      }
    }
    return ops.set(args[1], args[2], nx, xx, at, keepttl) ? Reply::of_status("OK") : Reply::nil();
  }
  if (cmd == "INCR" || cmd == "DECR") {
    if (n != 2) return wrong_args(cmd);
    return Reply::of_integer(ops.incrby(args[1], cmd == "INCR" ? 1 : -1));
  }
  if (cmd == "INCRBY" || cmd == "DECRBY") {
    if (n != 3) return wrong_args(cmd);
    std::int64_t amount = int_arg(2);
    if (cmd == "DECRBY") {
      if (amount == std::numeric_limits<std::int64_t>::min()) {
        return Reply::of_error("ERR decrement would overflow");
      }
      amount = -amount;
    }
    return Reply::of_integer(ops.incrby(args[1], amount));
  }
  if (cmd == "DEL" || cmd == "UNLINK" || cmd == "EXISTS") {
    if (n < 2) return wrong_args(cmd);
    std::int64_t count = 0;
    for (std::size_t i = 1; i < n; ++i) {
      count += cmd == "EXISTS" ? (ops.find(args[i]) != nullptr) : ops.del(args[i]);
    }
    return Reply::of_integer(count);
  }
  if (cmd == "TYPE") {
    if (n != 2) return wrong_args(cmd);
    return Reply::of_status(ops.type_of(args[1]));
  }
  if (cmd == "PTTL" || cmd == "TTL") {
    if (n != 2) return wrong_args(cmd);
    std::int64_t ms = ops.pttl(args[1]);
    if (ms < 0 || cmd == "PTTL") return Reply::of_integer(ms);
    return Reply::of_integer((ms + 500) / 1000);  // Redis rounds TTL to the nearest second
  }
  if (cmd == "PEXPIREAT" || cmd == "PEXPIRE" || cmd == "EXPIREAT" || cmd == "EXPIRE") {
    if (n < 3) return wrong_args(cmd);
    std::int64_t v = int_arg(2);
    const bool seconds = cmd == "EXPIREAT" || cmd == "EXPIRE";
    const bool relative = cmd == "PEXPIRE" || cmd == "EXPIRE";
    const std::int64_t lim = std::numeric_limits<std::int64_t>::max();
    if (seconds && (v > lim / 1000 || v < -lim / 1000)) {
      return Reply::of_error("ERR invalid expire time in '" + ascii_lower(cmd) + "' command");
    }
    if (seconds) v *= 1000;
    if (relative) {
      if ((v > 0 && v > lim - ops.now_ms())) {
        return Reply::of_error("ERR invalid expire time in '" + ascii_lower(cmd) + "' command");
      }
      v += ops.now_ms();
    }
    bool nx = false, xx = false, gt = false, lt = false;
    for (std::size_t i = 3; i < n; ++i) {
      const std::string opt = upper(args[i]);
      if (opt == "NX") nx = true;
      else if (opt == "XX") xx = true;
      else if (opt == "GT") gt = true;
      else if (opt == "LT") lt = true;
      else return Reply::of_error("ERR Unsupported option " + args[i]);
    }
    if (nx && (xx || gt || lt)) {
      return Reply::of_error("ERR NX and XX, GT or LT options at the same time are not compatible");
    }
    if (gt && lt) return Reply::of_error("ERR GT and LT options at the same time are not compatible");
    const std::int64_t cur = ops.pttl(args[1]);
    if (cur == -2) return Reply::of_integer(0);
    const bool has_ttl = cur >= 0;
    const std::int64_t cur_at = has_ttl ? ops.now_ms() + cur : 0;
    if (nx && has_ttl) return Reply::of_integer(0);
    if (xx && !has_ttl) return Reply::of_integer(0);
    if (gt && (!has_ttl || v <= cur_at)) return Reply::of_integer(0);  // no TTL counts as infinite
    if (lt && has_ttl && v >= cur_at) return Reply::of_integer(0);
    return Reply::of_integer(ops.pexpireat(args[1], v) ? 1 : 0);
  }
  if (cmd == "PERSIST") {
    if (n != 2) return wrong_args(cmd);
    return Reply::of_integer(ops.persist(args[1]) ? 1 : 0);
  }
  if (cmd == "DBSIZE") {
    if (n != 1) return wrong_args(cmd);
    std::int64_t live = 0;
    for (auto& [k, e] : data_) live += (e.expire_at == 0 || e.expire_at > ops.now_ms());
    return Reply::of_integer(live);
  }
  if (cmd == "KEYS") {
    if (n != 2) return wrong_args(cmd);
    std::vector<Reply> keys;
    for (auto& [k, e] : data_) {
      if ((e.expire_at == 0 || e.expire_at > ops.now_ms()) && glob_match(args[1], k)) {
        keys.push_back(Reply::of_string(k));
      }
    }
    return Reply::of_array(std::move(keys));
  }
  if (cmd == "WAIT") {
    // No replicas here: like a Redis master without replicas, nobody acknowledges (Redis
    // would first wait out the timeout; nothing can arrive, so this answers at once).
    if (n != 3) return wrong_args(cmd);
    if (int_arg(1) < 0 || int_arg(2) < 0) return Reply::of_error("ERR timeout is negative");
    return Reply::of_integer(0);
  }
  if (cmd == "FLUSHALL" || cmd == "FLUSHDB") {
    ops.forget();
    data_.clear();
    expiry_.clear();
    return Reply::of_status("OK");
  }
  if (!cmd.empty() && cmd[0] == 'Z') {
    if (auto reply = run_zset_command(ops, cmd, args)) return std::move(*reply);
  }
  if (!cmd.empty() && cmd[0] == 'H') {
    if (auto reply = run_hash_command(ops, cmd, args)) return std::move(*reply);
  }
  if (!cmd.empty() && cmd[0] == 'X') {
    if (auto reply = run_stream_command(ops, cmd, args)) return std::move(*reply);
  }
  std::string shown;
  for (std::size_t i = 1; i < n && i < 4; ++i) shown += "'" + args[i] + "' ";
  return Reply::of_error("ERR unknown command '" + args[0] + "', with args beginning with: " + shown);
}

}  // namespace redcount
