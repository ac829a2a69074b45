// The bucket limiters: token bucket (explicit tokens + timestamp) and GCRA (one TAT).
//
// Both let a key spend up to `capacity` at once (the limit's burst, by default its amount)
// and refill at `amount` per window. They make the same decisions for the same limit;
// they differ in what they store: the token bucket a hash {tokens, ts} kept exactly in
// units of 1/window_ms token, GCRA a single string, its theoretical arrival time in µs,
// with the emission interval rounded up to a whole µs (so it never exceeds the rate).
#include <algorithm>

#include "limiters/limiter_internal.h"
#include "redcount/common/errors.h"
#include "redcount/common/window.h"

namespace redcount {
namespace {

using detail::ceil_div;
using detail::Outcome;

// ----------------------------------------------------------------------- token bucket

class TokenBucketRules final : public detail::ScriptedRules {
 public:
  using ScriptedRules::ScriptedRules;
  std::string_view name() const noexcept override { return "token-bucket"; }
  const Script& script() const noexcept override { return kTokenBucketScript; }
  bool cost_by_capacity() const noexcept override { return true; }

  void check(const std::vector<RateLimit>& limits) const override {
    detail::require_limits(limits);
    detail::require_span(limits, name());
    detail::require_exact(limits, name(), true);
  }

  std::string storage_key(const RateLimit& l, std::string_view key, std::string_view tag) const override {
    return detail::limiter_key(prefix_, "tb", key, l.window_ms, tag);
  }
  std::string_view adjust_kind() const noexcept override { return "tb"; }
  std::array<std::int64_t, 4> adjust_args(const RateLimit& l) const override {
    return {l.amount, l.window_ms, l.capacity(), 0};
  }

  ScriptCall call(const std::vector<RateLimit>& limits, std::vector<std::string> keys, std::int64_t cost, bool hit,
                  std::optional<std::int64_t> now) const override {
    ScriptCall call{&kTokenBucketScript, std::move(keys),
                    {now ? std::to_string(*now) : "", hit ? "hit" : "test", std::to_string(cost)}};
    for (const auto& l : limits) {
      call.args.push_back(std::to_string(l.amount));
      call.args.push_back(std::to_string(l.window_ms));
      call.args.push_back(std::to_string(l.capacity()));
    }
    return call;
  }

  std::size_t reply_size(const std::vector<RateLimit>& limits) const override { return 2 + limits.size(); }

  std::vector<Outcome> outcomes(const std::vector<RateLimit>& limits, std::int64_t cost,
                                const detail::Ints& v) const override {
    std::vector<Outcome> outcomes;
    for (std::size_t i = 0; i < limits.size(); ++i) {
      const RateLimit& l = limits[i];
      const std::int64_t level = v[2 + i];  // units of 1/window_ms token
      const std::int64_t full = l.capacity() * l.window_ms;
      Outcome o;
      o.amount = l.capacity();
      o.remaining = std::max<std::int64_t>(0, level / l.window_ms);
      o.count = l.capacity() - o.remaining;
      o.reset_after_ms = ceil_div(std::max<std::int64_t>(0, full - level), l.amount);
      const std::int64_t need = cost * l.window_ms;
      o.refuses = level < need;
      o.retry_after_ms = o.refuses ? std::max<std::int64_t>(1, ceil_div(need - level, l.amount)) : 0;
      outcomes.push_back(o);
    }
    return outcomes;
  }

  // The tokens go back (a level above the capacity reads as a full bucket).
  void release(const RateLimit& l, const std::string& key, std::int64_t cost, const detail::Ints&, const ScriptArgs*,
               std::vector<Request>& out) const override {
    out.emplace_back(Command{{"HINCRBY", key, "tokens", std::to_string(cost * l.window_ms)}});
    // Should the key have expired after all, the hash HINCRBY made (no "ts": it reads as a
    // full bucket) must not live forever.
    out.emplace_back(Command{{"PEXPIRE", key, std::to_string(l.window_ms), "NX"}});
  }
};

// ------------------------------------------------------------------------------- GCRA

class GcraRules final : public detail::ScriptedRules {
 public:
  using ScriptedRules::ScriptedRules;
  std::string_view name() const noexcept override { return "gcra"; }
  const Script& script() const noexcept override { return kGcraScript; }
  bool cost_by_capacity() const noexcept override { return true; }
  std::int64_t time_scale() const noexcept override { return 1000; }

  // The emission interval in µs, rounded up so the rate is never exceeded.
  static std::int64_t interval_us(const RateLimit& l) { return ceil_div(l.window_ms * 1000, l.amount); }

  void check(const std::vector<RateLimit>& limits) const override {
    detail::require_limits(limits);
    for (const auto& l : limits) {
      std::int64_t span = 0;
      if (l.window_ms > kMaxLongTimeoutMs ||
          __builtin_mul_overflow(interval_us(l), l.capacity() + 1, &span) || span > kMaxExactProduct) {
        throw InvalidArgument("'" + l.text() + "' is too large for strategy='gcra': burst times the emission " +
                              "interval must stay under 2^50 µs (about 35 years)");
      }
    }
  }

  std::string storage_key(const RateLimit& l, std::string_view key, std::string_view tag) const override {
    return detail::limiter_key(prefix_, "gcra", key, l.window_ms, tag);
  }
  std::string_view adjust_kind() const noexcept override { return "gcra"; }
  std::array<std::int64_t, 4> adjust_args(const RateLimit& l) const override {
    return {interval_us(l), l.capacity(), 0, 0};
  }

  ScriptCall call(const std::vector<RateLimit>& limits, std::vector<std::string> keys, std::int64_t cost, bool hit,
                  std::optional<std::int64_t> now) const override {
    ScriptCall call{&kGcraScript, std::move(keys),
                    {now ? std::to_string(*now) : "", hit ? "hit" : "test", std::to_string(cost)}};
    for (const auto& l : limits) {
      call.args.push_back(std::to_string(interval_us(l)));
      call.args.push_back(std::to_string(l.capacity()));
    }
    return call;
  }

  std::size_t reply_size(const std::vector<RateLimit>& limits) const override { return 2 + limits.size(); }

  std::vector<Outcome> outcomes(const std::vector<RateLimit>& limits, std::int64_t cost,
                                const detail::Ints& v) const override {
    const std::int64_t now = v[0];
    std::vector<Outcome> outcomes;
    for (std::size_t i = 0; i < limits.size(); ++i) {
      const RateLimit& l = limits[i];
      const std::int64_t t = interval_us(l), tat = v[2 + i];
      const std::int64_t horizon = l.capacity() * t;  // allowed while tat + cost*t - now <= horizon
      Outcome o;
      o.amount = l.capacity();
      o.remaining = std::max<std::int64_t>(0, (horizon - (tat - now)) / t);
      o.count = l.capacity() - o.remaining;
      o.reset_after_ms = ceil_div(tat - now, 1000);
      const std::int64_t over = tat + cost * t - now - horizon;
      o.refuses = over > 0;
      o.retry_after_ms = o.refuses ? std::max<std::int64_t>(1, ceil_div(over, 1000)) : 0;
      outcomes.push_back(o);
    }
    return outcomes;
  }

  // The arrival time moves back by what the call moved it forward (its TTL, set for the
  // later time, only outlives it).
  void release(const RateLimit& l, const std::string& key, std::int64_t cost, const detail::Ints&, const ScriptArgs*,
               std::vector<Request>& out) const override {
    out.emplace_back(Command{{"DECRBY", key, std::to_string(cost * interval_us(l))}});
    // Should the key have expired after all, the value DECRBY made (a time in the past: it
    // reads as "now") must not live forever.
    out.emplace_back(Command{{"PEXPIRE", key, "1000", "NX"}});
  }
};

}  // namespace



namespace detail {
std::unique_ptr<LimiterStrategy> make_token_bucket(std::shared_ptr<Store> store, const LimiterOptions& o) {
  return std::make_unique<ScriptedLimiter>(store, o, std::make_shared<TokenBucketRules>(o.prefix));
}
std::unique_ptr<LimiterStrategy> make_gcra(std::shared_ptr<Store> store, const LimiterOptions& o) {
  return std::make_unique<ScriptedLimiter>(store, o, std::make_shared<GcraRules>(o.prefix));
}
}  // namespace detail
}  // namespace redcount
