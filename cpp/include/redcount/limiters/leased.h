// Leased limits: a process takes a hot key's units from the store a batch at a time and
// admits locally until the batch is used up or its window ends.
//
//   LeaseTable leases(strategy);                  // one per limiter (per process)
//   if (auto d = leases.admit_local(limits, key, 1)) return *d;   // no I/O, no GIL release
//   Decision d = leases.hit(limits, key, 1, 100);                  // may take a lease (I/O)
//   ...
//   leases.give_back_all();                       // unused units back to the store
//
// Taking a lease is one script call (lease_take.lua) that charges g units against every
// limit atomically, g = min(N, remaining / 2) but at least what the asking hit needs, so a
// lease shrinks as the window fills and nobody holds more than half of what was left when
// they asked. Every unit admitted locally was charged in the store first: never over-admits
// across processes. What it costs is under-admission while other processes hold units they
// do not use (at most (P - 1) * N per window for P processes, and no more than what they
// were granted). Unused units go back to the store (lease_give_back.lua) when the lease's
// lease_ttl passes (at the process's next leased call of any key, or from the table's
// sweeper thread within a second when it makes none) or the limiter or store is closed; a
// lease whose windows have all ended has nothing to give back (they expire in the store).
//
// When the process ends: give_back_everything() (Python's atexit, Celery's
// worker_process_shutdown) returns every table's units, and a SIGTERM that nothing else
// handles does the same before it ends the process (arm_sigterm). A process that ends
// without either (SIGKILL, os._exit) loses what it holds, and no more: a lease holds at most
// one grant's leftover, at most N and at most half of what the window had left when it was
// taken (a hit that needs more than the lease holds gives those units back in the round
// trip that takes the next lease, and refills running beside another take only their cost).
//
// An exhausted key: a refill the store refuses marks the lease exhausted for that cost until
// the refusal's retry_after. Until then, hit() asks the store with the strategy's read-only
// test (one round trip, no write, no lock held, none waiting for another caller's), and
// takes a lease again once that admits; begin() (asynchronous callers) sends a refill for
// just the cost, without the flag others wait on.
//
// A lease covers one (limits, key) pair. Decisions made locally report remaining and
// reset_after as well as the process knows them: remaining is what the store had left when
// the lease was taken plus the units the process still holds (other processes' later
// charges are not seen), reset_after is until the lease's window ends.
//
// Fixed-window and approximate sliding-window limits lease (the latter's leases end with
// the current sub-bucket), and so do the exact sliding log (a lease's entries are stamped
// with its end, a tenth of the window after the take, so they count in every window that
// contains one of its admissions) and the token bucket and GCRA: their leases lose units as
// the bucket refills (a unit that refilled since the take can no longer be admitted from
// the lease, and is not given back), so the bucket's level plus every unit held never
// exceeds its capacity. The concurrency strategy throws InvalidArgument from check() and
// make_take_lease, with the reason it cannot be leased (lease_refusal).
// After fork() the child starts with an empty table: the parent's units stay the parent's.
//
// Thread-safe: one mutex per lease; while one thread takes a lease (with no lock held over
// the round trip), the others of that key wait for it (hit) or take their own (an
// asynchronous caller, which never waits).
#pragma once

#include <array>
#include <atomic>
#include <climits>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "redcount/limiters/limiter.h"

namespace redcount {

// What one lease_take call got: granted units (0 when the store refused) and what the
// process needs to decide locally and to give units back later.
struct LeaseGrant {
  std::int64_t granted = 0;
  std::int64_t at_ms = 0;               // the time the call was made for
  std::int64_t window_end_ms = 0;       // the earliest end of the limits' windows
  std::int64_t last_window_end_ms = 0;  // the latest: until then there is something to give back
  std::int64_t limit = 0;               // the binding limit's amount (fewest units left)
  std::int64_t store_remaining = 0;     // fewest units any limit had left after the charge
  std::vector<std::string> keys;        // the window keys charged
  std::vector<std::string> fields;      // per key, the hash field charged (else none: string keys)
  Decision refusal;                     // when granted == 0: the store's decision
  // The buckets (token bucket, GCRA): the store refills while the lease holds units, so the
  // lease's units expire as they refill: at `at_ms + e`, ceil(e * num / den) of the granted
  // units have refilled (the most over the limits' (num, den)) and can no longer be
  // admitted. Empty: the units last until window_end_ms.
  std::vector<std::pair<std::int64_t, std::int64_t>> refill;
  // Non-empty: units go back by limiter_adjust.lua's refund of this kind ("tb", "gcra"),
  // with these per-limit numbers and the script's time unit (1 = ms, 1000 = µs); else
  // by lease_give_back.lua.
  std::string adjust_kind;
  std::vector<std::array<std::int64_t, 4>> adjust_args;
  std::int64_t time_scale = 1;
  // The refund's charge time (ms), where the units were charged: the exact log's entries
  // are stamped the lease's end. None: no charge time (the buckets).
  std::optional<std::int64_t> mark_ms;
};

// Why `strategy` (a LimiterStrategy::name()) cannot be leased without admitting past its
// limit, or nullptr when it can (every rate strategy).
const char* lease_refusal(std::string_view strategy) noexcept;

namespace detail {
// The fixed-window strategy's lease operation (leased.cpp): the window keys of `key` under
// `limits` at the time the operation runs, one lease_take call for at least `least` and at
// most `most` units, after the give-back calls in `before` (same round trip).
std::shared_ptr<Op<LeaseGrant>> make_fixed_window_lease(TimeSource time, std::shared_ptr<const std::string> prefix,
                                                        std::shared_ptr<const Calendar> calendar,
                                                        const std::vector<RateLimit>& limits, std::string_view key,
                                                        std::int64_t least, std::int64_t most,
                                                        std::vector<Request> before);
}  // namespace detail

class LeaseTable {
 public:
  // `strategy` must outlive every call but give_back_all and held (which only use the
  // strategy's store, kept by the table).
  static std::shared_ptr<LeaseTable> create(LimiterStrategy& strategy);
  explicit LeaseTable(LimiterStrategy& strategy);
  // Stops the sweeper (waiting for a give-back it is sending, if any).
  ~LeaseTable();
  LeaseTable(const LeaseTable&) = delete;
  LeaseTable& operator=(const LeaseTable&) = delete;

  // How long a lease may hold units before they go back (default 10 s; > 0).
  void set_ttl_ms(std::int64_t ttl_ms);
  std::int64_t ttl_ms() const noexcept { return ttl_ms_.load(std::memory_order_relaxed); }

  // Throws InvalidArgument unless `units` (the lease size asked for) is 1..kMaxExact and the
  // strategy leases.
  void check(std::int64_t units) const;

  // Admits `cost` from the lease held for (limits, key) when it covers it now, else
  // nullopt (then call hit or make_refill). No I/O.
  std::optional<Decision> admit_local(const std::vector<RateLimit>& limits, std::string_view key, std::int64_t cost);
  // What admit_local would decide, without taking anything from the lease (a test): the
  // decision when the lease covers `cost` now, else nullopt (then ask the store). No I/O.
  std::optional<Decision> peek_local(const std::vector<RateLimit>& limits, std::string_view key,
                                     std::int64_t cost);

  // Decides `cost`: locally when the lease covers it, else after taking a lease of up to
  // `units` units (waiting for another thread's lease of the same key first). Blocking I/O.
  Decision hit(const std::vector<RateLimit>& limits, std::string_view key, std::int64_t cost, std::int64_t units);

  // hit in steps, for a caller that runs the I/O itself (asynchronously): begin() admits
  // locally when it can (`decided`, and then maybe `give_back`, an operation returning
  // units of leases past their time, to run without waiting for it), else returns the
  // refill to run, whose grant install() turns into the decision. With `wait`, begin()
  // first waits for another waiting caller's refill of the same lease (blocking).
  struct Refill {
    std::shared_ptr<Op<LeaseGrant>> op;
    std::shared_ptr<void> entry;  // the lease the grant goes to
    std::int64_t cost = 0;
    bool owns_flag = false;  // the refill others wait for (cleared by install or release_flag)
    // Counts the refill as running until its last copy goes (installed, failed or
    // cancelled): a refill that starts beside it takes only its cost.
    std::shared_ptr<void> running;
  };
  struct Step {
    std::optional<Decision> decided;
    std::shared_ptr<Operation> give_back;
    Refill refill;
  };
  Step begin(const std::vector<RateLimit>& limits, std::string_view key, std::int64_t cost, std::int64_t units,
             bool wait);
  Decision install(const Refill& refill, const LeaseGrant& grant);
  // After a refill failed: lets the callers that wait for it go on.
  void release_flag(const Refill& refill);

  // Gives every unused unit back to the store (one round trip); returns how many went back.
  // Store errors propagate (the units are then dropped: they expire with their windows).
  std::int64_t give_back_all();
  // Unused units held now, across every lease of this table.
  std::int64_t held() const;

  // Every table of limiters on `store`: their units go back before it closes.
  static std::int64_t give_back_all_of(const Store* store);
  // Every table of this process gives its units back. With `ending` (the process is ending)
  // a lease taken from then on covers only the hit that takes it, so nothing is held again.
  // Store errors are swallowed (those units are lost: they expire with their windows).
  // Returns the units that went back.
  static std::int64_t give_back_everything(bool ending);
  // Unused units held now across every table of this process (the leased-units metric).
  static std::int64_t held_everywhere();
  // Whether this process's SIGTERM gives leases back (arm_sigterm installed its handler and
  // nothing replaced it since). For tests.
  static bool sigterm_armed();

  struct Entry;

 private:
  std::shared_ptr<Entry> entry(const std::vector<RateLimit>& limits, std::string_view key, bool create);
  // Takes the units of leases past their time (and so due back) off them: the give-back
  // calls to send. Updates next_due_ms_.
  std::vector<Request> collect_due(std::int64_t now);
  std::int64_t now_ms() const { return strategy_.lease_now_ms(); }

  friend struct LeaseFork;
  void forget_after_fork();
  // On the first lease that holds units in this process: when SIGTERM's action is the
  // default (nothing handles it), installs a handler that wakes a thread which gives every
  // table's units back and then raises SIGTERM again with the default action.
  static void arm_sigterm();
  // The sweeper: a thread, started with the first lease that holds units, that gives back
  // the units of leases past their ttl when the process makes no call that would.
  void wake_sweeper();
  void sweep();
  std::unique_ptr<std::thread> sweeper_;
  std::mutex sweep_mu_;
  std::condition_variable sweep_cv_;
  bool stopping_ = false;

  LimiterStrategy& strategy_;
  std::shared_ptr<Store> store_;
  std::atomic<std::int64_t> ttl_ms_{10000};
  // The earliest time a lease may be due back (its ttl or its window's end): a local
  // admission after it takes the slow path, which collects them.
  std::atomic<std::int64_t> next_due_ms_{INT64_MAX};
  mutable std::mutex mu_;  // guards map_ (never held over I/O)
  std::unordered_map<std::string, std::shared_ptr<Entry>> map_;
  // The last lease looked up, and what it was looked up by (under mu_).
  struct LimitShape {
    std::int64_t amount;
    std::int64_t window_ms;
    std::string unit;
  };
  static bool same_limits(const std::vector<LimitShape>& shape, const std::vector<RateLimit>& limits);
  std::shared_ptr<Entry> last_;
  std::string last_key_;
  std::vector<LimitShape> last_limits_;
};

}  // namespace redcount
