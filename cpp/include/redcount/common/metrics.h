// Process-wide operation counts for observability: what redcount.metrics()
// turns into rates and ratios.
//
//   auto op = counter.make_incr(key, 1);
//   op->meter = Meter::Write;                   // the factory marks its operation
//   run(*store, *op);                           // the drivers count it, ok or failed
//   MetricsCounts c = metrics_counts();         // c.writes_ok == 1
//
// The drivers (run_operation, run_async) count every operation marked Write or Read once
// when it completes; sharded writes add whether a request id was already applied. Each
// count is a relaxed atomic on its own cache line: a few nanoseconds per operation, and
// nothing at all on paths that do not reach a store (BufferedCounter::incr).
//
// Thread-safe.
#pragma once

#include <cstdint>

namespace redcount {

// What an operation counts as. `items` of one operation: incr_many of 5 counts 5.
enum class Meter : std::uint8_t { None, Write, Read };

struct MetricsCounts {
  std::uint64_t writes_ok = 0;      // counter increments acknowledged (or queued for retry)
  std::uint64_t writes_failed = 0;  // counter increments that raised to the caller
  std::uint64_t reads = 0;          // counter reads (cached reads included)
  std::uint64_t reads_failed = 0;
  std::uint64_t idempotent_writes = 0;  // sharded writes with a request id, answered
  std::uint64_t idempotent_hits = 0;    // ... of which the id was already applied
};

MetricsCounts metrics_counts() noexcept;
void reset_metrics() noexcept;

namespace detail {
void count_operation(Meter meter, std::uint32_t items, bool ok) noexcept;
void count_idempotent(std::uint64_t writes, std::uint64_t hits) noexcept;
}  // namespace detail

}  // namespace redcount
