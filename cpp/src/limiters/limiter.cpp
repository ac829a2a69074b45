// What every limiter strategy shares: the strategy registry (make_limiter), the base
// class's defaults, how outcomes fold into a Decision, and the checks of limits and costs.
#include "redcount/limiters/limiter.h"

#include <algorithm>
#include <limits>
#include <random>

#include "limiters/limiter_internal.h"
#include "redcount/common/errors.h"
#include "redcount/common/util.h"
#include "redcount/common/window.h"

namespace redcount {
void validate_cost(const std::vector<RateLimit>& limits, std::int64_t cost, bool use_capacity) {
  if (cost < 1) throw InvalidArgument("cost must be >= 1, got " + std::to_string(cost));
  for (const auto& l : limits) {
    const std::int64_t most = use_capacity ? l.capacity() : l.amount;
    if (cost > most) {
      throw InvalidArgument("cost " + std::to_string(cost) + " exceeds the " +
                            (use_capacity ? "capacity of" : "limit") + " '" + l.text() +
                            "': such a hit could never be allowed");
    }
  }
}

std::shared_ptr<Op<std::optional<Lease>>> LimiterStrategy::make_acquire(std::int64_t, std::string_view, std::int64_t) {
  throw InvalidArgument("acquire() needs Limiter(strategy='concurrency'); this limiter is '" + std::string(name()) + "'");
}

std::shared_ptr<Op<Decision>> LimiterStrategy::make_hit_all(const std::vector<KeyedLimits>&, std::int64_t,
                                                            std::string_view) {
  throw InvalidArgument("hit_all() is not available for strategy='" + std::string(name()) +
                        "' (it decides leases in flight, not rates)");
}

std::shared_ptr<Op<Decision>> LimiterStrategy::make_test_all(const std::vector<KeyedLimits>&, std::int64_t,
                                                             std::string_view) {
  throw InvalidArgument("test_all() is not available for strategy='" + std::string(name()) +
                        "' (it decides leases in flight, not rates)");
}

std::shared_ptr<Op<bool>> LimiterStrategy::make_release(const Lease&) {
  throw InvalidArgument("release() needs Limiter(strategy='concurrency'); this limiter is '" + std::string(name()) + "'");
}

std::shared_ptr<Op<std::int64_t>> LimiterStrategy::make_in_flight(std::string_view) {
  throw InvalidArgument("in_flight() needs Limiter(strategy='concurrency'); this limiter is '" + std::string(name()) +
                        "'");
}

std::vector<std::string> limiter_strategies() {
  return {"fixed-window", "sliding-window", "sliding-window-approx", "token-bucket", "gcra", "concurrency"};
}

std::unique_ptr<LimiterStrategy> make_limiter(std::shared_ptr<Store> store, std::string_view strategy,
                                              LimiterOptions options) {
  if (!store) throw InvalidArgument("store must not be None");
  validate_name(options.prefix, "prefix");
  if (options.sub_buckets < 1 || options.sub_buckets > kMaxSubBuckets) {
    throw InvalidArgument("sub_buckets must be between 1 and 60, got " + std::to_string(options.sub_buckets));
  }
  if (options.sub_buckets != 1 && strategy != "sliding-window-approx") {
    throw InvalidArgument("sub_buckets applies only to strategy='sliding-window-approx'");
  }
  if (options.calendar && strategy != "fixed-window") {
    throw InvalidArgument("calendar applies only to strategy='fixed-window' (calendar windows are fixed windows)");
  }
  if (strategy == "fixed-window") return detail::make_fixed_window(std::move(store), options);
  if (strategy == "sliding-window") return detail::make_sliding_log(std::move(store), options);
  if (strategy == "sliding-window-approx") return detail::make_sliding_approx(std::move(store), options);
  if (strategy == "token-bucket") return detail::make_token_bucket(std::move(store), options);
  if (strategy == "gcra") return detail::make_gcra(std::move(store), options);
  if (strategy == "concurrency") return detail::make_concurrency(std::move(store), options);
  std::string known;
  for (const auto& s : limiter_strategies()) known += (known.empty() ? "" : ", ") + s;
  throw InvalidArgument("unknown rate-limit strategy '" + std::string(strategy) + "' (known: " + known + ")");
}

std::unique_ptr<LimiterStrategy> make_limiter(std::shared_ptr<Store> store, std::string_view strategy,
                                              std::string prefix) {
  LimiterOptions o;
  o.prefix = std::move(prefix);
  return make_limiter(std::move(store), strategy, std::move(o));
}

namespace detail {


Decision combine(const std::vector<Outcome>& outcomes, bool allowed, std::size_t* binding_out) {
  Decision d;
  d.allowed = allowed;
  d.remaining = std::numeric_limits<std::int64_t>::max();
  std::size_t binding = 0;
  for (std::size_t i = 0; i < outcomes.size(); ++i) {
    const auto& o = outcomes[i];
    if (o.remaining < d.remaining ||
        (o.remaining == d.remaining && o.reset_after_ms > outcomes[binding].reset_after_ms)) {
      d.remaining = o.remaining;
      binding = i;
    }
  }
  if (!allowed) {
    for (std::size_t i = 0; i < outcomes.size(); ++i) {
      if (outcomes[i].refuses && outcomes[i].retry_after_ms >= d.retry_after_ms) {
        d.retry_after_ms = outcomes[i].retry_after_ms;
        binding = i;
      }
    }
  }
  d.limit = outcomes[binding].amount;
  d.reset_after_ms = outcomes[binding].reset_after_ms;
  if (binding_out) *binding_out = binding;
  return d;
}

void ScriptedLimiter::check(const std::vector<RateLimit>& limits, std::string_view key, std::int64_t cost) const {
  rules_->check(limits);
  require_distinct_windows(limits);
  validate_key(key);
  validate_cost(limits, cost, rules_->cost_by_capacity());
  if (cost > rules_->max_cost()) detail::require_member_cost(cost, rules_->name());
}

std::shared_ptr<Op<Decision>> ScriptedLimiter::decide(const std::vector<RateLimit>& limits, std::string_view key,
                                                     std::int64_t cost, bool hit, std::string_view tag) {
  check(limits, key, cost);
  if (!tag.empty()) validate_name(tag, "tag");
  return make_clocked_script<Decision>(
      time_, rules_->time_scale(),
      ScriptedSpec<Decision>{rules_, limits, std::string(key), cost, hit, std::string(tag)});
}

std::shared_ptr<Op<Decision>> ScriptedLimiter::make_hit(const std::vector<RateLimit>& limits, std::string_view key,
                                                        std::int64_t cost, std::string_view tag) {
  return decide(limits, key, cost, true, tag);
}

std::shared_ptr<Op<Decision>> ScriptedLimiter::make_test(const std::vector<RateLimit>& limits, std::string_view key,
                                                         std::int64_t cost, std::string_view tag) {
  return decide(limits, key, cost, false, tag);
}

std::shared_ptr<Op<std::vector<LimitStats>>> ScriptedLimiter::make_stats(const std::vector<RateLimit>& limits,
                                                                         std::string_view key, std::string_view tag) {
  // Cost 1, not validated against the limits: stats of any limit are fine.
  rules_->check(limits);
  validate_key(key);
  if (!tag.empty()) validate_name(tag, "tag");
  return make_clocked_script<std::vector<LimitStats>>(
      time_, rules_->time_scale(),
      ScriptedSpec<std::vector<LimitStats>>{rules_, limits, std::string(key), 1, false, std::string(tag)});
}

std::shared_ptr<Op<std::monostate>> ScriptedLimiter::make_reset(const std::vector<RateLimit>& limits,
                                                                std::string_view key, std::string_view tag) {
  rules_->check(limits);
  validate_key(key);
  if (!tag.empty()) validate_name(tag, "tag");
  std::vector<std::string> keys;
  for (const auto& l : limits) keys.push_back(rules_->storage_key(l, key, tag));
  return make_delete(std::move(keys));
}

std::vector<LimitStats> to_stats(const std::vector<RateLimit>& limits, const std::vector<Outcome>& outcomes) {
  std::vector<LimitStats> out;
  for (std::size_t i = 0; i < limits.size(); ++i) {
    out.push_back(LimitStats{limits[i], outcomes[i].count, outcomes[i].remaining, outcomes[i].reset_after_ms});
  }
  return out;
}

void require_span(const std::vector<RateLimit>& limits, std::string_view strategy) {
  for (const auto& l : limits) {
    if (l.window_ms > kMaxScriptSpanMs) {
      throw InvalidArgument("'" + l.text() + "': windows of strategy='" + std::string(strategy) +
                            "' are at most 2^42 ms (about 139 years)");
    }
  }
}

void require_member_cost(std::int64_t cost, std::string_view strategy) {
  if (cost > kMaxMembersPerCall) {
    throw InvalidArgument("cost " + std::to_string(cost) + " is too large for strategy='" + std::string(strategy) +
                          "': it stores one entry per unit of cost, and one call adds at most " +
                          std::to_string(kMaxMembersPerCall) +
                          " (so that no call stalls the server; use 'sliding-window-approx', 'token-bucket' or "
                          "'gcra', whose work does not grow with the cost)");
  }
}

void require_members(const std::vector<RateLimit>& limits, std::string_view strategy) {
  for (const auto& l : limits) {
    if (l.amount > kMaxMembers) {
      throw InvalidArgument("'" + l.text() + "' is too large for strategy='" + std::string(strategy) +
                            "': it stores one entry per hit in flight or in the window, so amounts are capped at " +
                            std::to_string(kMaxMembers) + " (use 'sliding-window-approx' or 'gcra' for more)");
    }
  }
}

Ints integers(const Reply& reply, std::size_t size, std::string_view script) {
  reply.check();
  if (reply.type != Reply::Type::Array || reply.elements.size() != size) {
    throw ProtocolError(std::string(script) + " returned an unexpected reply");
  }
  Ints out;
  for (const auto& e : reply.elements) out.push_back(e.type == Reply::Type::Integer ? e.integer : e.as_integer());
  return out;
}

void require_limits(const std::vector<RateLimit>& limits) {
  if (limits.empty()) throw InvalidArgument("no rate limit given");
}

void require_distinct_windows(const std::vector<RateLimit>& limits) {
  for (std::size_t i = 0; i < limits.size(); ++i) {
    for (std::size_t j = 0; j < i; ++j) {
      if (limits[i].window_ms == limits[j].window_ms) {
        throw InvalidArgument("'" + limits[j].text() + "' and '" + limits[i].text() +
                              "' have the same window: a key keeps one state per window whatever the amount, "
                              "so give one limit per window (the stricter one)");
      }
    }
  }
}

void require_no_burst(const std::vector<RateLimit>& limits, std::string_view strategy) {
  for (const auto& l : limits) {
    if (l.burst > 0) {
      throw InvalidArgument("'" + l.text() + "': a burst applies only to strategy='token-bucket' or 'gcra', not '" +
                            std::string(strategy) + "'");
    }
  }
}

void require_exact(const std::vector<RateLimit>& limits, std::string_view strategy, bool use_capacity) {
  for (const auto& l : limits) {
    const std::int64_t amount = use_capacity ? std::max(l.capacity(), l.amount) : l.amount;
    std::int64_t product = 0;
    if (__builtin_mul_overflow(amount, l.window_ms, &product) || product > kMaxExactProduct) {
      throw InvalidArgument("'" + l.text() + "' is too large for strategy='" + std::string(strategy) +
                            "': amount (or burst) times the window in ms must be <= 2^50");
    }
  }
}

}  // namespace detail
}  // namespace redcount
