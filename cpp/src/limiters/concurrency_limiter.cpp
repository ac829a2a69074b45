// The concurrency limiter: at most N leases in flight per key.
//
// Leases live in one sorted set per key, member = lease id, score = the lease's expiry,
// so a worker that dies without releasing gives its slot back when the lease times out.
// hit() with a limit "N/period" takes `cost` slots that are only freed by their expiry
// after `period`; acquire()/release() take and give back one slot explicitly.
#include <algorithm>

#include "limiters/limiter_internal.h"
#include "redcount/common/errors.h"
#include "redcount/common/window.h"

namespace redcount {
namespace {

using detail::Outcome;

// One concurrency.lua call as a ClockedScript spec; `finish` turns its integers
// (now, ok, count, need_at, latest) into the operation's result.
template <class R, class Finish>
struct CcSpec {
  std::string storage_key;
  const char* op;
  std::int64_t max, timeout_ms, cost;
  std::string id;
  Finish finish_ints;

  ScriptCall call(std::optional<std::int64_t> now) const {
    return ScriptCall{&kConcurrencyScript,
                      {storage_key},
                      {now ? std::to_string(*now) : "", op, std::to_string(max), std::to_string(timeout_ms), id,
                       std::to_string(cost)}};
  }
  R finish(Reply reply) const { return finish_ints(detail::integers(reply, 5, "concurrency")); }
};

class ConcurrencyLimiter final : public LimiterStrategy {
 public:
  ConcurrencyLimiter(std::shared_ptr<Store> store, const LimiterOptions& o)
      : LimiterStrategy(store), time_(store, o.clock), prefix_(o.prefix) {}

  std::string_view name() const noexcept override { return "concurrency"; }
  ClockMode clock() const noexcept override { return time_.effective(); }

  std::shared_ptr<Op<Decision>> make_hit(const std::vector<RateLimit>& limits, std::string_view key,
                                         std::int64_t cost, std::string_view tag) override {
    untagged(tag);
    const RateLimit& l = one(limits);
    if (l.window_ms > detail::kMaxScriptSpanMs) throw InvalidArgument("'" + l.text() + "': the period is too long");
    validate_cost(limits, cost);
    detail::require_member_cost(cost, name());
    const std::int64_t max = l.amount;
    return call<Decision>("acquire", key, max, l.window_ms, detail::unique_id(), cost,
                          [max](const detail::Ints& v) { return decision(max, v); });
  }
  std::shared_ptr<Op<Decision>> make_test(const std::vector<RateLimit>& limits, std::string_view key,
                                          std::int64_t cost, std::string_view tag) override {
    untagged(tag);
    const RateLimit& l = one(limits);
    validate_cost(limits, cost);
    detail::require_member_cost(cost, name());
    const std::int64_t max = l.amount;
    return call<Decision>("test", key, max, l.window_ms, "-", cost,
                          [max](const detail::Ints& v) { return decision(max, v); });
  }
  std::shared_ptr<Op<std::vector<LimitStats>>> make_stats(const std::vector<RateLimit>& limits, std::string_view key,
                                                          std::string_view tag) override {
    untagged(tag);
    const RateLimit& l = one(limits);
    return call<std::vector<LimitStats>>("test", key, l.amount, l.window_ms, "-", 1,
                                         [l](const detail::Ints& v) {
                                           return std::vector<LimitStats>{LimitStats{
                                               l, v[2], detail::remaining_of(l.amount, v[2]), v[4] > 0 ? v[4] - v[0] : 0}};
                                         });
  }
  std::shared_ptr<Op<std::monostate>> make_reset(const std::vector<RateLimit>& limits, std::string_view key,
                                                 std::string_view tag) override {
    untagged(tag);
    one(limits);
    validate_key(key);
    return detail::make_delete({storage_key(key)});
  }

  std::shared_ptr<Op<std::optional<Lease>>> make_acquire(std::int64_t max_in_flight, std::string_view key,
                                                         std::int64_t lease_timeout_ms) override {
    if (max_in_flight < 1 || max_in_flight > detail::kMaxMembers) {
      throw InvalidArgument("max_in_flight must be between 1 and " + std::to_string(detail::kMaxMembers) + ", got " +
                            std::to_string(max_in_flight));
    }
    if (lease_timeout_ms < 1) throw InvalidArgument("lease_timeout must be at least 1 ms");
    if (lease_timeout_ms > kMaxLongTimeoutMs) throw InvalidArgument("lease_timeout is too long");
    validate_key(key);
    Lease lease;
    lease.id = detail::unique_id();
    lease.key = std::string(key);
    lease.storage_key = storage_key(key);
    lease.max_in_flight = max_in_flight;
    const std::string id = lease.id;
    return call<std::optional<Lease>>(
        "acquire", key, max_in_flight, lease_timeout_ms, id, 1,
        [lease, lease_timeout_ms](const detail::Ints& v) -> std::optional<Lease> {
          if (v[1] != 1) return std::nullopt;
          Lease out = lease;
          out.released = std::make_shared<std::atomic<bool>>(false);
          out.expires_at_ms = v[0] + lease_timeout_ms;
          return out;
        });
  }

  std::shared_ptr<Op<bool>> make_release(const Lease& lease) override {
    if (!lease.released || lease.storage_key.empty()) throw InvalidArgument("this lease was not made by acquire()");
    validate_key(lease.key);
    if (lease.storage_key != storage_key(lease.key)) {
      throw InvalidArgument("this lease belongs to another limiter (prefix differs)");
    }
    if (lease.released->exchange(true)) {
      throw InvalidArgument("lease " + lease.id + " of key '" + lease.key + "' was already released");
    }
    return call<bool>("release", lease.key, lease.max_in_flight, 1, lease.id, 1,
                      [](const detail::Ints& v) { return v[1] == 1; });
  }

  std::shared_ptr<Op<std::int64_t>> make_in_flight(std::string_view key) override {
    return call<std::int64_t>("test", key, 1, 1, "-", 1, [](const detail::Ints& v) { return v[2]; });
  }

 private:
  const RateLimit& one(const std::vector<RateLimit>& limits) const {
    detail::require_limits(limits);
    detail::require_no_burst(limits, name());
    detail::require_members(limits, name());
    if (limits.size() != 1) {
      throw InvalidArgument("strategy='concurrency' takes exactly one limit ('N/period': at most N in flight, each "
                            "held for up to the period), got " + std::to_string(limits.size()));
    }
    return limits[0];
  }

  std::string storage_key(std::string_view key) const { return concurrency_key(prefix_, key); }

  // A key's leases are one sorted set under its own hash tag (hit_all, which puts keys
  // under a common tag, is not available for this strategy either).
  void untagged(std::string_view tag) const {
    if (!tag.empty()) throw InvalidArgument("tag= is not available for strategy='concurrency'");
  }

  template <class R, class Finish>
  std::shared_ptr<Op<R>> call(const char* op, std::string_view key, std::int64_t max, std::int64_t timeout_ms,
                              std::string id, std::int64_t cost, Finish finish) {
    validate_key(key);
    return make_clocked_script<R>(
        time_, 1, CcSpec<R, Finish>{storage_key(key), op, max, timeout_ms, cost, std::move(id), std::move(finish)});
  }

  static Decision decision(std::int64_t max, const detail::Ints& v) {
    Outcome o;
    o.amount = max;
    o.count = v[2];
    o.remaining = detail::remaining_of(max, v[2]);
    o.reset_after_ms = v[4] > 0 ? v[4] - v[0] : 0;
    o.refuses = v[1] != 1;
    o.retry_after_ms = o.refuses ? std::max<std::int64_t>(1, v[3] - v[0]) : 0;
    return detail::combine({o}, v[1] == 1);
  }

  TimeSource time_;
  std::string prefix_;
};

}  // namespace


namespace detail {
std::unique_ptr<LimiterStrategy> make_concurrency(std::shared_ptr<Store> store, const LimiterOptions& o) {
  return std::make_unique<ConcurrencyLimiter>(std::move(store), o);
}
}  // namespace detail
}  // namespace redcount
