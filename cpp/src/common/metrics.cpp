#include "redcount/common/metrics.h"

#include <atomic>

namespace redcount {
namespace {

// One cache line per count: threads incrementing different counts never share a line.
struct alignas(64) Slot {
  std::atomic<std::uint64_t> v{0};
  void add(std::uint64_t n) noexcept { v.fetch_add(n, std::memory_order_relaxed); }
  std::uint64_t get() const noexcept { return v.load(std::memory_order_relaxed); }
  void clear() noexcept { v.store(0, std::memory_order_relaxed); }
};

struct Slots {
  Slot writes_ok, writes_failed, reads, reads_failed, idempotent_writes, idempotent_hits;
};
Slots g_slots;

}  // namespace

MetricsCounts metrics_counts() noexcept {
  MetricsCounts c;
  c.writes_ok = g_slots.writes_ok.get();
  c.writes_failed = g_slots.writes_failed.get();
  c.reads = g_slots.reads.get();
  c.reads_failed = g_slots.reads_failed.get();
  c.idempotent_writes = g_slots.idempotent_writes.get();
  c.idempotent_hits = g_slots.idempotent_hits.get();
  return c;
}

void reset_metrics() noexcept {
  for (Slot* s : {&g_slots.writes_ok, &g_slots.writes_failed, &g_slots.reads, &g_slots.reads_failed,
                  &g_slots.idempotent_writes, &g_slots.idempotent_hits}) {
    s->clear();
  }
}

namespace detail {

void count_operation(Meter meter, std::uint32_t items, bool ok) noexcept {
  switch (meter) {
    case Meter::None:
      return;
    case Meter::Write:
      (ok ? g_slots.writes_ok : g_slots.writes_failed).add(items);
      return;
    case Meter::Read:
      (ok ? g_slots.reads : g_slots.reads_failed).add(items);
      return;
  }
}

void count_idempotent(std::uint64_t writes, std::uint64_t hits) noexcept {
  if (writes) g_slots.idempotent_writes.add(writes);
  if (hits) g_slots.idempotent_hits.add(hits);
}

}  // namespace detail
}  // namespace redcount
