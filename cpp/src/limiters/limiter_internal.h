// Private helpers shared by the limiter strategies and the sliding-window counter.
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <cstddef>
#include <charconv>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "redcount/common/bounds.h"
#include "redcount/common/errors.h"
#include "redcount/common/keys.h"
#include "redcount/limiters/limiter.h"
#include "redcount/common/limit_string.h"
#include "redcount/store/store.h"
#include "store/script_args.h"
#include "redcount/store/time_source.h"
#include "redcount/common/util.h"
#include "redcount/common/window.h"

namespace redcount::detail {

using ::redcount::kMaxMembers;
using ::redcount::kMaxMembersPerCall;
// Throws unless `cost` is at most kMaxMembersPerCall (strategies that add one entry per
// unit of cost).
void require_member_cost(std::int64_t cost, std::string_view strategy);
using ::redcount::limiter_key;

// One limit's state after a hit/test, as the strategy computed it.
struct Outcome {
  std::int64_t amount = 0;          // the limit's amount (its capacity for buckets)
  std::int64_t count = 0;           // used up now (hits in the window, tokens spent, ...)
  std::int64_t remaining = 0;       // further hits of cost 1 it allows now
  std::int64_t reset_after_ms = 0;  // until it is back to its empty/full state
  std::int64_t retry_after_ms = 0;  // when it refuses the cost: until it would allow it
  bool refuses = false;
};

// Folds the limits' outcomes into one Decision: remaining is the smallest; the binding
// limit is the one with the least remaining (ties: the later reset) or, when denied,
// the refusing one that frees up last.
// `binding`, when given, receives the binding limit's index.
Decision combine(const std::vector<Outcome>& outcomes, bool allowed, std::size_t* binding = nullptr);
std::vector<LimitStats> to_stats(const std::vector<RateLimit>& limits, const std::vector<Outcome>& outcomes);

// Throws unless every limit's amount is at most kMaxMembers (strategies that store one
// entry per admitted hit).
void require_members(const std::vector<RateLimit>& limits, std::string_view strategy);
// Throws unless every window is at most kMaxScriptSpanMs.
void require_span(const std::vector<RateLimit>& limits, std::string_view strategy);

// Checks a script reply is an array of exactly `size` elements; returns it as integers.
Ints integers(const Reply& reply, std::size_t size, std::string_view script);
// Throws unless no limit carries a burst ("burst" only means something to the buckets).
void require_no_burst(const std::vector<RateLimit>& limits, std::string_view strategy);
// Throws unless amount * window_ms (or capacity * window_ms) stays exact in a Lua double.
void require_exact(const std::vector<RateLimit>& limits, std::string_view strategy, bool use_capacity);
void require_limits(const std::vector<RateLimit>& limits);
// Throws unless no two limits have the same window: the amount is not part of a limiter's
// key, so two such limits of one key would be one state charged twice.
void require_distinct_windows(const std::vector<RateLimit>& limits);

class ScriptedRules;

// How a strategy decides the limits of several keys together (hit_all, test_all): the
// requests of one group of keys that share a slot, how their replies read, and the plain
// commands that give back what an allowing group charged when another group refused.
// Immutable; shared by the strategy and its operations.
class MultiRules {
 public:
  virtual ~MultiRules() = default;
  virtual std::string_view name() const noexcept = 0;
  // Throws InvalidArgument unless one item's limits and the cost suit this strategy.
  virtual void check(const std::vector<RateLimit>& limits, std::int64_t cost) const = 0;
  // True when keys are named after the time (fixed windows): the client's time (with the
  // server offset in server modes) is then always used.
  virtual bool client_time() const noexcept { return false; }
  virtual std::int64_t time_scale() const noexcept { return 1; }
  virtual std::string storage_key(const RateLimit& limit, std::string_view key, std::string_view tag,
                                  std::int64_t now_ms) const = 0;
  // The requests deciding one group at `now` (script unit; nullopt: the script reads TIME);
  // `sent` receives the typed arguments, if any.
  virtual std::vector<Request> group(const std::vector<RateLimit>& limits, std::vector<std::string> keys,
                                     std::int64_t cost, bool hit, std::optional<std::int64_t> now,
                                     std::int64_t now_ms, std::shared_ptr<const ScriptArgs>& sent) const = 0;
  // Reads the group's replies into one outcome per limit and the reply's integers; returns
  // whether the group allowed the cost.
  virtual bool read(const std::vector<RateLimit>& limits, std::int64_t cost, bool hit, std::vector<Reply>& replies,
                    const ScriptArgs* sent, std::int64_t now_ms, std::vector<Outcome>& out, Ints& v) const = 0;
  virtual void release(const RateLimit& limit, const std::string& key, std::int64_t cost, const Ints& v,
                       const ScriptArgs* sent, std::int64_t now_ms, std::vector<Request>& out) const = 0;
  // Refunds and reservations (limiter_adjust.lua, refunds.cpp): the strategy's name in
  // that script ("fw", "sw", "swa", "tb", "gcra"; empty: not supported), one limit's four
  // numbers there at `now_ms`, and the key of a request id's record.
  virtual std::string_view adjust_kind() const noexcept { return {}; }
  virtual std::array<std::int64_t, 4> adjust_args(const RateLimit&, std::int64_t /*now_ms*/) const { return {}; }
  virtual std::string record_key(std::string_view /*key*/, std::string_view /*what*/, std::string_view /*request_id*/,
                                 std::string_view /*tag*/) const {
    return {};
  }
};

// refund(), reserve() and settle() of a strategy described by `rules` (refunds.cpp);
// `after` is test(limits, key, 1), `refused` test(limits, key, cost) (reserve only).
std::shared_ptr<Op<Adjustment>> make_refund_op(std::shared_ptr<Store> store, const TimeSource& time,
                                               std::shared_ptr<const MultiRules> rules,
                                               const std::vector<RateLimit>& limits, std::string_view key,
                                               std::int64_t cost, std::string_view request_id, std::string_view tag,
                                               std::optional<std::int64_t> charged_at_us,
                                               std::shared_ptr<Op<Decision>> after);
std::shared_ptr<Op<Adjustment>> make_reserve_op(std::shared_ptr<Store> store, const TimeSource& time,
                                                std::shared_ptr<const MultiRules> rules,
                                                const std::vector<RateLimit>& limits, std::string_view key,
                                                std::int64_t estimate, std::string_view request_id,
                                                std::int64_t deadline_ms, std::string_view tag,
                                                std::shared_ptr<Op<Decision>> after,
                                                std::shared_ptr<Op<Decision>> refused);
std::shared_ptr<Op<Adjustment>> make_settle_op(std::shared_ptr<Store> store, const TimeSource& time,
                                               std::shared_ptr<const MultiRules> rules,
                                               const std::vector<RateLimit>& limits, std::string_view key,
                                               std::string_view request_id, std::int64_t actual, std::string_view tag,
                                               std::shared_ptr<Op<Decision>> after);

// The hit_all/test_all operation of a strategy described by `rules`.
std::shared_ptr<Op<Decision>> make_multi_decision(std::shared_ptr<Store> store, const TimeSource& time,
                                                  std::shared_ptr<const MultiRules> rules,
                                                  const std::vector<KeyedLimits>& items, std::int64_t cost,
                                                  std::string_view tag, bool hit);
// The MultiRules of a ScriptedRules strategy.
std::shared_ptr<const MultiRules> scripted_multi(std::shared_ptr<const ScriptedRules> rules);

// What a strategy that decides with one script call over one key per limit, in "hit" or
// "test" mode, needs to know: immutable, shared by the strategy and its operations, so
// an operation may outlive the strategy that made it.
class ScriptedRules {
 public:
  explicit ScriptedRules(std::string prefix) : prefix_(std::move(prefix)) {}
  virtual ~ScriptedRules() = default;
  virtual std::string_view name() const noexcept = 0;
  // Throws InvalidArgument unless the limits suit this strategy.
  virtual void check(const std::vector<RateLimit>& limits) const = 0;
  // The buckets check a cost against the capacity (the burst), the others the amount.
  virtual bool cost_by_capacity() const noexcept { return false; }
  // The largest cost one call may carry (the log strategies add one member per unit).
  virtual std::int64_t max_cost() const noexcept { return kMaxExact; }
  // The script's time unit: 1 = ms, 1000 = µs.
  virtual std::int64_t time_scale() const noexcept { return 1; }
  // The key of `key`'s state under `limit` (under `tag` when not empty). The amount is not
  // part of it: the state stays meaningful when the limit changes.
  virtual std::string storage_key(const RateLimit& limit, std::string_view key, std::string_view tag = {}) const = 0;
  // The script call at `now` (in the script's unit; nullopt: the script reads TIME) over
  // `keys`, limits[i]'s storage key at keys[i] (keys of several business keys when they
  // share a slot). Typed arguments, when the call has them, are a TimedArgs.
  virtual ScriptCall call(const std::vector<RateLimit>& limits, std::vector<std::string> keys, std::int64_t cost,
                          bool hit, std::optional<std::int64_t> now) const = 0;
  // What gives back `cost` charged to limits[i] (at keys[i]) by a call that allowed it, when
  // another part of a multi-key decision refused (charge-then-release): plain commands,
  // appended to `out`. `sent` is that call's typed arguments (or null), v its reply.
  virtual void release(const RateLimit& limit, const std::string& key, std::int64_t cost, const Ints& v,
                       const ScriptArgs* sent, std::vector<Request>& out) const = 0;
  virtual const Script& script() const noexcept = 0;
  // Refunds and reservations (see MultiRules): the strategy's name in limiter_adjust.lua
  // and one limit's four numbers there.
  virtual std::string_view adjust_kind() const noexcept { return {}; }
  virtual std::array<std::int64_t, 4> adjust_args(const RateLimit&) const { return {}; }
  std::string record_key(std::string_view key, std::string_view what, std::string_view request_id,
                         std::string_view tag) const {
    return limiter_record_key(prefix_, adjust_kind(), key, what, request_id, tag);
  }
  // The script's reply is an array of this many integers: now, allowed, then per limit.
  virtual std::size_t reply_size(const std::vector<RateLimit>& limits) const = 0;
  virtual std::vector<Outcome> outcomes(const std::vector<RateLimit>& limits, std::int64_t cost,
                                        const Ints& v) const = 0;

 protected:
  std::string prefix_;
};

// One scripted decision as a ClockedScript spec; T is Decision (hit, test) or
// std::vector<LimitStats> (stats). An owned spec (the make_ factories) holds copies; a
// borrowed one refers to the caller's arguments, for a synchronous call that runs the
// operation on its own stack frame.
template <class T, bool Owned = true>
struct ScriptedSpec {
  std::conditional_t<Owned, std::shared_ptr<const ScriptedRules>, const ScriptedRules*> rules;
  std::conditional_t<Owned, std::vector<RateLimit>, const std::vector<RateLimit>&> limits;
  std::conditional_t<Owned, std::string, std::string_view> key;
  std::int64_t cost = 1;
  bool hit = false;
  std::conditional_t<Owned, std::string, std::string_view> tag{};  // empty: the untagged state

  std::shared_ptr<const TimedArgs> sent{};  // the typed arguments of the last call, if any

  ScriptCall call(std::optional<std::int64_t> now) {
    std::vector<std::string> keys;
    keys.reserve(limits.size());
    for (const auto& l : limits) keys.push_back(rules->storage_key(l, key, tag));
    ScriptCall c = rules->call(limits, std::move(keys), cost, hit, now);
    sent = std::static_pointer_cast<const TimedArgs>(c.typed);
    return c;
  }
  T finish(Reply reply) const {
    const bool in_place = sent && sent->answered && reply.type == Reply::Type::Status && reply.str == kAnsweredInPlace;
    if (in_place && sent->ints.size() != rules->reply_size(limits)) {
      throw ProtocolError(std::string(rules->script().name) + " returned an unexpected reply");
    }
    const Ints& v = in_place ? sent->ints : (scratch_ = integers(reply, rules->reply_size(limits), rules->script().name));
    auto outcomes = rules->outcomes(limits, cost, v);
    if constexpr (std::is_same_v<T, Decision>) {
      Decision d = combine(outcomes, v[1] == 1);
      // The script decided at v[0] (its unit): where an allowed hit charged, for refund().
      if (hit && d.allowed && v[0] >= 0) d.charged_at_us = v[0] * (1000 / rules->time_scale());
      return d;
    } else {
      return to_stats(limits, outcomes);
    }
  }
  mutable Ints scratch_{};
};

// A strategy made of ScriptedRules: hit/test/stats are one script call, reset one DEL.
class ScriptedLimiter final : public LimiterStrategy {
 public:
  ScriptedLimiter(const std::shared_ptr<Store>& store, const LimiterOptions& o,
                  std::shared_ptr<const ScriptedRules> rules)
      : LimiterStrategy(store), time_(store, o.clock), rules_(std::move(rules)), multi_(scripted_multi(rules_)) {}

  std::string_view name() const noexcept override { return rules_->name(); }
  ClockMode clock() const noexcept override { return time_.effective(); }
  std::shared_ptr<Op<Decision>> make_hit(const std::vector<RateLimit>& limits, std::string_view key,
                                         std::int64_t cost, std::string_view tag = {}) override;
  std::shared_ptr<Op<Decision>> make_test(const std::vector<RateLimit>& limits, std::string_view key,
                                          std::int64_t cost, std::string_view tag = {}) override;
  std::shared_ptr<Op<std::vector<LimitStats>>> make_stats(const std::vector<RateLimit>& limits, std::string_view key,
                                                          std::string_view tag = {}) override;
  std::shared_ptr<Op<std::monostate>> make_reset(const std::vector<RateLimit>& limits, std::string_view key,
                                                 std::string_view tag = {}) override;
  std::shared_ptr<Op<Decision>> make_hit_all(const std::vector<KeyedLimits>& items, std::int64_t cost,
                                             std::string_view tag) override {
    return make_multi_decision(store_, time_, multi_, items, cost, tag, true);
  }
  std::shared_ptr<Op<Decision>> make_test_all(const std::vector<KeyedLimits>& items, std::int64_t cost,
                                              std::string_view tag) override {
    return make_multi_decision(store_, time_, multi_, items, cost, tag, false);
  }
  Decision hit(const std::vector<RateLimit>& limits, std::string_view key, std::int64_t cost) override {
    return decide_now(limits, key, cost, true);
  }
  Decision test(const std::vector<RateLimit>& limits, std::string_view key, std::int64_t cost) override {
    return decide_now(limits, key, cost, false);
  }
  // refunds.cpp
  std::shared_ptr<Op<Adjustment>> make_refund(const std::vector<RateLimit>& limits, std::string_view key,
                                              std::int64_t cost, std::string_view request_id,
                                              std::string_view tag = {},
                                              std::optional<std::int64_t> charged_at_us = std::nullopt) override;
  std::shared_ptr<Op<Adjustment>> make_reserve(const std::vector<RateLimit>& limits, std::string_view key,
                                               std::int64_t estimate, std::string_view request_id,
                                               std::int64_t deadline_ms, std::string_view tag = {}) override;
  std::shared_ptr<Op<Adjustment>> make_settle(const std::vector<RateLimit>& limits, std::string_view key,
                                              std::string_view request_id, std::int64_t actual,
                                              std::string_view tag = {}) override;
  // leased.cpp: a test, then a hit of the lease (the exact log stamps it with its end).
  std::shared_ptr<Op<LeaseGrant>> make_take_lease(const std::vector<RateLimit>& limits, std::string_view key,
                                                  std::int64_t least, std::int64_t most,
                                                  std::vector<Request> before) override;
  std::int64_t lease_now_ms() const override { return time_.now_ms(); }

 private:
  void check(const std::vector<RateLimit>& limits, std::string_view key, std::int64_t cost) const;
  std::shared_ptr<Op<Decision>> decide(const std::vector<RateLimit>& limits, std::string_view key, std::int64_t cost,
                                       bool hit, std::string_view tag);
  // The same operation on this stack frame, borrowing the arguments.
  Decision decide_now(const std::vector<RateLimit>& limits, std::string_view key, std::int64_t cost, bool hit) {
    check(limits, key, cost);
    ClockedScript<Decision, ScriptedSpec<Decision, false>> op(
        time_, rules_->time_scale(), ScriptedSpec<Decision, false>{rules_.get(), limits, key, cost, hit});
    return run(*store_, op);
  }

  TimeSource time_;
  std::shared_ptr<const ScriptedRules> rules_;
  std::shared_ptr<const MultiRules> multi_;
};

std::unique_ptr<LimiterStrategy> make_fixed_window(std::shared_ptr<Store> store, const LimiterOptions& o);
std::unique_ptr<LimiterStrategy> make_sliding_log(std::shared_ptr<Store> store, const LimiterOptions& o);
std::unique_ptr<LimiterStrategy> make_sliding_approx(std::shared_ptr<Store> store, const LimiterOptions& o);
std::unique_ptr<LimiterStrategy> make_token_bucket(std::shared_ptr<Store> store, const LimiterOptions& o);
std::unique_ptr<LimiterStrategy> make_gcra(std::shared_ptr<Store> store, const LimiterOptions& o);
std::unique_ptr<LimiterStrategy> make_concurrency(std::shared_ptr<Store> store, const LimiterOptions& o);

}  // namespace redcount::detail
