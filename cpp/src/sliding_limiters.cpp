// The sliding-window limiters: the exact log and the weighted sub-bucket estimate.
#include <algorithm>
#include <limits>
#include <map>

#include "limiter_internal.h"
#include "redcount/errors.h"
#include "redcount/lua_scripts.h"
#include "redcount/window.h"

namespace redcount {
namespace {

using detail::ceil_div;
using detail::Outcome;

// ------------------------------------------------------------------ exact sliding log

// The memory store's twin of sliding_log.lua; keep the two in step.
Reply native_sliding_log(Keyspace& ks, const std::vector<std::string>& keys, const std::vector<std::string>& args) {
  const std::size_t n = keys.size();
  if (args.size() != 4 + 2 * n) return detail::malformed("sliding_log");
  auto now = detail::script_time(ks, args[0]);
  auto cost = detail::arg_in(args[2], 1, detail::kMaxMembers);
  if (!now || !cost) return detail::malformed("sliding_log");
  const bool hit = args[1] == "hit";
  std::vector<std::int64_t> amount(n), window(n), counts(n);
  bool allowed = true;
  for (std::size_t i = 0; i < n; ++i) {
    auto a = detail::arg_in(args[4 + 2 * i], 1, detail::kMaxMembers);
    auto w = detail::arg_in(args[5 + 2 * i], 1, detail::kMaxSpanMs);
    if (!a || !w) return detail::malformed("sliding_log");
    amount[i] = *a;
    window[i] = *w;
    const double from = static_cast<double>(*now - *w + 1);
    if (hit) {
      ks.zremrangebyscore(keys[i], -std::numeric_limits<double>::infinity(), from - 1);
      counts[i] = ks.zcard(keys[i]);
    } else {
      counts[i] = static_cast<std::int64_t>(
          ks.zrangebyscore(keys[i], from, std::numeric_limits<double>::infinity()).size());
    }
    if (counts[i] + *cost > amount[i]) allowed = false;
  }
  std::vector<Reply> out{Reply::of_integer(*now), Reply::of_integer(allowed ? 1 : 0)};
  // Members only need to be unique: unlike the Lua twin, the memory store leaves the time
  // out of them, so that with a compact id they fit std::string's inline buffer.
  const std::string stamp = args[3] + ":";
  for (std::size_t i = 0; i < n; ++i) {
    const double from = static_cast<double>(*now - window[i] + 1);
    std::int64_t need_at = 0;
    if (allowed && hit) {
      for (std::int64_t m = 1; m <= *cost; ++m) ks.zadd(keys[i], static_cast<double>(*now), stamp + std::to_string(m));
      counts[i] += *cost;
      ks.pexpireat(keys[i], ks.now_ms() + window[i]);
    } else {
      if (hit && counts[i] > 0 && ks.pttl(keys[i]) == -1) ks.pexpireat(keys[i], ks.now_ms() + window[i]);
      if (counts[i] + *cost > amount[i]) {
        auto gone = ks.zrangebyscore(keys[i], from, std::numeric_limits<double>::infinity(),
                                     counts[i] + *cost - amount[i]);
        if (static_cast<std::int64_t>(gone.size()) != counts[i] + *cost - amount[i]) {
          return detail::malformed("sliding_log");  // cost > amount: the Lua twin fails here too
        }
        need_at = static_cast<std::int64_t>(gone.back().second) + window[i];
      }
    }
    std::int64_t newest = 0;
    if (allowed && hit) {
      newest = *now;
    } else if (counts[i] > 0) {
      newest = static_cast<std::int64_t>(ks.zrange(keys[i], -1, -1).at(0).second);
    }
    out.push_back(Reply::of_integer(counts[i]));
    out.push_back(Reply::of_integer(newest));
    out.push_back(Reply::of_integer(need_at));
  }
  return Reply::of_array(std::move(out));
}

class SlidingLogLimiter final : public detail::ScriptedLimiter {
 public:
  SlidingLogLimiter(const std::shared_ptr<Store>& store, const LimiterOptions& o)
      : ScriptedLimiter(store, o), memory_(store->is_memory()) {}

  std::string_view name() const noexcept override { return "sliding-window"; }

 private:
  void check(const std::vector<RateLimit>& limits) const override {
    detail::require_limits(limits);
    detail::require_no_burst(limits, name());
    detail::require_members(limits, name());
    detail::require_span(limits, name());
  }

  std::string storage_key(const RateLimit& l, std::string_view key) const override {
    return prefix_ + ":sw:" + std::to_string(l.amount) + ":{" + std::string(key) + "}:" + std::to_string(l.window_ms);
  }

  Decision run(const std::vector<RateLimit>& limits, std::string_view key, std::int64_t cost, const char* mode,
               std::vector<Outcome>* stats_out) override {
    check(limits);
    validate_key(key);
    if (!stats_out) validate_cost(limits, cost);
    ScriptCall call{&kSlidingLogScript, {}, {"", mode, std::to_string(cost), detail::unique_id(memory_)}};
    for (const auto& l : limits) {
      call.keys.push_back(storage_key(l, key));
      call.args.push_back(std::to_string(l.amount));
      call.args.push_back(std::to_string(l.window_ms));
    }
    auto v = detail::integers(time_.run(std::move(call), 0), 2 + 3 * limits.size(), "sliding_log");
    const std::int64_t now = v[0];
    const bool allowed = v[1] == 1;
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
    if (stats_out) *stats_out = outcomes;
    return detail::combine(outcomes, allowed);
  }

  bool memory_;
};

// ---------------------------------------------------------- approximate sliding window

// The memory store's twin of sliding_approx.lua; keep the two in step.
Reply native_sliding_approx(Keyspace& ks, const std::vector<std::string>& keys,
                            const std::vector<std::string>& args) {
  const std::size_t n = keys.size();
  if (args.size() != 3 + 3 * n) return detail::malformed("sliding_approx");
  auto now = detail::script_time(ks, args[0]);
  auto cost = detail::arg_in(args[2], 1, detail::kMaxExact);
  if (!now || !cost) return detail::malformed("sliding_approx");
  const bool hit = args[1] == "hit";
  struct State {
    std::vector<std::int64_t> c;
    std::int64_t cur, bucket, k;
  };
  std::vector<State> all;
  bool allowed = true;
  for (std::size_t i = 0; i < n; ++i) {
    auto amount = detail::arg_in(args[3 + 3 * i], 1, detail::kMaxExact);
    auto bucket = detail::arg_in(args[4 + 3 * i], 1, detail::kMaxSpanMs);
    auto k = detail::arg_in(args[5 + 3 * i], 1, 60);
    if (!amount || !bucket || !k) return detail::malformed("sliding_approx");
    const std::int64_t cur = *now / *bucket;  // now > 0
    State st{std::vector<std::int64_t>(static_cast<std::size_t>(*k + 1), 0), cur, *bucket, *k};
    for (const auto& [field, value] : ks.hgetall(keys[i])) {
      auto idx = parse_int64(field);
      auto v = parse_int64(value);
      if (idx && v && *idx >= cur - *k && *idx <= cur) {
        st.c[static_cast<std::size_t>(*idx - cur + *k)] = *v;
      } else if (hit && (!idx || !v || *idx < cur - *k)) {
        ks.hdel(keys[i], field);
      }
    }
    using detail::sat_add;
    using detail::sat_mul;
    std::int64_t scaled = sat_mul(st.c[0], *bucket - (*now - cur * *bucket));
    for (std::int64_t off = 1; off <= *k; ++off) scaled = sat_add(scaled, sat_mul(st.c[static_cast<std::size_t>(off)], *bucket));
    if (sat_add(scaled, sat_mul(*cost, *bucket)) > sat_mul(*amount, *bucket)) allowed = false;
    all.push_back(std::move(st));
  }
  std::vector<Reply> out{Reply::of_integer(*now), Reply::of_integer(allowed ? 1 : 0)};
  for (std::size_t i = 0; i < n; ++i) {
    auto& st = all[i];
    const std::int64_t ttl = (st.cur + st.k + 1) * st.bucket - *now;
    if (allowed && hit) {
      const std::string field = std::to_string(st.cur);
      auto prev = ks.hget(keys[i], field);
      std::int64_t v = prev ? parse_int64(*prev).value_or(0) : 0;
      if (__builtin_add_overflow(v, *cost, &v)) return Reply::of_error("ERR increment or decrement would overflow");
      ks.hset(keys[i], field, std::to_string(v));
      st.c[static_cast<std::size_t>(st.k)] = v;
      ks.pexpireat(keys[i], ks.now_ms() + ttl);
    } else if (hit && ks.pttl(keys[i]) == -1) {
      ks.pexpireat(keys[i], ks.now_ms() + ttl);
    }
    for (auto c : st.c) out.push_back(Reply::of_integer(c));
  }
  return Reply::of_array(std::move(out));
}

class SlidingApproxLimiter final : public detail::ScriptedLimiter {
 public:
  SlidingApproxLimiter(const std::shared_ptr<Store>& store, const LimiterOptions& o)
      : ScriptedLimiter(store, o), k_(o.sub_buckets) {}

  std::string_view name() const noexcept override { return "sliding-window-approx"; }

 private:
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
    return prefix_ + ":swa" + std::to_string(k_) + ":" + std::to_string(l.amount) + ":{" + std::string(key) + "}:" +
           std::to_string(l.window_ms);
  }

  Decision run(const std::vector<RateLimit>& limits, std::string_view key, std::int64_t cost, const char* mode,
               std::vector<Outcome>* stats_out) override {
    check(limits);
    validate_key(key);
    if (!stats_out) validate_cost(limits, cost);
    ScriptCall call{&kSlidingApproxScript, {}, {"", mode, std::to_string(cost)}};
    for (const auto& l : limits) {
      call.keys.push_back(storage_key(l, key));
      call.args.push_back(std::to_string(l.amount));
      call.args.push_back(std::to_string(l.window_ms / k_));
      call.args.push_back(std::to_string(k_));
    }
    const std::size_t per = static_cast<std::size_t>(k_ + 1);
    auto v = detail::integers(time_.run(std::move(call), 0), 2 + per * limits.size(), "sliding_approx");
    const std::int64_t now = v[0];
    const bool allowed = v[1] == 1;
    std::vector<Outcome> outcomes;
    for (std::size_t i = 0; i < limits.size(); ++i) {
      std::vector<std::int64_t> c(v.begin() + 2 + static_cast<std::ptrdiff_t>(per * i),
                                  v.begin() + 2 + static_cast<std::ptrdiff_t>(per * (i + 1)));
      outcomes.push_back(outcome(limits[i], c, now, cost));
    }
    if (stats_out) *stats_out = outcomes;
    return detail::combine(outcomes, allowed);
  }

  // c[off] = count of sub-bucket cur-k+off. Everything is scaled by the bucket length.
  Outcome outcome(const RateLimit& l, const std::vector<std::int64_t>& c, std::int64_t now, std::int64_t cost) const {
    const std::int64_t b = l.window_ms / k_;
    const std::int64_t cur = now / b;
    const std::int64_t e = now - cur * b;
    // With no further hits, at offset ep into sub-bucket cur + j the estimate (times b) is
    //   recent(j) + old(j) * (b - ep),
    // recent(j) = b * (sum of c over sub-buckets cur+j-k+1 .. cur), old(j) = c[cur+j-k].
    auto count_of = [&](std::int64_t idx) -> std::int64_t {
      return idx >= cur - k_ && idx <= cur ? c[static_cast<std::size_t>(idx - cur + k_)] : 0;
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
};

}  // namespace

const Script kSlidingLogScript{"sliding_log", lua::sliding_log_source, lua::sliding_log_sha1, &native_sliding_log};
const Script kSlidingApproxScript{"sliding_approx", lua::sliding_approx_source, lua::sliding_approx_sha1,
                                  &native_sliding_approx};

namespace detail {
std::unique_ptr<LimiterStrategy> make_sliding_log(std::shared_ptr<Store> store, const LimiterOptions& o) {
  return std::make_unique<SlidingLogLimiter>(std::move(store), o);
}
std::unique_ptr<LimiterStrategy> make_sliding_approx(std::shared_ptr<Store> store, const LimiterOptions& o) {
  return std::make_unique<SlidingApproxLimiter>(std::move(store), o);
}
}  // namespace detail
}  // namespace redcount
