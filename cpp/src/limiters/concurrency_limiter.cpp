// The concurrency limiter: at most N leases in flight per key.
//
// Leases live in one sorted set per key, member = lease id, score = the lease's expiry,
// so a worker that dies without releasing gives its slot back when the lease times out.
// hit() with a limit "N/period" takes `cost` slots that are only freed by their expiry
// after `period`; acquire()/release() take and give back one slot explicitly.
#include <algorithm>

#include "limiters/limiter_internal.h"
#include "redcount/common/errors.h"
#include "redcount/lua_scripts.h"
#include "redcount/common/window.h"

namespace redcount {
namespace {

using detail::Outcome;

constexpr double kInf = std::numeric_limits<double>::infinity();

// The memory store's twin of concurrency.lua; keep the two in step.
Reply native_concurrency(Keyspace& ks, const std::vector<std::string>& keys, const std::vector<std::string>& args) {
  if (keys.size() != 1 || args.size() != 6) return detail::malformed("concurrency");
  auto now = detail::script_time(ks, args[0]);
  auto max = detail::arg_in(args[2], 1, detail::kMaxMembers);
  auto timeout = detail::arg_in(args[3], 1, detail::kMaxScriptSpanMs);
  auto cost = detail::arg_in(args[5], 1, detail::kMaxMembersPerCall);
  if (!now || !max || !timeout || !cost) return detail::malformed("concurrency");
  const std::string& op = args[1];
  const std::string& key = keys[0];
  auto member = [&](std::int64_t j) { return *cost == 1 ? args[4] : args[4] + ":" + std::to_string(j); };
  auto live = [&] {
    return static_cast<std::int64_t>(ks.zrangebyscore(key, static_cast<double>(*now + 1), kInf).size());
  };
  std::int64_t count = ks.or_reset(key, live);  // a foreign value of another type is garbage
  if (op == "acquire") ks.zremrangebyscore(key, -kInf, static_cast<double>(*now));
  std::int64_t ok = 0, need_at = 0;
  if (op == "release") {
    for (std::int64_t j = 1; j <= *cost; ++j) ok += ks.zrem(key, member(j)) ? 1 : 0;
    ok = ok > 0 ? 1 : 0;
    count = live();
  } else if (count + *cost <= *max) {
    ok = 1;
    if (op == "acquire") {
      for (std::int64_t j = 1; j <= *cost; ++j) ks.zadd(key, static_cast<double>(*now + *timeout), member(j));
      count += *cost;
    }
  } else {
    auto gone = ks.zrangebyscore(key, static_cast<double>(*now + 1), kInf, count + *cost - *max);
    if (static_cast<std::int64_t>(gone.size()) != count + *cost - *max) {
      return detail::malformed("concurrency");  // cost > max: the Lua twin fails here too
    }
    need_at = static_cast<std::int64_t>(gone.back().second);
  }
  std::int64_t latest = 0;
  auto last = ks.zrange(key, -1, -1);
  if (!last.empty() && last[0].second > static_cast<double>(*now)) latest = static_cast<std::int64_t>(last[0].second);
  if (latest > 0 && op != "test") {
    if (ok == 1) {
      ks.pexpireat(key, ks.now_ms() + latest - *now);
    } else {
      ks.hold_expiry(key, ks.now_ms() + latest - *now);
    }
  }
  return Reply::of_array({Reply::of_integer(*now), Reply::of_integer(ok), Reply::of_integer(count),
                          Reply::of_integer(need_at), Reply::of_integer(latest)});
}

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
                                         std::int64_t cost) override {
    const RateLimit& l = one(limits);
    if (l.window_ms > detail::kMaxScriptSpanMs) throw InvalidArgument("'" + l.text() + "': the period is too long");
    validate_cost(limits, cost);
    detail::require_member_cost(cost, name());
    const std::int64_t max = l.amount;
    return call<Decision>("acquire", key, max, l.window_ms, detail::unique_id(), cost,
                          [max](const detail::Ints& v) { return decision(max, v); });
  }
  std::shared_ptr<Op<Decision>> make_test(const std::vector<RateLimit>& limits, std::string_view key,
                                          std::int64_t cost) override {
    const RateLimit& l = one(limits);
    validate_cost(limits, cost);
    detail::require_member_cost(cost, name());
    const std::int64_t max = l.amount;
    return call<Decision>("test", key, max, l.window_ms, "-", cost,
                          [max](const detail::Ints& v) { return decision(max, v); });
  }
  std::shared_ptr<Op<std::vector<LimitStats>>> make_stats(const std::vector<RateLimit>& limits,
                                                          std::string_view key) override {
    const RateLimit& l = one(limits);
    return call<std::vector<LimitStats>>("test", key, l.amount, l.window_ms, "-", 1,
                                         [l](const detail::Ints& v) {
                                           return std::vector<LimitStats>{LimitStats{
                                               l, v[2], detail::remaining_of(l.amount, v[2]), v[4] > 0 ? v[4] - v[0] : 0}};
                                         });
  }
  std::shared_ptr<Op<std::monostate>> make_reset(const std::vector<RateLimit>& limits, std::string_view key) override {
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

const Script kConcurrencyScript{"concurrency", lua::concurrency_source, lua::concurrency_sha1, &native_concurrency};

namespace detail {
std::unique_ptr<LimiterStrategy> make_concurrency(std::shared_ptr<Store> store, const LimiterOptions& o) {
  return std::make_unique<ConcurrencyLimiter>(std::move(store), o);
}
}  // namespace detail
}  // namespace redcount
