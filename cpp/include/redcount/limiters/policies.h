// What runs in front of a limiter's decisions: allow and deny lists and a cache of refusals
// the store made (decided in the process, before any round trip), and escalating penalties
// (state in the store). The Guard puts them together as operations (operation.h), so a
// decision has one path whatever drives it (sync, asyncio, a batch):
//
//   Guard guard(store, "redcount:lim", {.allow = {"10.0.0.0/8"}, .deny = {"203.0.113.0/24"},
//                                       .refusal_cache = 10'000, .penalty = PenaltyConfig{}});
//   auto op = guard.make_hit(*strategy, limits, "ip:10.1.2.3", 1, {}, CallPenalty{});
//   Decision d = run(*store, *op);   // allow-listed: the op completes with no batch at all
//
// AccessLists match a key exactly or, when the key names an IP address or network (itself,
// or after its first ':' as in "ip:2001:db8::1"), by IPv4 and IPv6 CIDR. The most specific
// entry wins (an exact key, then the longest prefix); at equal specificity deny wins.
//
// RefusalCache remembers, per key, the last refusal the store made (limit, cost and until
// when, by the store's clock) and repeats it for the same or a larger cost under the same
// limits until then. It never admits. Bounded (expired entries go first, then the oldest).
//
// PenaltyConfig: after `after` refusals within `within` seconds a key is blocked for
// `block` seconds, each block that follows within `within` of the previous one `factor`
// times longer, up to `max_block` (cpp/lua/penalty.lua keeps the state).
#pragma once

#include <atomic>
#include <cstddef>
#include <exception>
#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "redcount/common/limit_string.h"
#include "redcount/limiters/limiter.h"
#include "redcount/store/operation.h"
#include "redcount/store/store.h"

namespace redcount {

// What a deny-listed key is told to wait (one day): the lists do not change while the
// process runs, and a finite day keeps Retry-After a valid header.
inline constexpr std::int64_t kDeniedRetryAfterMs = 86'400'000;

// Allow and deny lists by key and by CIDR. Immutable after construction, so thread-safe.
class AccessLists {
 public:
  // Entries are keys (matched exactly, byte for byte), IP addresses or CIDRs ("10.0.0.0/8",
  // "2001:db8::/32", host bits clear). Throws InvalidArgument naming the list and the entry
  // for an empty entry, one that is not UTF-8, or a CIDR that is not valid.
  AccessLists(const std::vector<std::string>& allow, const std::vector<std::string>& deny);

  bool empty() const noexcept { return keys_.empty() && networks_.empty(); }
  // true: allowed, false: denied, nullopt: no entry matches.
  std::optional<bool> lookup(std::string_view key) const;
  std::size_t key_count() const noexcept { return keys_.size(); }
  std::size_t network_count() const noexcept { return networks_.size(); }

  struct Network {
    int version = 4;                  // 4 or 6
    unsigned char address[16] = {};   // 4 bytes used for IPv4
    int prefix = 0;                   // prefix length
    bool allowed = false;
  };

 private:
  std::unordered_map<std::string, bool> keys_;
  std::vector<Network> networks_;  // most specific first, deny before allow at one length
};

// The address or network a key names, if it names one ("203.0.113.9", "ip:203.0.113.9",
// "2001:db8::/64"); host bits of a network are cleared. For AccessLists and its tests.
std::optional<AccessLists::Network> network_of_key(std::string_view key);

// What the refusal cache files a key's state under: the key, or under a tag (tag=, a state
// of its own) "@{<tag>}:<key>".
std::string refusal_state_key(std::string_view key, std::string_view tag);

// A limit set as the refusal cache compares it: each limit's canonical text, ';'-joined.
std::string limits_text(const std::vector<RateLimit>& limits);

// Refusals the store made, per key. get() answers a refusal of the same limits and a cost
// at least as large until the store's retry_after ran out (only time frees units); other
// limits for the key drop the entry. At most `size` keys. Thread-safe (one mutex, never held
// across a store call).
class RefusalCache {
 public:
  // `now_ms`: the limiter's clock (the store's; a ManualClock in tests). Size 0: off.
  RefusalCache(std::size_t size, std::function<std::int64_t()> now_ms);

  std::optional<Decision> get(std::string_view limits, std::string_view key, std::int64_t cost);
  // Remembers a refusal the store made; an allowed, unavailable or zero-wait one is ignored.
  void put(std::string_view limits, std::string_view key, std::int64_t cost, const Decision& d);
  void drop(std::string_view key);
  void clear();
  std::size_t size() const;
  std::size_t capacity() const noexcept { return size_; }
  // Refusals answered from the cache (for tests and the bench).
  std::uint64_t hits() const;

 private:
  struct Entry {
    std::string limits;
    std::int64_t cost = 0;
    std::int64_t until_ms = 0;
    std::int64_t reset_until_ms = 0;
    std::int64_t amount = 0;
    std::list<std::string>::iterator order;
  };
  std::size_t size_;
  std::function<std::int64_t()> now_ms_;
  mutable std::mutex mu_;
  std::unordered_map<std::string, Entry> map_;
  std::list<std::string> order_;  // keys, oldest first
  std::uint64_t hits_ = 0;
};

// An escalating penalty, validated when made against the bounds penalty.lua accepts.
struct PenaltyConfig {
  std::int64_t after = 5;    // refusals
  double within = 60.0;      // seconds
  double block = 60.0;       // seconds
  double factor = 2.0;
  double max_block = 3600.0;  // seconds

  // Throws InvalidArgument naming the field ("Penalty(factor=) must be between 1 and
  // 1,000,000 ...") when a value is out of the script's bounds: after >= 1; within, block,
  // max_block finite and whole ms from 1 to 2^42; factor from 1 to 10^6; max_block >= block
  // (in whole ms).
  static PenaltyConfig make(std::int64_t after, double within, double block, double factor, double max_block);
  void validate() const;

  std::int64_t within_ms() const noexcept;
  std::int64_t block_ms() const noexcept;
  std::int64_t max_block_ms() const noexcept;
  // penalty.lua's ARGV: after, within_ms, block_ms, factor, max_ms.
  std::vector<std::string> script_args() const;

  friend bool operator==(const PenaltyConfig&, const PenaltyConfig&) = default;
};

inline constexpr std::int64_t kPenaltyMaxSpanMs = std::int64_t{1} << 42;
inline constexpr double kPenaltyMinFactor = 1.0;
inline constexpr double kPenaltyMaxFactor = 1e6;

// A call's penalty=: the limiter's (the default), none for this call, or the one given
// (under the limiter's prefix: the same block and counts as the limiter's own penalty).
struct CallPenalty {
  enum class Kind { Limiter, Off, Given } kind = Kind::Limiter;
  PenaltyConfig given;
  static CallPenalty off() { return {Kind::Off, {}}; }
  static CallPenalty of(PenaltyConfig p) { return {Kind::Given, p}; }
};

// What a decision whose store failed (ConnectionError, not StoreClosed) returns.
enum class OnUnavailable { Raise, Allow, Deny };
inline constexpr std::int64_t kUnavailableRetryAfterMs = 1000;
// The decision of `policy` for a failed store (throws `error` for Raise, for StoreClosed
// and for anything that is not a ConnectionError).
Decision unavailable_decision(OnUnavailable policy, std::exception_ptr error);

// The lists, the refusal cache and the penalty in front of one limiter's decisions. Every
// make_* returns an operation any driver runs; a decision the lists or the cache make is an
// operation already complete (its prepare() sends nothing). Thread-safe.
class Guard {
 public:
  struct Options {
    std::vector<std::string> allow;
    std::vector<std::string> deny;
    std::size_t refusal_cache = 0;
    std::optional<PenaltyConfig> penalty;
    OnUnavailable on_unavailable = OnUnavailable::Raise;
  };
  // Throws InvalidArgument for a bad list entry or penalty.
  Guard(std::shared_ptr<Store> store, std::string prefix, Options options);

  // Every make_* takes the call's penalty= and on_unavailable (nullopt: the guard's; an
  // asyncio view of a limiter may have its own).
  // Whether anything runs in front of the decisions (lists, a cache or a penalty).
  bool active() const noexcept { return access_ || cache_ || penalty_; }

  std::shared_ptr<Op<Decision>> make_hit(LimiterStrategy& strategy, const std::vector<RateLimit>& limits,
                                         std::string_view key, std::int64_t cost, std::string_view tag = {},
                                         const CallPenalty& penalty = {},
                                         std::optional<OnUnavailable> on_unavailable = std::nullopt);
  std::shared_ptr<Op<Decision>> make_test(LimiterStrategy& strategy, const std::vector<RateLimit>& limits,
                                          std::string_view key, std::int64_t cost, std::string_view tag = {},
                                          const CallPenalty& penalty = {},
                                         std::optional<OnUnavailable> on_unavailable = std::nullopt);
  std::shared_ptr<Op<Decision>> make_hit_all(LimiterStrategy& strategy, const std::vector<KeyedLimits>& items,
                                             std::int64_t cost, std::string_view tag = {},
                                             const CallPenalty& penalty = {},
                                         std::optional<OnUnavailable> on_unavailable = std::nullopt);
  std::shared_ptr<Op<Decision>> make_test_all(LimiterStrategy& strategy, const std::vector<KeyedLimits>& items,
                                              std::int64_t cost, std::string_view tag = {},
                                              const CallPenalty& penalty = {},
                                         std::optional<OnUnavailable> on_unavailable = std::nullopt);
  // The key's state deleted, and its cached refusal forgotten.
  std::shared_ptr<Op<std::monostate>> make_reset(LimiterStrategy& strategy, const std::vector<RateLimit>& limits,
                                                 std::string_view key, std::string_view tag = {});

  // A decision the lists or the cache make for hit/test (nullopt: ask the store). Used by
  // a caller whose own path stays outside the guard's ops (a leased hit).
  std::optional<Decision> decide_locally(const std::vector<RateLimit>& limits, std::string_view key,
                                         std::int64_t cost, std::string_view tag, const CallPenalty& penalty);
  // For such a caller, the steps around its decision: the block check before it (nullopt:
  // no block in force, or no penalty, or the store failed, which the decision itself will
  // meet; else the blocked decision, filed in the cache) and what follows it (a charged
  // refusal counted by the penalty, a refusal filed in the cache).
  std::shared_ptr<Op<std::optional<Decision>>> make_block_check(const std::vector<RateLimit>& limits,
                                                                std::string_view key, const CallPenalty& penalty);
  std::shared_ptr<Op<Decision>> make_after(const std::vector<RateLimit>& limits, std::string_view key,
                                           std::int64_t cost, std::string_view tag, const CallPenalty& penalty,
                                           Decision decided, bool charge,
                                           std::optional<OnUnavailable> on_unavailable = std::nullopt);

  const AccessLists* access() const noexcept { return access_.get(); }
  RefusalCache* cache() const noexcept { return cache_.get(); }
  const std::optional<PenaltyConfig>& penalty() const noexcept { return penalty_; }
  const std::string& prefix() const noexcept { return prefix_; }
  OnUnavailable on_unavailable() const noexcept { return on_unavailable_.load(std::memory_order_relaxed); }
  // The limiter's on_unavailable may change while it runs; operations made after see it.
  void set_on_unavailable(OnUnavailable p) noexcept { on_unavailable_.store(p, std::memory_order_relaxed); }

 private:
  std::shared_ptr<Op<Decision>> one(LimiterStrategy& strategy, const std::vector<RateLimit>& limits,
                                    std::string_view key, std::int64_t cost, std::string_view tag,
                                    const CallPenalty& penalty, bool charge, std::optional<OnUnavailable> u);
  std::shared_ptr<Op<Decision>> many(LimiterStrategy& strategy, const std::vector<KeyedLimits>& items,
                                     std::int64_t cost, std::string_view tag, const CallPenalty& penalty,
                                     bool charge, std::optional<OnUnavailable> u);
  const PenaltyConfig* penalty_for(const CallPenalty& p) const noexcept;

  std::shared_ptr<Store> store_;
  std::string prefix_;
  std::shared_ptr<const AccessLists> access_;
  std::shared_ptr<RefusalCache> cache_;
  std::optional<PenaltyConfig> penalty_;
  std::atomic<OnUnavailable> on_unavailable_;
  // Whether one script call can carry every key of a hit_all and its block keys (a single
  // server, memory://; not a cluster). -1 until first asked.
  bool one_slot();
  std::atomic<int> one_slot_{-1};
};

// Decisions made without the store.
Decision allowed_decision(const std::vector<RateLimit>& limits);  // remaining == the tightest limit
Decision denied_decision(const std::vector<RateLimit>& limits);   // retry_after one day
Decision blocked_decision(const std::vector<RateLimit>& limits, std::int64_t ms);

}  // namespace redcount
