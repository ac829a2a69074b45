// Private helpers shared by the limiter strategies and the sliding-window counter.
#pragma once

#include <atomic>
#include <charconv>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "redcount/errors.h"
#include "redcount/limiter.h"
#include "redcount/limits.h"
#include "redcount/memory_store.h"
#include "redcount/store.h"
#include "redcount/time_source.h"
#include "redcount/util.h"
#include "redcount/window.h"

namespace redcount::detail {

// count + cost > limit, exact for every int64 (a foreign write can leave any count).
inline bool exceeds(std::int64_t count, std::int64_t cost, std::int64_t limit) {
  std::int64_t sum = 0;
  if (__builtin_add_overflow(count, cost, &sum)) return cost > 0;
  return sum > limit;
}

// max(0, limit - count), saturating.
inline std::int64_t remaining_of(std::int64_t limit, std::int64_t count) {
  std::int64_t rem = 0;
  if (__builtin_sub_overflow(limit, count, &rem)) return std::numeric_limits<std::int64_t>::max();
  return rem < 0 ? 0 : rem;
}

// ceil(a / b) for b > 0 and any a.
inline std::int64_t ceil_div(std::int64_t a, std::int64_t b) {
  return a >= 0 ? (a + b - 1) / b : -((-a) / b);
}

// Saturating arithmetic for native scripts working on values read from the store: a
// foreign write can leave any int64 there, and Lua (doubles) never overflows either.
inline std::int64_t sat_add(std::int64_t a, std::int64_t b) {
  std::int64_t r = 0;
  if (!__builtin_add_overflow(a, b, &r)) return r;
  return b > 0 ? std::numeric_limits<std::int64_t>::max() : std::numeric_limits<std::int64_t>::min();
}
inline std::int64_t sat_sub(std::int64_t a, std::int64_t b) {
  std::int64_t r = 0;
  if (!__builtin_sub_overflow(a, b, &r)) return r;
  return b < 0 ? std::numeric_limits<std::int64_t>::max() : std::numeric_limits<std::int64_t>::min();
}
inline std::int64_t sat_mul(std::int64_t a, std::int64_t b) {
  std::int64_t r = 0;
  if (!__builtin_mul_overflow(a, b, &r)) return r;
  return (a < 0) == (b < 0) ? std::numeric_limits<std::int64_t>::max() : std::numeric_limits<std::int64_t>::min();
}

// A numeric script argument within [lo, hi], or nullopt. Native scripts only accept the
// ranges the strategies ever send, so malformed calls get an error reply, never UB.
inline std::optional<std::int64_t> arg_in(const std::string& arg, std::int64_t lo, std::int64_t hi) {
  auto v = parse_int64(arg);
  if (!v || *v < lo || *v > hi) return std::nullopt;
  return v;
}
inline constexpr std::int64_t kMaxExact = std::int64_t{1} << 53;   // exact in a Lua double
inline constexpr std::int64_t kMaxSpanMs = std::int64_t{1} << 42;  // about 139 years
// The exact log and the concurrency limiter store one set member per unit of cost.
inline constexpr std::int64_t kMaxMembers = 1'000'000;

// "<prefix>:<kind>:<amount>:{<key>}:<window_ms>" built with one allocation; `extra`
// (e.g. ":<capacity>") goes after the amount.
inline std::string limiter_key(std::string_view prefix, std::string_view kind, std::int64_t amount,
                               std::string_view extra, std::string_view key, std::int64_t window_ms) {
  char num1[24], num2[24];
  const std::size_t n1 = static_cast<std::size_t>(std::to_chars(num1, num1 + sizeof num1, amount).ptr - num1);
  const std::size_t n2 = static_cast<std::size_t>(std::to_chars(num2, num2 + sizeof num2, window_ms).ptr - num2);
  std::string out;
  out.reserve(prefix.size() + kind.size() + extra.size() + key.size() + n1 + n2 + 8);
  out.append(prefix).append(":").append(kind).append(":").append(num1, n1);
  out.append(extra).append(":{").append(key).append("}:").append(num2, n2);
  return out;
}

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
Decision combine(const std::vector<Outcome>& outcomes, bool allowed);
std::vector<LimitStats> to_stats(const std::vector<RateLimit>& limits, const std::vector<Outcome>& outcomes);

// Unique member ids: a random per-process base plus a counter, unique across processes;
// `in_process` gives a short id (the counter alone) unique within this process only.
std::string unique_id(bool in_process = false);

// The time a native script runs at: the argument, or the store's clock for "" (the Lua
// twin reads TIME then). `scale` 1000 gives microseconds. nullopt for a malformed one.
std::optional<std::int64_t> script_time(Keyspace& ks, const std::string& arg, std::int64_t scale = 1);

// Throws unless every limit's amount is at most kMaxMembers (strategies that store one
// entry per admitted hit).
void require_members(const std::vector<RateLimit>& limits, std::string_view strategy);
// Throws unless every window is at most kMaxSpanMs.
void require_span(const std::vector<RateLimit>& limits, std::string_view strategy);

// Checks a script reply is an array of exactly `size` elements; returns it as integers.
std::vector<std::int64_t> integers(const Reply& reply, std::size_t size, std::string_view script);

// Throws unless no limit carries a burst ("burst" only means something to the buckets).
void require_no_burst(const std::vector<RateLimit>& limits, std::string_view strategy);
// Throws unless amount * window_ms (or capacity * window_ms) stays exact in a Lua double.
void require_exact(const std::vector<RateLimit>& limits, std::string_view strategy, bool use_capacity);
void require_limits(const std::vector<RateLimit>& limits);

// Reply::of_error for a native script given arguments it cannot parse.
Reply malformed(std::string_view script);

// A strategy that decides with one script call over one key per limit, in "hit" or
// "test" mode: hit/test/stats/reset come from run(), check() and storage_key().
class ScriptedLimiter : public LimiterStrategy {
 public:
  ScriptedLimiter(const std::shared_ptr<Store>& store, const LimiterOptions& o)
      : store_(store), time_(store, o.clock), prefix_(o.prefix), memory_(dynamic_cast<MemoryStore*>(store.get())) {}

  ClockMode clock() const noexcept override { return time_.effective(); }
  Decision hit(const std::vector<RateLimit>& limits, std::string_view key, std::int64_t cost) override {
    return run(limits, key, cost, "hit", nullptr);
  }
  Decision test(const std::vector<RateLimit>& limits, std::string_view key, std::int64_t cost) override {
    return run(limits, key, cost, "test", nullptr);
  }
  std::vector<LimitStats> stats(const std::vector<RateLimit>& limits, std::string_view key) override {
    std::vector<Outcome> outcomes;
    run(limits, key, 1, "test", &outcomes);
    return to_stats(limits, outcomes);
  }
  void reset(const std::vector<RateLimit>& limits, std::string_view key) override;

 protected:
  // Throws InvalidArgument unless the limits suit this strategy.
  virtual void check(const std::vector<RateLimit>& limits) const = 0;
  virtual std::string storage_key(const RateLimit& limit, std::string_view key) const = 0;
  // One decision; with `stats_out` (stats()), cost is 1 and not validated against the limits.
  virtual Decision run(const std::vector<RateLimit>& limits, std::string_view key, std::int64_t cost,
                       const char* mode, std::vector<Outcome>* stats_out) = 0;

  // The memory store, for the typed fast path (run_typed), or null.
  MemoryStore* memory() const noexcept { return memory_; }

  std::shared_ptr<Store> store_;
  TimeSource time_;
  std::string prefix_;

 private:
  MemoryStore* memory_;
};

// Runs a native script's typed core on the memory store under its lock, at the store's
// now: what a script call does, minus formatting arguments and parsing the reply.
template <class Call>
std::vector<std::int64_t> run_typed(MemoryStore& store, Call& call,
                                    std::optional<std::vector<std::int64_t>> (*core)(Keyspace&, const Call&),
                                    std::string_view script) {
  struct Ctx {
    Call* call;
    decltype(core) fn;
    std::optional<std::vector<std::int64_t>> out;
  } ctx{&call, core, std::nullopt};
  store.atomically(
      [](Keyspace& ks, void* p) {
        auto* c = static_cast<Ctx*>(p);
        c->call->now = ks.now_ms();
        c->out = c->fn(ks, *c->call);
      },
      &ctx);
  if (!ctx.out) throw InvalidArgument(std::string(script) + ": arguments out of range");
  return std::move(*ctx.out);
}

std::unique_ptr<LimiterStrategy> make_fixed_window(std::shared_ptr<Store> store, const LimiterOptions& o);
std::unique_ptr<LimiterStrategy> make_sliding_log(std::shared_ptr<Store> store, const LimiterOptions& o);
std::unique_ptr<LimiterStrategy> make_sliding_approx(std::shared_ptr<Store> store, const LimiterOptions& o);
std::unique_ptr<LimiterStrategy> make_token_bucket(std::shared_ptr<Store> store, const LimiterOptions& o);
std::unique_ptr<LimiterStrategy> make_gcra(std::shared_ptr<Store> store, const LimiterOptions& o);
std::unique_ptr<LimiterStrategy> make_concurrency(std::shared_ptr<Store> store, const LimiterOptions& o);

}  // namespace redcount::detail
