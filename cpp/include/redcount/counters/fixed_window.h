// TTL-compensated fixed-window counters.
//
//   FixedWindowOptions o;
//   o.name = "pageviews";
//   o.window_ms = 3'600'000;  // hourly, turning over on the hour
//   FixedWindowCounter c(store, o);
//   std::int64_t n = c.incr("user:42", 1);
//
// Every write sets the key's deadline to the window's end plus `grace`, atomically with
// the increment (mode Script), or with the documented command sequence (mode Commands)
// for servers that forbid scripting. A key that lost its TTL is repaired by the next
// increment. With OnError::Queue, transient failures park the increment in a bounded
// retry queue that a background thread drains with exponential backoff and jitter.
//
// Every method is also an operation (see operation.h): make_incr(...) returns an
// Op<std::int64_t> that any driver can run, e.g. run_async for asyncio. The operations
// share the counter's retry queue and stay valid after the counter is destroyed (an
// increment that would need the queue then raises, as after close()).
//
// Thread-safe.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "redcount/store/operation.h"
#include "redcount/store/store.h"
#include "redcount/store/scripts.h"
#include "redcount/store/retry_queue.h"
#include "redcount/common/window.h"

namespace redcount {


struct FixedWindowOptions {
  enum class Mode { Script, Commands };
  enum class OnError { Raise, Queue };

  std::string prefix = "redcount";
  std::string name;
  std::int64_t window_ms = 0;
  std::int64_t grace_ms = 1000;
  bool stagger = false;
  Mode mode = Mode::Script;
  OnError on_error = OnError::Raise;
  std::int64_t queue_capacity = 100'000;                  // increments; must be >= 1
  std::chrono::milliseconds retry_backoff_min{50};        // first retry delay
  std::chrono::milliseconds retry_backoff_max{5000};      // cap of the exponential backoff
  std::size_t max_script_batch = 128;                     // items per script call in incr_many
  // Calendar periods (days, weeks, months, years in a time zone) instead of clock-aligned
  // windows of window_ms; window_ms stays the unit's nominal length. See calendar.h.
  std::shared_ptr<const Calendar> calendar{};
  CalendarUnit calendar_unit = CalendarUnit::Day;
};

// One increment as it travels: already resolved to its window, so a late retry lands
// in the window it was meant for or is dropped, never counted in a later window.
struct WindowedIncrement {
  std::string user_key;
  std::string storage_key;
  std::string request_id_key;  // empty = none
  std::int64_t amount = 0;
  std::int64_t expire_at_ms = 0;
};

class FixedWindowCounter {
 public:
  FixedWindowCounter(std::shared_ptr<Store> store, FixedWindowOptions options);
  ~FixedWindowCounter();
  FixedWindowCounter(const FixedWindowCounter&) = delete;
  FixedWindowCounter& operator=(const FixedWindowCounter&) = delete;

  // The count in the current window after the increment; 0 when the increment went to
  // the retry queue (its count is not known yet). Throws RetryQueueFull when queueing
  // was needed but the queue is full.
  std::int64_t incr(std::string_view key, std::int64_t amount, std::string_view request_id = {});
  // One round trip for the whole batch; results in input order.
  std::vector<std::int64_t> incr_many(const std::vector<std::pair<std::string, std::int64_t>>& items);
  std::int64_t get(std::string_view key);
  std::vector<std::int64_t> get_many(const std::vector<std::string>& keys);
  // Milliseconds until the current window's key expires; -2 absent, -1 no TTL.
  std::int64_t pttl(std::string_view key);

  // The same as operations; the window is chosen when the factory is called.
  std::shared_ptr<Op<std::int64_t>> make_incr(std::string_view key, std::int64_t amount,
                                              std::string_view request_id = {});
  std::shared_ptr<Op<std::vector<std::int64_t>>> make_incr_many(
      const std::vector<std::pair<std::string, std::int64_t>>& items);
  std::shared_ptr<Op<std::int64_t>> make_get(std::string_view key);
  std::shared_ptr<Op<std::vector<std::int64_t>>> make_get_many(const std::vector<std::string>& keys);
  std::shared_ptr<Op<std::int64_t>> make_pttl(std::string_view key);

  std::string storage_key(std::string_view key) const;
  WindowPos window(std::string_view key) const;

  // Retries everything queued now and waits until the queue is empty or `timeout`
  // passes (nullopt = no limit). Returns how many increments are still pending.
  std::size_t flush(std::optional<std::chrono::milliseconds> timeout);
  std::size_t pending() const;
  RetryStats stats() const;
  // Flushes within `timeout`, then stops the retry thread, never waiting past `timeout`
  // (nullopt = no limit): an attempt stuck on a stalled server is left to end on its own,
  // and every increment given up is counted in stats().failed at once. Returns how many
  // were given up. Later incr calls raise. See RetryQueue.
  std::size_t close(std::optional<std::chrono::milliseconds> timeout);

  const FixedWindowOptions& options() const noexcept;
  const std::shared_ptr<Store>& store() const noexcept;

  struct Core;  // the state operations share with the counter (fixed_window.cpp)

 private:
  std::shared_ptr<Core> core_;
};

// Sums per-item script/command replies into counts, or throws for a failed item.
std::int64_t count_from_reply(const Reply& r);

}  // namespace redcount
