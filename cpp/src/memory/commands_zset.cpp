// The memory store's sorted-set commands (ZADD, ZCARD, ZCOUNT, ZRANGE, ZRANGEBYSCORE,
// ZREMRANGEBYSCORE, ZREM, ZSCORE...), parsed and answered as Redis does.
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

// A score as ZADD reads it (Redis string2d): strtod over the whole argument, no leading
// space, no NaN, no overflow to infinity or underflow to zero ("inf" itself is fine).
std::optional<double> parse_score(const std::string& s) {
  if (s.empty() || std::isspace(static_cast<unsigned char>(s[0]))) return std::nullopt;
  errno = 0;
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  if (end != s.c_str() + s.size() || std::isnan(v)) return std::nullopt;
  if (errno == ERANGE && (std::isinf(v) || v == 0.0)) return std::nullopt;
  return v;
}

// A score interval of ZCOUNT, ZRANGEBYSCORE and ZREMRANGEBYSCORE.
// One end of a score range as Redis reads it (zslParseRange): an optional '(' for an
// exclusive end, then strtod up to the first NUL. That is laxer than ZADD: leading
// space and overflow to +-inf pass, and an empty bound reads as 0.
bool parse_bound(const std::string& s, double& value, bool& exclusive) {
  const char* p = s.c_str();
  exclusive = *p == '(';
  if (exclusive) ++p;
  char* end = nullptr;
  value = std::strtod(p, &end);
  return *end == '\0' && !std::isnan(value);
}

MemoryScoreRange parse_range(const std::string& min, const std::string& max) {
  MemoryScoreRange r;
  if (!parse_bound(min, r.min, r.minex) || !parse_bound(max, r.max, r.maxex)) throw ReplyError(kBadRange);
  return r;
}

// A score in a reply, as Redis 7.0 writes one over RESP2 (addReplyDouble: "%.17g", with
// infinities spelled "inf" and "-inf").
std::string format_score(double d) {
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  char buf[40];
  const int len = std::snprintf(buf, sizeof buf, "%.17g", d);
  return std::string(buf, static_cast<std::size_t>(len));
}

Reply scored_members_reply(std::vector<Keyspace::ScoredMember> items, bool withscores) {
  std::vector<Reply> out;
  out.reserve(items.size() * (withscores ? 2 : 1));
  for (auto& [member, score] : items) {
    out.push_back(Reply::of_string(std::move(member)));
    if (withscores) out.push_back(Reply::of_string(format_score(score)));
  }
  return Reply::of_array(std::move(out));
}

}  // namespace

std::optional<Reply> MemoryStore::run_zset_command(Ops& ops, const std::string& cmd,
                                                   const std::vector<std::string>& args) {
  // Argument errors come before the key is looked at, in the order Redis reports them.
  const std::size_t n = args.size();
  if (cmd == "ZADD") {
    if (n < 4) return wrong_args(cmd);
    Ops::ZAddFlags f;
    bool ch = false, incr = false;
    std::size_t i = 2;
    for (; i < n; ++i) {
      const std::string opt = upper(args[i]);
      if (opt == "NX") f.nx = true;
      else if (opt == "XX") f.xx = true;
      else if (opt == "GT") f.gt = true;
      else if (opt == "LT") f.lt = true;
      else if (opt == "CH") ch = true;
      else if (opt == "INCR") incr = true;
      else break;
    }
    const std::size_t pairs = (n - i) / 2;
    if (i == n || (n - i) % 2 != 0) return Reply::of_error(kSyntax);
    if (f.nx && f.xx) return Reply::of_error("ERR XX and NX options at the same time are not compatible");
    if ((f.nx && (f.gt || f.lt)) || (f.gt && f.lt)) {
      return Reply::of_error("ERR GT, LT, and/or NX options at the same time are not compatible");
    }
    if (incr && pairs > 1) return Reply::of_error("ERR INCR option supports a single increment-element pair");
    if (incr) return Reply::of_error("ERR the memory:// store does not support ZADD INCR; use ZSCORE and ZADD");
    std::vector<double> scores;
    scores.reserve(pairs);
    for (std::size_t j = i; j < n; j += 2) {
      auto score = parse_score(args[j]);
      if (!score) return Reply::of_error(kNotFloat);
      scores.push_back(*score);
    }
    ZSet* z = ops.find_as<ZSet>(args[1]);
    if (!z) {
      if (f.xx) return Reply::of_integer(0);  // XX never creates the key
      z = &ops.find_or_create<ZSet>(args[1]);
    }
    std::int64_t added = 0, rescored = 0;
    for (std::size_t p = 0; p < pairs; ++p) {
      switch (Ops::zset_add(*z, scores[p], args[i + 2 * p + 1], f)) {
        case Ops::ZAdded::kAdded: ++added; break;
        case Ops::ZAdded::kRescored: ++rescored; break;
        case Ops::ZAdded::kNothing: break;
      }
    }
    return Reply::of_integer(ch ? added + rescored : added);
  }
  if (cmd == "ZREM") {
    if (n < 3) return wrong_args(cmd);
    std::int64_t removed = 0;
    for (std::size_t i = 2; i < n; ++i) removed += ops.zrem(args[1], args[i]);
    return Reply::of_integer(removed);
  }
  if (cmd == "ZCARD") {
    if (n != 2) return wrong_args(cmd);
    return Reply::of_integer(ops.zcard(args[1]));
  }
  if (cmd == "ZSCORE") {
    if (n != 3) return wrong_args(cmd);
    auto score = ops.zscore(args[1], args[2]);
    return score ? Reply::of_string(format_score(*score)) : Reply::nil();
  }
  if (cmd == "ZCOUNT") {
    if (n != 4) return wrong_args(cmd);
    return Reply::of_integer(ops.zcount(args[1], parse_range(args[2], args[3])));
  }
  if (cmd == "ZREMRANGEBYSCORE") {
    if (n != 4) return wrong_args(cmd);
    return Reply::of_integer(ops.zremrangebyscore(args[1], parse_range(args[2], args[3])));
  }
  if (cmd == "ZRANGE" || cmd == "ZRANGEBYSCORE") {
    if (n < 4) return wrong_args(cmd);
    const bool by_score = cmd == "ZRANGEBYSCORE";
    bool withscores = false;
    std::int64_t offset = 0, count = -1;
    for (std::size_t i = 4; i < n; ++i) {
      const std::string opt = upper(args[i]);
      if (opt == "WITHSCORES") {
        withscores = true;
      } else if (opt == "LIMIT" && n - i > 2) {
        offset = int64_arg(args[i + 1]);
        count = int64_arg(args[i + 2]);
        i += 2;
      } else if (!by_score && (opt == "BYSCORE" || opt == "BYLEX" || opt == "REV")) {
        return Reply::of_error("ERR syntax error, the memory:// store supports ZRANGE by rank only; "
                               "use ZRANGEBYSCORE");
      } else {
        return Reply::of_error(kSyntax);
      }
    }
    if (by_score) {
      const MemoryScoreRange range = parse_range(args[2], args[3]);
      return scored_members_reply(ops.zrangebyscore(args[1], range, offset, count), withscores);
    }
    if (count != -1) {  // Redis's own check, which lets "LIMIT x -1" through
      return Reply::of_error("ERR syntax error, LIMIT is only supported in combination with either BYSCORE or BYLEX");
    }
    const std::int64_t start = int64_arg(args[2]);
    const std::int64_t stop = int64_arg(args[3]);
    return scored_members_reply(ops.zrange(args[1], start, stop), withscores);
  }
  return std::nullopt;
}

}  // namespace redcount
