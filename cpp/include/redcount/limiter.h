// Rate-limit strategies behind redcount.Limiter.
//
//   auto limiter = make_limiter(store, "fixed-window", "redcount:lim");
//   Decision d = limiter->hit(parse_limits("5/second;100/hour"), "ip:1.2.3.4", 1);
//   if (!d.allowed) sleep_for(d.retry_after_ms);
//
// Every strategy decides several limits in one round trip and all-or-nothing: either
// each limit is charged or none is, so a denied hit stores nothing. New strategies
// subclass LimiterStrategy and register in make_limiter().
//
// Thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "redcount/limits.h"
#include "redcount/store.h"

namespace redcount {

extern const Script kFixedWindowHitScript;

struct Decision {
  bool allowed = false;
  std::int64_t limit = 0;           // the binding limit's amount
  std::int64_t remaining = 0;       // hits of cost 1 still allowed under every limit
  std::int64_t reset_after_ms = 0;  // until the binding limit's window resets
  std::int64_t retry_after_ms = 0;  // 0 when allowed; else until this hit would be allowed
};

struct LimitStats {
  RateLimit limit;
  std::int64_t count = 0;
  std::int64_t remaining = 0;
  std::int64_t reset_after_ms = 0;
};

class LimiterStrategy {
 public:
  virtual ~LimiterStrategy() = default;
  virtual std::string_view name() const noexcept = 0;
  // Charges `cost` against every limit if all of them allow it.
  virtual Decision hit(const std::vector<RateLimit>& limits, std::string_view key, std::int64_t cost) = 0;
  // Whether hit() would allow it now, without charging anything.
  virtual Decision test(const std::vector<RateLimit>& limits, std::string_view key, std::int64_t cost) = 0;
  virtual std::vector<LimitStats> stats(const std::vector<RateLimit>& limits, std::string_view key) = 0;
  // Forgets the key's current state under these limits.
  virtual void reset(const std::vector<RateLimit>& limits, std::string_view key) = 0;
};

// Names: "fixed-window". Throws InvalidArgument for an unknown name, listing the known ones.
std::unique_ptr<LimiterStrategy> make_limiter(std::shared_ptr<Store> store, std::string_view strategy,
                                              std::string prefix);
std::vector<std::string> limiter_strategies();

// Checks cost against the limits: 1 <= cost <= each limit's amount.
void validate_cost(const std::vector<RateLimit>& limits, std::int64_t cost);

}  // namespace redcount
