#include "redcount/limiters/limiter.h"

#include <algorithm>
#include <limits>
#include <random>

#include "limiters/limiter_internal.h"
#include "redcount/common/errors.h"
#include "redcount/common/util.h"
#include "redcount/common/window.h"

namespace redcount {
namespace {

using detail::exceeds;
using detail::remaining_of;

// Where one limit's window is now: its position and its key.
struct Place {
  WindowPos pos;
  std::string key;
};

// What every fixed-window operation shares: the limits and key it was made for, and the
// places they resolve to at the time the operation runs (client-side time: the window's
// key is named after it).
struct FixedWindowWork {
  std::shared_ptr<const std::string> prefix;
  // Owned copies (the make_ factories), or the caller's arguments (a synchronous call
  // that runs the operation on its own stack frame).
  std::vector<RateLimit> own_limits;
  std::string own_key;
  const std::vector<RateLimit>* borrowed_limits = nullptr;
  std::string_view borrowed_key;
  std::int64_t now = 0;

  const std::vector<RateLimit>& lims() const { return borrowed_limits ? *borrowed_limits : own_limits; }
  std::string_view key() const { return borrowed_limits ? borrowed_key : std::string_view(own_key); }
  std::vector<Place> places;

  void locate_all(std::int64_t at) {
    now = at;
    places.clear();
    places.reserve(lims().size());
    for (const auto& l : lims()) {
      WindowPos pos = locate(WindowSpec{l.window_ms, kLimiterGraceMs, false}, key(), now);
      places.push_back(Place{pos, fixed_window_limiter_key(*prefix, l.amount, key(), l.window_ms, pos.index)});
    }
  }

  std::vector<Request> gets() const {
    std::vector<Request> batch;
    for (const auto& p : places) batch.emplace_back(Command{{"GET", p.key}});
    return batch;
  }

  static std::vector<std::int64_t> read_counts(const std::vector<Reply>& replies) {
    std::vector<std::int64_t> counts;
    for (const Reply& r : replies) {
      // A foreign value (another type, or no number) is garbage that the next hit deletes:
      // it counts nothing.
      if (r.is_error() && r.str.starts_with("WRONGTYPE")) {
        counts.push_back(0);
        continue;
      }
      auto s = r.as_string();
      auto v = s ? parse_int64(*s) : std::nullopt;
      counts.push_back(v.value_or(0));
    }
    return counts;
  }

  // denied_cost: 0 when allowed, else the cost that was refused.
  Decision decide(const std::int64_t* counts, bool allowed, std::int64_t denied_cost) const {
    Decision d;
    d.allowed = allowed;
    d.remaining = std::numeric_limits<std::int64_t>::max();
    std::size_t binding = 0;
    for (std::size_t i = 0; i < lims().size(); ++i) {
      const std::int64_t rem = remaining_of(lims()[i].amount, counts[i]);
      if (rem < d.remaining || (rem == d.remaining && places[i].pos.end_ms > places[binding].pos.end_ms)) {
        d.remaining = rem;
        binding = i;
      }
    }
    if (!allowed) {
      // Denied: the binding limit is the refusing one that frees up last.
      for (std::size_t i = 0; i < lims().size(); ++i) {
        if (!exceeds(counts[i], denied_cost, lims()[i].amount)) continue;
        const std::int64_t wait = places[i].pos.end_ms - now;
        if (wait > d.retry_after_ms) {
          d.retry_after_ms = wait;
          binding = i;
        }
      }
    }
    d.limit = lims()[binding].amount;
    d.reset_after_ms = places[binding].pos.end_ms - now;
    return d;
  }
};

struct FixedWindowHit : FixedWindowWork {
  std::int64_t cost = 1;
  std::shared_ptr<const HitArgs> sent{};  // the typed arguments of the last call
  std::vector<Request> batch(std::int64_t at) {
    locate_all(at);
    auto args = std::make_shared<HitArgs>();
    args->cost = cost;
    ScriptCall call{&kFixedWindowHitScript, {}, {}};
    call.keys.reserve(lims().size());
    for (std::size_t i = 0; i < lims().size(); ++i) {
      call.keys.push_back(std::move(places[i].key));  // places' keys are not read again (decide reads pos)
      args->limits.push_back({lims()[i].amount, places[i].pos.expire_at_ms});
    }
    sent = args;
    call.typed = std::move(args);
    std::vector<Request> out;
    out.emplace_back(std::move(call));
    return out;
  }
  Decision finish(std::vector<Reply>&& replies) const {
    if (replies.size() != 1) throw ProtocolError("fixed_window_hit: expected one reply");
    const Reply& r = replies.front();
    if (r.type == Reply::Type::Status && r.str == kAnsweredInPlace && sent && sent->answered) {
      return decide_from(sent->ints);  // the typed twin's answer
    }
    r.check();
    if (r.type != Reply::Type::Array || r.elements.size() != lims().size() + 1) {
      throw ProtocolError("fixed_window_hit returned an unexpected reply");
    }
    detail::Ints v;
    for (const Reply& e : r.elements) v.push_back(e.as_integer());
    return decide_from(v);
  }
  // v: allowed (1/0), then the count per limit.
  Decision decide_from(const detail::Ints& v) const {
    if (v.size() != lims().size() + 1) throw ProtocolError("fixed_window_hit returned an unexpected reply");
    const bool allowed = v[0] == 1;
    return decide(v.data() + 1, allowed, allowed ? 0 : cost);
  }
};

struct FixedWindowTest : FixedWindowWork {
  std::int64_t cost = 1;
  std::vector<Request> batch(std::int64_t at) {
    locate_all(at);
    return gets();
  }
  Decision finish(std::vector<Reply>&& replies) const {
    auto counts = read_counts(replies);
    bool allowed = true;
    for (std::size_t i = 0; i < lims().size(); ++i) allowed &= !exceeds(counts[i], cost, lims()[i].amount);
    return decide(counts.data(), allowed, allowed ? 0 : cost);
  }
};

struct FixedWindowStats : FixedWindowWork {
  std::vector<Request> batch(std::int64_t at) {
    locate_all(at);
    return gets();
  }
  std::vector<LimitStats> finish(std::vector<Reply>&& replies) const {
    auto counts = read_counts(replies);
    std::vector<LimitStats> out;
    for (std::size_t i = 0; i < lims().size(); ++i) {
      out.push_back(LimitStats{lims()[i], counts[i], remaining_of(lims()[i].amount, counts[i]),
                               places[i].pos.end_ms - now});
    }
    return out;
  }
};

struct FixedWindowReset : FixedWindowWork {
  std::vector<Request> batch(std::int64_t at) {
    locate_all(at);
    Command del{{"DEL"}};
    for (const auto& p : places) del.args.push_back(p.key);
    std::vector<Request> out;
    out.emplace_back(std::move(del));
    return out;
  }
  std::monostate finish(std::vector<Reply>&& replies) const {
    for (const Reply& r : replies) r.check();
    return {};
  }
};

class FixedWindowLimiter final : public LimiterStrategy {
 public:
  FixedWindowLimiter(std::shared_ptr<Store> store, const LimiterOptions& o)
      : LimiterStrategy(store), time_(store, o.clock), prefix_(std::make_shared<const std::string>(o.prefix)) {}

  std::string_view name() const noexcept override { return "fixed-window"; }
  // The window's key is named after the time, so the client must know it: server time
  // comes from the measured offset (ServerOffset) rather than from inside the script.
  ClockMode clock() const noexcept override {
    return time_.requested() == ClockMode::Client ? ClockMode::Client : ClockMode::ServerOffset;
  }

  std::shared_ptr<Op<Decision>> make_hit(const std::vector<RateLimit>& limits, std::string_view key,
                                         std::int64_t cost) override {
    check_cost(limits, key, cost);
    FixedWindowHit spec;
    fill(spec, limits, key);
    spec.cost = cost;
    return make_clocked_batch<Decision>(time_, std::move(spec));
  }

  // make_hit's operation on this stack frame, borrowing the arguments: no copies on the
  // hot path.
  Decision hit(const std::vector<RateLimit>& limits, std::string_view key, std::int64_t cost) override {
    check_cost(limits, key, cost);
    FixedWindowHit spec;
    spec.prefix = prefix_;
    spec.borrowed_limits = &limits;
    spec.borrowed_key = key;
    spec.cost = cost;
    ClockedBatch<Decision, FixedWindowHit> op(time_, std::move(spec));
    return run(*store_, op);
  }

  std::shared_ptr<Op<Decision>> make_test(const std::vector<RateLimit>& limits, std::string_view key,
                                          std::int64_t cost) override {
    check_cost(limits, key, cost);
    FixedWindowTest spec;
    fill(spec, limits, key);
    spec.cost = cost;
    return make_clocked_batch<Decision>(time_, std::move(spec));
  }

  std::shared_ptr<Op<std::vector<LimitStats>>> make_stats(const std::vector<RateLimit>& limits,
                                                          std::string_view key) override {
    detail::require_limits(limits);
    validate_key(key);
    FixedWindowStats spec;
    fill(spec, limits, key);
    return make_clocked_batch<std::vector<LimitStats>>(time_, std::move(spec));
  }

  std::shared_ptr<Op<std::monostate>> make_reset(const std::vector<RateLimit>& limits, std::string_view key) override {
    detail::require_limits(limits);
    validate_key(key);
    FixedWindowReset spec;
    fill(spec, limits, key);
    return make_clocked_batch<std::monostate>(time_, std::move(spec));
  }

 private:
  void check_cost(const std::vector<RateLimit>& limits, std::string_view key, std::int64_t cost) const {
    detail::require_limits(limits);
    detail::require_no_burst(limits, name());
    validate_cost(limits, cost);
    validate_key(key);
  }

  void fill(FixedWindowWork& w, const std::vector<RateLimit>& limits, std::string_view key) const {
    w.prefix = prefix_;
    w.own_limits = limits;
    w.own_key = std::string(key);
  }

  TimeSource time_;
  std::shared_ptr<const std::string> prefix_;
};

}  // namespace


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

std::unique_ptr<LimiterStrategy> make_fixed_window(std::shared_ptr<Store> store, const LimiterOptions& o) {
  return std::make_unique<FixedWindowLimiter>(std::move(store), o);
}

Decision combine(const std::vector<Outcome>& outcomes, bool allowed) {
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
  return d;
}

void ScriptedLimiter::check(const std::vector<RateLimit>& limits, std::string_view key, std::int64_t cost) const {
  rules_->check(limits);
  validate_key(key);
  validate_cost(limits, cost, rules_->cost_by_capacity());
  if (cost > rules_->max_cost()) detail::require_member_cost(cost, rules_->name());
}

std::shared_ptr<Op<Decision>> ScriptedLimiter::decide(const std::vector<RateLimit>& limits, std::string_view key,
                                                     std::int64_t cost, bool hit) {
  check(limits, key, cost);
  return make_clocked_script<Decision>(time_, rules_->time_scale(),
                                       ScriptedSpec<Decision>{rules_, limits, std::string(key), cost, hit});
}

std::shared_ptr<Op<Decision>> ScriptedLimiter::make_hit(const std::vector<RateLimit>& limits, std::string_view key,
                                                        std::int64_t cost) {
  return decide(limits, key, cost, true);
}

std::shared_ptr<Op<Decision>> ScriptedLimiter::make_test(const std::vector<RateLimit>& limits, std::string_view key,
                                                         std::int64_t cost) {
  return decide(limits, key, cost, false);
}

std::shared_ptr<Op<std::vector<LimitStats>>> ScriptedLimiter::make_stats(const std::vector<RateLimit>& limits,
                                                                         std::string_view key) {
  // Cost 1, not validated against the limits: stats of any limit are fine.
  rules_->check(limits);
  validate_key(key);
  return make_clocked_script<std::vector<LimitStats>>(
      time_, rules_->time_scale(), ScriptedSpec<std::vector<LimitStats>>{rules_, limits, std::string(key), 1, false});
}

std::shared_ptr<Op<std::monostate>> ScriptedLimiter::make_reset(const std::vector<RateLimit>& limits,
                                                                std::string_view key) {
  rules_->check(limits);
  validate_key(key);
  std::vector<std::string> keys;
  for (const auto& l : limits) keys.push_back(rules_->storage_key(l, key));
  return make_delete(std::move(keys));
}

std::shared_ptr<Op<std::monostate>> make_delete(std::vector<std::string> keys) {
  Command del{{"DEL"}};
  for (auto& k : keys) del.args.push_back(std::move(k));
  std::vector<Request> batch;
  batch.emplace_back(std::move(del));
  return make_batch_op<std::monostate>(std::move(batch), [](std::vector<Reply>&& replies) {
    for (const Reply& r : replies) r.check();
    return std::monostate{};
  });
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
