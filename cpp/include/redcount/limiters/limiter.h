// Rate-limit strategies behind redcount.Limiter.
//
//   auto limiter = make_limiter(store, "sliding-window", "redcount:lim");
//   Decision d = limiter->hit(parse_limits("5/second;100/hour"), "ip:1.2.3.4", 1);
//   if (!d.allowed) sleep_for(d.retry_after_ms);
//
// Every strategy decides several limits in one round trip and all-or-nothing: either
// each limit is charged or none is, so a denied hit stores nothing. Strategies:
//   fixed-window           clock-aligned windows, one counter per window
//   sliding-window         exact sliding log (a sorted set of admitted hits)
//   sliding-window-approx  weighted sub-bucket estimate, O(k) per key
//   token-bucket           capacity ("burst") refilled continuously at the limit's rate
//   gcra                   generic cell rate algorithm: one timestamp per key
//   concurrency            at most N leases in flight per key (acquire/release)
//
// Every method is also an operation (see operation.h): make_hit(...) returns an
// Op<Decision> that any driver can run; the method is `run(*store, *make_hit(...))`.
//
// Thread-safe.
#pragma once

#include <cstdint>
#include <atomic>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "redcount/common/calendar.h"
#include "redcount/common/limit_string.h"
#include "redcount/store/operation.h"
#include "redcount/store/store.h"
#include "redcount/store/scripts.h"
#include "redcount/store/time_source.h"

namespace redcount {

struct LeaseGrant;  // leased.h

struct Decision {
  bool allowed = false;
  std::int64_t limit = 0;           // the binding limit's amount
  std::int64_t remaining = 0;       // hits of cost 1 still allowed under every limit
  std::int64_t reset_after_ms = 0;  // until the binding limit's window resets
  std::int64_t retry_after_ms = 0;  // 0 when allowed; else until this hit would be allowed
  // Decided without the store (it was unavailable) by the caller's on_unavailable policy.
  bool unavailable = false;
  // hit_all/test_all: the binding limit (one limit's text, e.g. "100/minute") and its key:
  // when refused, the refusing one (the one that frees up last when several refuse), else
  // the one with the fewest hits left. Empty from the single-key methods.
  std::string binding_limit;
  std::string binding_key;
  // hit_all/test_all: per item, in the caller's order, {amount, remaining} of the item's
  // tightest limit as decided (what a metric or a header of that item reports). Empty from
  // the single-key methods.
  std::vector<std::pair<std::int64_t, std::int64_t>> per_item;
  // An allowed single-key hit of a rate strategy: when it charged, by the limiter's clock,
  // in µs since the epoch (the time the strategy's script decided at). refund() given it
  // credits only what still holds that charge. nullopt: nothing charged, or not known
  // (a test, hit_all, a decision made without the store, the concurrency strategy).
  std::optional<std::int64_t> charged_at_us;
};

// One part of a decision across several keys (hit_all): limits that must all hold for key.
struct KeyedLimits {
  std::vector<RateLimit> limits;
  std::string key;
};

struct LimitStats {
  RateLimit limit;
  std::int64_t count = 0;
  std::int64_t remaining = 0;
  std::int64_t reset_after_ms = 0;
};

// A slot held under the concurrency strategy until released or until it expires.
struct Lease {
  std::string key;               // the business key
  std::string storage_key;       // the sorted set holding the key's leases
  std::string id;                // unique lease id (the set member)
  std::int64_t max_in_flight = 0;
  std::int64_t expires_at_ms = 0;  // by the limiter's clock
  std::shared_ptr<std::atomic<bool>> released = std::make_shared<std::atomic<bool>>(false);
};

// What refund(), reserve() and settle() did.
struct Adjustment {
  enum class Status {
    Applied,    // done now
    Duplicate,  // the request id's refund, reservation or settlement was already done: nothing changed
    Refused,    // reserve(): a limit refused the estimate; nothing was charged
    Expired,    // settle(): no reservation under that id (never made, refused, or past its
                // deadline, where it settled at the estimate); nothing changed
  };
  Status status = Status::Applied;
  // refund(): units given back (the fewest over the limits; less than the cost when less
  // was charged). reserve(): the estimate charged. settle(): > 0 what was given back (the
  // fewest over the limits: at most estimate - actual, only where the reservation charged),
  // < 0 charged (estimate - actual).
  std::int64_t units = 0;
  // reserve() and settle(): the reservation's estimate (0 when none was found).
  std::int64_t estimate = 0;
  // The key's state afterwards, as test(limits, key, 1) decides it; reserve(): the
  // reservation's own decision (allowed unless refused; retry_after for the estimate).
  Decision decision;
};

struct LimiterOptions {
  std::string prefix = "redcount:lim";
  ClockMode clock = ClockMode::Client;
  // sliding-window-approx: the window is split into this many sub-buckets (1 = the
  // classic two-bucket estimate). 1..60, and it must divide the window in milliseconds.
  std::int64_t sub_buckets = 1;
  // fixed-window only: windows are this calendar's periods (a limit's unit must then be
  // day, week, month or year, with no multiple). See calendar.h.
  std::shared_ptr<const Calendar> calendar{};
};

class LimiterStrategy {
 public:
  virtual ~LimiterStrategy() = default;
  virtual std::string_view name() const noexcept = 0;
  // Charges `cost` against every limit if all of them allow it. (The synchronous methods
  // run the make_ operation; a strategy may override them to run the same operation
  // without copying its arguments.)
  virtual Decision hit(const std::vector<RateLimit>& limits, std::string_view key, std::int64_t cost) {
    return run(*store_, *make_hit(limits, key, cost));
  }
  // Whether hit() would allow it now, without charging anything.
  virtual Decision test(const std::vector<RateLimit>& limits, std::string_view key, std::int64_t cost) {
    return run(*store_, *make_test(limits, key, cost));
  }
  std::vector<LimitStats> stats(const std::vector<RateLimit>& limits, std::string_view key,
                                std::string_view tag = {}) {
    return run(*store_, *make_stats(limits, key, tag));
  }
  // One decision across several keys: charges `cost` against every limit of every item if
  // all of them allow it, else against none (the Decision names the refusing limit and
  // key). Keys in one slot (every key of a single-node store or of memory://, or keys put
  // under one hash tag with a non-empty `tag`) are decided by one script call, atomically.
  // On a cluster, keys in different slots are charged by one script call per slot, all in
  // one pipelined batch; when any refuses, what the others charged is given back in a
  // second batch: never admits past a limit, but a concurrent call may be refused by units
  // given back a moment later. `tag` puts every key under it (a key's state under a tag
  // is separate from its untagged state). Not for strategy='concurrency'.
  Decision hit_all(const std::vector<KeyedLimits>& items, std::int64_t cost, std::string_view tag = {}) {
    return run(*store_, *make_hit_all(items, cost, tag));
  }
  // Whether hit_all() would allow it now, without charging anything.
  Decision test_all(const std::vector<KeyedLimits>& items, std::int64_t cost, std::string_view tag = {}) {
    return run(*store_, *make_test_all(items, cost, tag));
  }
  // Forgets the key's current state under these limits.
  void reset(const std::vector<RateLimit>& limits, std::string_view key, std::string_view tag = {}) {
    run(*store_, *make_reset(limits, key, tag));
  }

  // The concurrency strategy only (others throw InvalidArgument): takes one of at most
  // `max_in_flight` slots of `key` for up to `lease_timeout_ms`, or nullopt when all are
  // taken. release() frees it: true when the lease was still held, false when it had
  // already expired; a second release of the same lease throws InvalidArgument.
  std::optional<Lease> acquire(std::int64_t max_in_flight, std::string_view key, std::int64_t lease_timeout_ms) {
    return run(*store_, *make_acquire(max_in_flight, key, lease_timeout_ms));
  }
  bool release(const Lease& lease) { return run(*store_, *make_release(lease)); }
  // Leases of `key` in flight now (concurrency strategy only).
  std::int64_t in_flight(std::string_view key) { return run(*store_, *make_in_flight(key)); }

  // Refunds and reservations (every rate strategy; concurrency throws InvalidArgument).
  // refund() gives back up to `cost` units charged to `key` under every limit (see
  // refunds.cpp for what each strategy gives back). With a request id it is done once:
  // a refund under an id already applied changes nothing (Status::Duplicate); the id's
  // marker is written with the refund, atomically, and lives at least as long as the
  // longest window. `charged_at_us` (a hit's Decision::charged_at_us) says where the units
  // were charged: only the state that still holds that charge is credited (the charged
  // window while it lasts; for the buckets what has not refilled since). Without it the
  // current state is credited (the current window).
  Adjustment refund(const std::vector<RateLimit>& limits, std::string_view key, std::int64_t cost,
                    std::string_view request_id = {}, std::string_view tag = {},
                    std::optional<std::int64_t> charged_at_us = std::nullopt) {
    return run(*store_, *make_refund(limits, key, cost, request_id, tag, charged_at_us));
  }
  // Charges `estimate` if every limit allows it, as hit() would, and records the
  // reservation under `request_id` for `deadline_ms` in the same script. A second reserve
  // under the id changes nothing (Duplicate). Refused: nothing charged, nothing recorded.
  Adjustment reserve(const std::vector<RateLimit>& limits, std::string_view key, std::int64_t estimate,
                     std::string_view request_id, std::int64_t deadline_ms, std::string_view tag = {}) {
    return run(*store_, *make_reserve(limits, key, estimate, request_id, deadline_ms, tag));
  }
  // Settles the reservation `request_id` at `actual`: gives back estimate - actual (only to
  // the state that still holds the reservation's charge: its window while current, what has
  // not refilled), or charges actual - estimate whatever the limits say (the units were used). Once: a
  // second settle is a Duplicate; after the deadline the reservation is gone (it settled
  // at the estimate) and settle changes nothing (Expired).
  Adjustment settle(const std::vector<RateLimit>& limits, std::string_view key, std::string_view request_id,
                    std::int64_t actual, std::string_view tag = {}) {
    return run(*store_, *make_settle(limits, key, request_id, actual, tag));
  }
  // `tag` (every make_ method below that takes one): the key's state under that hash tag,
  // the state hit_all(..., tag) and hit(..., tag) write; empty: its untagged state.
  virtual std::shared_ptr<Op<Adjustment>> make_refund(const std::vector<RateLimit>& limits, std::string_view key,
                                                      std::int64_t cost, std::string_view request_id,
                                                      std::string_view tag = {},
                                                      std::optional<std::int64_t> charged_at_us = std::nullopt);
  virtual std::shared_ptr<Op<Adjustment>> make_reserve(const std::vector<RateLimit>& limits, std::string_view key,
                                                       std::int64_t estimate, std::string_view request_id,
                                                       std::int64_t deadline_ms, std::string_view tag = {});
  virtual std::shared_ptr<Op<Adjustment>> make_settle(const std::vector<RateLimit>& limits, std::string_view key,
                                                      std::string_view request_id, std::int64_t actual,
                                                      std::string_view tag = {});

  // The same as operations (operation.h): validated here, nothing sent until run. Each
  // owns copies of the limits and the key. make_release marks the lease released at once,
  // so a second make_release of it throws.
  virtual std::shared_ptr<Op<Decision>> make_hit(const std::vector<RateLimit>& limits, std::string_view key,
                                                 std::int64_t cost, std::string_view tag = {}) = 0;
  virtual std::shared_ptr<Op<Decision>> make_test(const std::vector<RateLimit>& limits, std::string_view key,
                                                  std::int64_t cost, std::string_view tag = {}) = 0;
  virtual std::shared_ptr<Op<std::vector<LimitStats>>> make_stats(const std::vector<RateLimit>& limits,
                                                                  std::string_view key, std::string_view tag = {}) = 0;
  virtual std::shared_ptr<Op<std::monostate>> make_reset(const std::vector<RateLimit>& limits, std::string_view key,
                                                         std::string_view tag = {}) = 0;
  virtual std::shared_ptr<Op<Decision>> make_hit_all(const std::vector<KeyedLimits>& items, std::int64_t cost,
                                                     std::string_view tag);
  virtual std::shared_ptr<Op<Decision>> make_test_all(const std::vector<KeyedLimits>& items, std::int64_t cost,
                                                      std::string_view tag);
  virtual std::shared_ptr<Op<std::optional<Lease>>> make_acquire(std::int64_t max_in_flight, std::string_view key,
                                                                 std::int64_t lease_timeout_ms);
  virtual std::shared_ptr<Op<bool>> make_release(const Lease& lease);
  virtual std::shared_ptr<Op<std::int64_t>> make_in_flight(std::string_view key);

  // Leased limits (leased.h): the operation that charges at least `least` and at most
  // `most` units against every limit, for a process to admit locally, after the requests in
  // `before` (in the same round trip). The fixed-window strategy only; the others throw
  // InvalidArgument.
  virtual std::shared_ptr<Op<LeaseGrant>> make_take_lease(const std::vector<RateLimit>& limits, std::string_view key,
                                                          std::int64_t least, std::int64_t most,
                                                          std::vector<Request> before);
  // The time leases are decided by: the clock that names the windows.
  virtual std::int64_t lease_now_ms() const { return store_->now_ms(); }

  // The time source's mode in force ("client", "server" or "server-offset").
  virtual ClockMode clock() const noexcept = 0;
  const std::shared_ptr<Store>& store() const noexcept { return store_; }

 protected:
  explicit LimiterStrategy(std::shared_ptr<Store> store) : store_(std::move(store)) {}
  std::shared_ptr<Store> store_;
};

// Throws InvalidArgument for an unknown name, listing the known ones, or a bad option.
std::unique_ptr<LimiterStrategy> make_limiter(std::shared_ptr<Store> store, std::string_view strategy,
                                              LimiterOptions options = {});
// The same with default options and this key prefix.
std::unique_ptr<LimiterStrategy> make_limiter(std::shared_ptr<Store> store, std::string_view strategy,
                                              std::string prefix);
std::vector<std::string> limiter_strategies();

// Checks cost against the limits: 1 <= cost <= each limit's amount (its capacity when
// `use_capacity`, for the bucket strategies).
void validate_cost(const std::vector<RateLimit>& limits, std::int64_t cost, bool use_capacity = false);

}  // namespace redcount
