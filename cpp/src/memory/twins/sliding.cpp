// The memory store's native twins of sliding_log.lua, sliding_approx.lua (the sliding-window
// limiters) and sliding_counter.lua (the sliding-window counter): the same reads and writes on
// the keyspace, in C++. Keep each in step with its Lua file; the parity tests run both against
// the same inputs.
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>
#include <charconv>
#include <limits>

#include "memory/twins/twins.h"
#include "redcount/common/bounds.h"
#include "redcount/common/errors.h"
#include "redcount/common/util.h"
#include "store/script_args.h"

namespace redcount::twins {

using detail::ceil_div;
using detail::exceeds;
using detail::remaining_of;

// Writes the integers to `out`; false for arguments the strategy never sends.
// `fresh_ids`: the members' id is this process's own (the typed path), so no member can
// already be in a set and ZADD may skip the membership check.
bool sliding_log_core(Keyspace& ks, const std::vector<std::string>& keys, std::int64_t now, const LogArgs& c,
                      std::string_view uid, bool fresh_ids, detail::Ints& out) {
  constexpr double kInf = std::numeric_limits<double>::infinity();
  const std::size_t n = keys.size();
  detail::SmallVec<std::int64_t, 8> counts;
  counts.assign(n, 0);
  bool allowed = true;
  for (std::size_t i = 0; i < n; ++i) {
    const double from = static_cast<double>(now - c.window[i] + 1);
    if (c.hit) {
      ks.or_reset(keys[i], [&] { return ks.zremrangebyscore(keys[i], -kInf, from - 1); });
      counts[i] = ks.zcard(keys[i]);
    } else {
      counts[i] = static_cast<std::int64_t>(
          ks.or_reset(keys[i], [&] { return ks.zrangebyscore(keys[i], from, kInf); }).size());
    }
    if (counts[i] + c.cost > c.amount[i]) allowed = false;
  }
  out.clear();
  out.push_back(now);
  out.push_back(allowed ? 1 : 0);
  // Members only need to be unique: unlike the Lua twin, the memory store leaves the time
  // out of them, so that with a compact id they fit std::string's inline buffer.
  std::string member(uid);
  member += ':';
  const std::size_t stem = member.size();
  const std::int64_t stamp_at = c.stamp_at ? *c.stamp_at : now;
  // Until the newest entry leaves the window (a lease's, stamped ahead, may be newer).
  auto keep = [&](const std::string& key, std::int64_t window) {
    const auto newest = static_cast<std::int64_t>(ks.zrange(key, -1, -1).at(0).second);
    return std::max(window, newest - now + window);
  };
  for (std::size_t i = 0; i < n; ++i) {
    const double from = static_cast<double>(now - c.window[i] + 1);
    std::int64_t need_at = 0;
    if (allowed && c.hit) {
      for (std::int64_t m = 1; m <= c.cost; ++m) {
        member.resize(stem);
        member += std::to_string(m);
        if (fresh_ids) {
          ks.zadd_unique(keys[i], static_cast<double>(stamp_at), member);
        } else {
          ks.zadd(keys[i], static_cast<double>(stamp_at), member);
        }
      }
      counts[i] += c.cost;
      ks.pexpireat(keys[i], ks.now_ms() + keep(keys[i], c.window[i]));
    } else {
      if (c.hit && counts[i] > 0) ks.hold_expiry(keys[i], ks.now_ms() + keep(keys[i], c.window[i]));
      if (counts[i] + c.cost > c.amount[i]) {
        const std::int64_t need = counts[i] + c.cost - c.amount[i];
        auto gone = ks.zrangebyscore(keys[i], from, kInf, need);
        if (static_cast<std::int64_t>(gone.size()) != need) return false;  // cost > amount
        need_at = static_cast<std::int64_t>(gone.back().second) + c.window[i];
      }
    }
    std::int64_t newest = 0;
    if (allowed && c.hit) {
      newest = stamp_at;
    } else if (counts[i] > 0) {
      newest = static_cast<std::int64_t>(ks.zrange(keys[i], -1, -1).at(0).second);
    }
    out.push_back(counts[i]);
    out.push_back(newest);
    out.push_back(need_at);
  }
  return true;
}

Reply to_reply(bool ok, const detail::Ints& v, std::string_view script) {
  if (!ok) return detail::malformed(script);
  return detail::int_array(v);
}

// The memory store's twin of sliding_log.lua, as a script.
Reply native_sliding_log(Keyspace& ks, const std::vector<std::string>& keys, const std::vector<std::string>& args) {
  const std::size_t n = keys.size();
  if (args.size() != 4 + 2 * n) return detail::malformed("sliding_log");
  auto now = detail::script_time(ks, args[0]);
  auto cost = detail::arg_in(args[2], 1, detail::kMaxMembersPerCall);
  if (!now || !cost) return detail::malformed("sliding_log");
  LogArgs c;
  c.hit = args[1] == "hit";
  if (args[1].starts_with("lease:")) {
    // A lease's hit: entries stamped at a time >= now (sliding_log.lua).
    auto at = detail::arg_in(args[1].substr(6), *now, kMaxExact);
    if (!at) return detail::malformed("sliding_log");
    c.hit = true;
    c.stamp_at = *at;
  }
  c.cost = *cost;
  for (std::size_t i = 0; i < n; ++i) {
    auto a = detail::arg_in(args[4 + 2 * i], 1, detail::kMaxMembers);
    auto w = detail::arg_in(args[5 + 2 * i], 1, detail::kMaxScriptSpanMs);
    if (!a || !w) return detail::malformed("sliding_log");
    c.amount.push_back(*a);
    c.window.push_back(*w);
  }
  detail::Ints out;
  const bool ok = sliding_log_core(ks, keys, *now, c, args[3], false, out);
  return to_reply(ok, out, "sliding_log");
}

// The typed twin: the same core with no text to parse; members take the short in-process
// form of the id (unique within this process, which is all an in-process store needs).
Reply typed_sliding_log(Keyspace& ks, const std::vector<std::string>& keys, const ScriptArgs& args) {
  const auto& c = static_cast<const LogArgs&>(args);
  if (c.amount.size() != keys.size() || c.window.size() != keys.size()) return detail::malformed("sliding_log");
  const std::string uid = c.id.local();
  return c.answer_with(sliding_log_core(ks, keys, c.now ? *c.now : ks.now_ms(), c, uid, true, c.ints), "sliding_log");
}

bool sliding_approx_core(Keyspace& ks, const std::vector<std::string>& keys, detail::Ints& out,
                                                             std::int64_t now, const ApproxArgs& call) {
  using detail::sat_add;
  using detail::sat_mul;
  const std::size_t n = keys.size();
  // The reply: now, allowed, then k+1 counts per limit (sub-buckets cur-k .. cur).
  std::size_t size = 2;
  for (const auto& l : call.limits) size += static_cast<std::size_t>(l.k + 1);
  out.assign(size, 0);
  out[0] = now;
  bool allowed = true;
  std::vector<std::string> stale;
  for (std::size_t i = 0, at = 2; i < n; at += static_cast<std::size_t>(call.limits[i].k + 1), ++i) {
    const std::int64_t bucket = call.limits[i].bucket, k = call.limits[i].k;
    const std::int64_t cur = now / bucket;
    std::int64_t* c = out.data() + at;
    struct Visit {
      std::int64_t* c;
      std::int64_t cur, k;
      bool hit;
      std::vector<std::string>* stale;
    } visit{c, cur, k, call.hit, &stale};
    ks.or_reset(keys[i], [&] {  // a foreign value of another type is garbage: start afresh
      ks.hvisit(keys[i], &visit, [](void* p, std::string_view field, std::string_view value) {
        auto* v = static_cast<Visit*>(p);
        auto idx = parse_int64(field);
        auto count = parse_int64(value);
        if (idx && count && *idx >= v->cur - v->k && *idx <= v->cur) {
          v->c[*idx - v->cur + v->k] = *count;
        } else if (v->hit && (!idx || !count || *idx < v->cur - v->k)) {
          v->stale->emplace_back(field);  // a sub-bucket that left the window
        }
      });
    });
    for (const auto& field : stale) ks.hdel(keys[i], field);
    stale.clear();
    std::int64_t scaled = sat_mul(c[0], bucket - (now - cur * bucket));
    for (std::int64_t off = 1; off <= k; ++off) scaled = sat_add(scaled, sat_mul(c[off], bucket));
    if (sat_add(scaled, sat_mul(call.cost, bucket)) > sat_mul(call.limits[i].amount, bucket)) allowed = false;
  }
  out[1] = allowed ? 1 : 0;
  for (std::size_t i = 0, at = 2; i < n; at += static_cast<std::size_t>(call.limits[i].k + 1), ++i) {
    const std::int64_t bucket = call.limits[i].bucket, k = call.limits[i].k;
    const std::int64_t cur = now / bucket;
    const std::int64_t ttl = (cur + k + 1) * bucket - now;
    if (allowed && call.hit) {
      char field[24];
      const auto len = static_cast<std::size_t>(std::to_chars(field, field + sizeof field, cur).ptr - field);
      out[at + static_cast<std::size_t>(k)] = ks.hincrby(keys[i], std::string(field, len), call.cost);
      ks.pexpireat(keys[i], ks.now_ms() + ttl);
    } else if (call.hit) {
      ks.hold_expiry(keys[i], ks.now_ms() + ttl);
    }
  }
  return true;
}

// The memory store's twin of sliding_approx.lua, as a script.
Reply native_sliding_approx(Keyspace& ks, const std::vector<std::string>& keys,
                            const std::vector<std::string>& args) {
  const std::size_t n = keys.size();
  if (args.size() != 3 + 3 * n) return detail::malformed("sliding_approx");
  auto now = detail::script_time(ks, args[0]);
  auto cost = detail::arg_in(args[2], 1, detail::kMaxExact);
  if (!now || !cost) return detail::malformed("sliding_approx");
  ApproxArgs call;
  call.hit = args[1] == "hit";
  call.cost = *cost;
  for (std::size_t i = 0; i < n; ++i) {
    auto amount = detail::arg_in(args[3 + 3 * i], 1, detail::kMaxExact);
    auto bucket = detail::arg_in(args[4 + 3 * i], 1, detail::kMaxScriptSpanMs);
    auto k = detail::arg_in(args[5 + 3 * i], 1, kMaxSubBuckets);
    if (!amount || !bucket || !k) return detail::malformed("sliding_approx");
    call.limits.push_back({*amount, *bucket, *k});
  }
  detail::Ints out;
  const bool ok = sliding_approx_core(ks, keys, out, *now, call);
  return to_reply(ok, out, "sliding_approx");
}

// The typed twin: the same core with no text to parse.
Reply typed_sliding_approx(Keyspace& ks, const std::vector<std::string>& keys, const ScriptArgs& args) {
  const auto& c = static_cast<const ApproxArgs&>(args);
  if (c.limits.size() != keys.size()) return detail::malformed("sliding_approx");
  return c.answer_with(sliding_approx_core(ks, keys, c.ints, c.now ? *c.now : ks.now_ms(), c), "sliding_approx");
}

constexpr double kInf = std::numeric_limits<double>::infinity();

// The weight an event member carries beyond 1: "<time>:<id>*<amount>" -> amount - 1.
std::int64_t extra_of(const std::string& member) {
  auto star = member.rfind('*');
  if (star == std::string::npos) return 0;
  auto w = parse_int64(std::string_view(member).substr(star + 1));
  return w && *w > 1 ? *w - 1 : 0;
}

// The memory store's twin of sliding_counter.lua; keep the two in step.
Reply native_sliding_counter(Keyspace& ks, const std::vector<std::string>& keys,
                             const std::vector<std::string>& args) {
  if (args.size() != 5 || keys.empty()) return detail::malformed("sliding_counter");
  auto now = detail::script_time(ks, args[0]);
  auto window = detail::arg_in(args[2], 1, detail::kMaxScriptSpanMs);
  if (!now || !window) return detail::malformed("sliding_counter");
  const std::string& op = args[1];
  const std::int64_t cutoff = *now - *window;
  const double cut = static_cast<double>(cutoff);
  ks.or_reset(keys[0], [&] { return ks.zcard(keys[0]); });  // a foreign value of another type is garbage
  if (op == "unique") {
    ks.zremrangebyscore(keys[0], -kInf, cut);
    ks.zadd(keys[0], static_cast<double>(*now), args[3]);
    ks.pexpireat(keys[0], ks.now_ms() + *window);
    return Reply::of_integer(ks.zcard(keys[0]));
  }
  if (op == "count-unique") {
    return Reply::of_integer(static_cast<std::int64_t>(ks.zrangebyscore(keys[0], cut + 1, kInf).size()));
  }
  if (keys.size() != 2) return detail::malformed("sliding_counter");
  auto raw = ks.or_reset(keys[1], [&] { return ks.get(keys[1]); });
  if (raw && !parse_int64(*raw)) {  // garbage in the weight's place: no weight known
    ks.del(keys[1]);
    raw.reset();
  }
  std::int64_t extra = 0;
  if (raw) {
    extra = *parse_int64(*raw);
    for (const auto& [member, score] : ks.zrangebyscore(keys[0], -kInf, cut)) extra = detail::sat_sub(extra, extra_of(member));
  }
  if (op == "count") {
    return Reply::of_integer(
        detail::sat_add(static_cast<std::int64_t>(ks.zrangebyscore(keys[0], cut + 1, kInf).size()), extra));
  }
  if (op != "add") return detail::malformed("sliding_counter");
  auto amount = detail::arg_in(args[3], 1, kMaxSlidingAmount);
  if (!amount) return detail::malformed("sliding_counter");
  ks.zremrangebyscore(keys[0], -kInf, cut);
  std::string member = std::to_string(*now) + ":" + args[4];
  if (*amount > 1) {
    member += "*" + std::to_string(*amount);
    extra = detail::sat_add(extra, *amount - 1);
  }
  ks.zadd(keys[0], static_cast<double>(*now), member);
  ks.pexpireat(keys[0], ks.now_ms() + *window);
  if (extra > 0) {
    ks.del(keys[1]);
    ks.set_nx_pxat(keys[1], std::to_string(extra), ks.now_ms() + *window);
  } else if (raw) {
    ks.del(keys[1]);
  }
  return Reply::of_integer(detail::sat_add(ks.zcard(keys[0]), extra));
}

}  // namespace redcount::twins
