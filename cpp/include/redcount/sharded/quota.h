// Strong quotas and inventory: one key whose every operation is atomic and linearizable on
// its Redis master, guarded by a floor (and optionally a ceiling).
//
//   QuotaOptions o;
//   o.name = "merchant:1001:credits";
//   o.floor = 0;
//   Quota q(store, o);
//   q.set(10'000);
//   QuotaResult r = q.take(25, "order-77");   // refused (nothing changes) below the floor
//   if (r.applied) { /* the 25 units are ours; a retry with "order-77" will not take more */ }
//
// take/give are one Lua script (quota.lua, with a native twin on the memory store). With
// `durable` = N > 0, each write is followed in the same batch by WAIT N timeout, and the
// result says how many replicas acknowledged it (`replicas`, `durable_ok`); fewer than N
// within the timeout is a result (durable_ok = false), not an error. That narrows, and does
// not close, the window in which a failover loses a write: Redis replication stays
// asynchronous, WAIT only reports. The Redis store sends the write and its WAIT together
// on a connection kept for blocking commands (Command::blocks_for), never on the shared
// connections other callers use, and the call's deadline is command_timeout +
// durable_timeout. On the memory store there are no replicas: WAIT answers 0 at once, so
// every write that changed something reports replicas = 0, durable_ok = false.
//
// Thread-safe.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "redcount/common/calendar.h"
#include "redcount/store/operation.h"
#include "redcount/common/bounds.h"
#include "redcount/store/store.h"
#include "redcount/store/scripts.h"

namespace redcount {



struct QuotaOptions {
  std::string prefix = "redcount";
  std::string name;
  std::int64_t floor = 0;
  std::optional<std::int64_t> ceiling;             // none = kMaxQuota
  std::optional<std::int64_t> soft;                // report (never refuse) a value below this
  std::int64_t idempotency_ttl_ms = 86'400'000;
  std::int64_t durable = 0;                        // replicas to WAIT for after a write; 0 = none
  std::chrono::milliseconds durable_timeout{500};  // WAIT's timeout; > 0, added to the call's deadline
  // A scheduled reset: with a calendar, each period of `period` (a day, week, month or
  // year in its zone, see calendar.h) has a key of its own that starts at `reset_to` and
  // expires at the period's end plus `grace_ms`. Without one, the quota never resets.
  std::shared_ptr<const Calendar> calendar{};
  CalendarUnit period = CalendarUnit::Month;
  std::int64_t reset_to = 0;
  std::int64_t grace_ms = 1000;
};

struct QuotaResult {
  bool applied = false;        // take/give: done (or done before, for a repeated request id)
  std::int64_t value = 0;      // the value after the call (the current value when refused)
  bool duplicate = false;      // a repeat of a request id already applied; nothing changed now
  bool soft_exceeded = false;  // the value is below the soft threshold
  std::int64_t replicas = -1;  // replicas that acknowledged the write (WAIT); -1 when not asked
  // False when durable > 0 and fewer replicas acknowledged: the write is only on the master.
  bool durable_ok = true;
};

class Quota {
 public:
  Quota(std::shared_ptr<Store> store, QuotaOptions options);

  // Takes n (> 0) unless the value would go below the floor (then applied = false and
  // nothing changes). With a request id, a repeat of an applied take changes nothing and
  // reports applied = true, duplicate = true.
  QuotaResult take(std::int64_t n, std::string_view request_id = {});
  // Gives n (> 0) back unless the value would go above the ceiling.
  QuotaResult give(std::int64_t n, std::string_view request_id = {});
  // Sets the value (floor <= value <= ceiling).
  QuotaResult set(std::int64_t value);
  std::int64_t value();

  std::shared_ptr<Op<QuotaResult>> make_take(std::int64_t n, std::string_view request_id = {});
  std::shared_ptr<Op<QuotaResult>> make_give(std::int64_t n, std::string_view request_id = {});
  std::shared_ptr<Op<QuotaResult>> make_set(std::int64_t value);
  std::shared_ptr<Op<std::int64_t>> make_value();

  // The key of the current period (the one key, without a calendar).
  std::string storage_key() const;
  // The current period [start, end) in epoch ms ({0, 0} without a calendar).
  Period period() const;
  const QuotaOptions& options() const noexcept { return options_; }
  const std::shared_ptr<Store>& store() const noexcept { return store_; }

 private:
  std::shared_ptr<Op<QuotaResult>> make_change(const char* op, std::int64_t n, std::string_view request_id);
  Command wait_command() const;
  // The key and period in force at the store's now.
  struct Place {
    std::string key;
    Period period;
  };
  Place place() const;

  std::shared_ptr<Store> store_;
  QuotaOptions options_;
  std::string key_;
};

}  // namespace redcount
