// The sliding-window limiters: the exact log and the weighted sub-bucket estimate.
#include <algorithm>
#include <charconv>
#include <limits>
#include <map>

#include "limiters/limiter_internal.h"
#include "redcount/common/errors.h"
#include "redcount/lua_scripts.h"
#include "redcount/common/window.h"

namespace redcount {
namespace {

using detail::ceil_div;
using detail::Outcome;

// ------------------------------------------------------------------ exact sliding log

// The exact log's decision on the memory store: sliding_log.lua's twin, keep the two in
// step. Returns the Lua reply's integers, or nullopt for arguments the strategy never sends.
struct LogArgs final : detail::TimedArgs {
  bool hit = false;
  std::int64_t cost = 0;
  detail::UniqueId id;
  detail::SmallVec<std::int64_t, 4> amount, window;
  std::vector<std::string> render() const override {
    std::vector<std::string> out{now_text(), hit ? "hit" : "test", std::to_string(cost), id.global()};
    for (std::size_t i = 0; i < amount.size(); ++i) {
      out.push_back(std::to_string(amount[i]));
      out.push_back(std::to_string(window[i]));
    }
    return out;
  }
};

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
  for (std::size_t i = 0; i < n; ++i) {
    const double from = static_cast<double>(now - c.window[i] + 1);
    std::int64_t need_at = 0;
    if (allowed && c.hit) {
      for (std::int64_t m = 1; m <= c.cost; ++m) {
        member.resize(stem);
        member += std::to_string(m);
        if (fresh_ids) {
          ks.zadd_unique(keys[i], static_cast<double>(now), member);
        } else {
          ks.zadd(keys[i], static_cast<double>(now), member);
        }
      }
      counts[i] += c.cost;
      ks.pexpireat(keys[i], ks.now_ms() + c.window[i]);
    } else {
      if (c.hit && counts[i] > 0) ks.hold_expiry(keys[i], ks.now_ms() + c.window[i]);
      if (counts[i] + c.cost > c.amount[i]) {
        const std::int64_t need = counts[i] + c.cost - c.amount[i];
        auto gone = ks.zrangebyscore(keys[i], from, kInf, need);
        if (static_cast<std::int64_t>(gone.size()) != need) return false;  // cost > amount
        need_at = static_cast<std::int64_t>(gone.back().second) + c.window[i];
      }
    }
    std::int64_t newest = 0;
    if (allowed && c.hit) {
      newest = now;
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

class SlidingLogRules final : public detail::ScriptedRules {
 public:
  using ScriptedRules::ScriptedRules;
  std::string_view name() const noexcept override { return "sliding-window"; }
  const Script& script() const noexcept override { return kSlidingLogScript; }
  std::int64_t max_cost() const noexcept override { return detail::kMaxMembersPerCall; }

  void check(const std::vector<RateLimit>& limits) const override {
    detail::require_limits(limits);
    detail::require_no_burst(limits, name());
    detail::require_members(limits, name());
    detail::require_span(limits, name());
  }

  std::string storage_key(const RateLimit& l, std::string_view key) const override {
    return detail::limiter_key(prefix_, "sw", l.amount, "", key, l.window_ms);
  }

  ScriptCall call(const std::vector<RateLimit>& limits, std::string_view key, std::int64_t cost, bool hit,
                  std::optional<std::int64_t> now) const override {
    auto args = std::make_shared<LogArgs>();
    args->now = now;
    args->hit = hit;
    args->cost = cost;
    args->id = detail::next_unique_id();
    ScriptCall c{&kSlidingLogScript, {}, {}};
    c.keys.reserve(limits.size());
    for (const auto& l : limits) {
      c.keys.push_back(storage_key(l, key));
      args->amount.push_back(l.amount);
      args->window.push_back(l.window_ms);
    }
    c.typed = std::move(args);
    return c;
  }

  std::size_t reply_size(const std::vector<RateLimit>& limits) const override { return 2 + 3 * limits.size(); }

  std::vector<Outcome> outcomes(const std::vector<RateLimit>& limits, std::int64_t,
                                const detail::Ints& v) const override {
    const std::int64_t now = v[0];
    std::vector<Outcome> outcomes;
    for (std::size_t i = 0; i < limits.size(); ++i) {
      const std::int64_t count = v[2 + 3 * i], newest = v[3 + 3 * i], need_at = v[4 + 3 * i];
      Outcome o;
      o.amount = limits[i].amount;
      o.count = count;
      o.remaining = detail::remaining_of(limits[i].amount, count);
      o.reset_after_ms = count > 0 ? std::max<std::int64_t>(0, newest + limits[i].window_ms - now) : 0;
      o.refuses = need_at > 0;
      o.retry_after_ms = o.refuses ? std::max<std::int64_t>(1, need_at - now) : 0;
      outcomes.push_back(o);
    }
    return outcomes;
  }
};

// ---------------------------------------------------------- approximate sliding window

// The approximate window's decision on the memory store: sliding_approx.lua's twin, keep
// the two in step. Returns the Lua reply's integers, or nullopt for bad arguments.
struct ApproxArgs final : detail::TimedArgs {
  struct Limit {
    std::int64_t amount, bucket, k;
  };
  bool hit = false;
  std::int64_t cost = 0;
  detail::SmallVec<Limit, 4> limits;
  std::vector<std::string> render() const override {
    std::vector<std::string> out{now_text(), hit ? "hit" : "test", std::to_string(cost)};
    for (const auto& l : limits) {
      out.push_back(std::to_string(l.amount));
      out.push_back(std::to_string(l.bucket));
      out.push_back(std::to_string(l.k));
    }
    return out;
  }
};

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

class SlidingApproxRules final : public detail::ScriptedRules {
 public:
  SlidingApproxRules(std::string prefix, std::int64_t k)
      : ScriptedRules(std::move(prefix)), k_(k), kind_("swa" + std::to_string(k_)) {}

  std::string_view name() const noexcept override { return "sliding-window-approx"; }
  const Script& script() const noexcept override { return kSlidingApproxScript; }

  void check(const std::vector<RateLimit>& limits) const override {
    detail::require_limits(limits);
    detail::require_no_burst(limits, name());
    detail::require_span(limits, name());
    detail::require_exact(limits, name(), false);
    for (const auto& l : limits) {
      if (l.window_ms % k_ != 0) {
        throw InvalidArgument("'" + l.text() + "': " + std::to_string(k_) + " sub-buckets do not divide its window of " +
                              std::to_string(l.window_ms) + " ms evenly");
      }
    }
  }

  std::string storage_key(const RateLimit& l, std::string_view key) const override {
    return detail::limiter_key(prefix_, kind_, l.amount, "", key, l.window_ms);
  }

  ScriptCall call(const std::vector<RateLimit>& limits, std::string_view key, std::int64_t cost, bool hit,
                  std::optional<std::int64_t> now) const override {
    auto args = std::make_shared<ApproxArgs>();
    args->now = now;
    args->hit = hit;
    args->cost = cost;
    ScriptCall c{&kSlidingApproxScript, {}, {}};
    c.keys.reserve(limits.size());
    for (const auto& l : limits) {
      c.keys.push_back(storage_key(l, key));
      args->limits.push_back(ApproxArgs::Limit{l.amount, l.window_ms / k_, k_});
    }
    c.typed = std::move(args);
    return c;
  }

  std::size_t reply_size(const std::vector<RateLimit>& limits) const override {
    return 2 + static_cast<std::size_t>(k_ + 1) * limits.size();
  }

  std::vector<Outcome> outcomes(const std::vector<RateLimit>& limits, std::int64_t cost,
                                const detail::Ints& v) const override {
    const std::size_t per = static_cast<std::size_t>(k_ + 1);
    const std::int64_t now = v[0];
    std::vector<Outcome> out;
    out.reserve(limits.size());
    for (std::size_t i = 0; i < limits.size(); ++i) out.push_back(outcome(limits[i], v.data() + 2 + per * i, now, cost));
    return out;
  }

 private:
  // c[off] = count of sub-bucket cur-k+off. Everything is scaled by the bucket length.
  Outcome outcome(const RateLimit& l, const std::int64_t* c, std::int64_t now, std::int64_t cost) const {
    const std::int64_t b = l.window_ms / k_;
    const std::int64_t cur = now / b;
    const std::int64_t e = now - cur * b;
    // With no further hits, at offset ep into sub-bucket cur + j the estimate (times b) is
    //   recent(j) + old(j) * (b - ep),
    // recent(j) = b * (sum of c over sub-buckets cur+j-k+1 .. cur), old(j) = c[cur+j-k].
    auto count_of = [&](std::int64_t idx) -> std::int64_t {
      return idx >= cur - k_ && idx <= cur ? c[idx - cur + k_] : 0;
    };
    auto recent = [&](std::int64_t j) {
      std::int64_t sum = 0;
      for (std::int64_t idx = cur + j - k_ + 1; idx <= cur; ++idx) sum += count_of(idx) * b;
      return sum;
    };
    auto old = [&](std::int64_t j) { return count_of(cur + j - k_); };
    Outcome o;
    o.amount = l.amount;
    const std::int64_t scaled = recent(0) + old(0) * (b - e);
    o.count = ceil_div(scaled, b);
    o.remaining = detail::remaining_of(l.amount, o.count);
    // Empty once the newest non-empty sub-bucket has fully aged out.
    std::int64_t newest = -1;
    for (std::int64_t idx = cur; idx >= cur - k_; --idx) {
      if (count_of(idx) != 0) {
        newest = idx;
        break;
      }
    }
    o.reset_after_ms = newest < 0 ? 0 : std::max<std::int64_t>(0, (newest + k_ + 1) * b - now);
    const std::int64_t bound = (l.amount - cost) * b;  // allowed when the estimate is <= this
    if (scaled > bound) {
      o.refuses = true;
      // The first time t >= now at which the estimate allows `cost`; by sub-bucket cur+k+1
      // every charged sub-bucket has aged out, so the loop always finds one.
      std::int64_t when = (cur + k_ + 1) * b;
      for (std::int64_t j = 0; j <= k_; ++j) {
        const std::int64_t start = j == 0 ? e : 0;
        const std::int64_t r = recent(j), w = old(j);
        if (r + w * 1 > bound) continue;  // still refused at the sub-bucket's last ms
        std::int64_t ep = start;
        if (r + w * (b - start) > bound) ep = std::max(start, b - (bound - r) / w);  // w > 0 here
        when = (cur + j) * b + ep;
        break;
      }
      o.retry_after_ms = std::max<std::int64_t>(1, when - now);
    }
    return o;
  }

  std::int64_t k_;
  std::string kind_;  // "swa<k>"
};

}  // namespace

const Script kSlidingLogScript{"sliding_log", lua::sliding_log_source, lua::sliding_log_sha1, &native_sliding_log,
                               &typed_sliding_log};
const Script kSlidingApproxScript{"sliding_approx", lua::sliding_approx_source, lua::sliding_approx_sha1,
                                  &native_sliding_approx, &typed_sliding_approx};

namespace detail {
std::unique_ptr<LimiterStrategy> make_sliding_log(std::shared_ptr<Store> store, const LimiterOptions& o) {
  return std::make_unique<ScriptedLimiter>(store, o, std::make_shared<SlidingLogRules>(o.prefix));
}
std::unique_ptr<LimiterStrategy> make_sliding_approx(std::shared_ptr<Store> store, const LimiterOptions& o) {
  return std::make_unique<ScriptedLimiter>(store, o, std::make_shared<SlidingApproxRules>(o.prefix, o.sub_buckets));
}
}  // namespace detail
}  // namespace redcount
