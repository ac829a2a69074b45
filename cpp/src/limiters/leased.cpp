// Leased limits: the per-process lease table (leased.h) and the lease operations: the
// fixed-window strategy's (lease_take.lua) and the other rate strategies' (their own
// script, a test then a hit), each after any give-back calls due.
#include "redcount/limiters/leased.h"

#include <pthread.h>
#include <semaphore.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <limits>
#include <new>
#include <set>
#include <utility>

#include "limiters/limiter_internal.h"
#include "redcount/common/bounds.h"
#include "redcount/common/errors.h"
#include "redcount/common/fork_hooks.h"
#include "redcount/common/keys.h"
#include "redcount/common/threads.h"
#include "redcount/common/window.h"
#include "store/script_args.h"

namespace redcount {

namespace {
constexpr const char* kLeasingStrategies =
    "lease= works with the rate strategies ('fixed-window', 'sliding-window', 'sliding-window-approx', "
    "'token-bucket', 'gcra')";
}  // namespace

const char* lease_refusal(std::string_view strategy) noexcept {
  // A leased unit is charged when the lease is taken and admitted later, in the process.
  // That admits nothing past the limit only when the strategy's count of the charge is
  // still in force at every time the unit may be admitted; the reasons below say where
  // that fails.
  if (strategy == "fixed-window") return nullptr;  // the charge counts until the window ends: leases end with it
  // The bucket refills while a process holds the tokens it took: a held token expires as
  // soon as as many tokens refilled since the take (leased.h), so the level plus every held
  // token never exceeds the capacity.
  if (strategy == "token-bucket" || strategy == "gcra") return nullptr;
  // The exact log: a lease's entries are stamped with its end, so they count in every
  // window containing one of its admissions, and the log lives until its newest entry
  // leaves the window.
  if (strategy == "sliding-window") return nullptr;
  // Its estimate is made of per-sub-bucket counts: units charged to the current sub-bucket
  // and admitted before it ends are what the same hits one by one would have charged there.
  if (strategy == "sliding-window-approx") return nullptr;
  if (strategy == "concurrency") {
    return "it counts requests in flight, not a rate: a slot is held until released, so there is nothing a "
           "process could take ahead";
  }
  return "this strategy has no lease operation";
}

std::shared_ptr<Op<LeaseGrant>> LimiterStrategy::make_take_lease(const std::vector<RateLimit>&, std::string_view,
                                                                 std::int64_t, std::int64_t, std::vector<Request>) {
  const char* why = lease_refusal(name());
  throw InvalidArgument(std::string(kLeasingStrategies) + ", not '" + std::string(name()) + "': " +
                        (why ? why : "this strategy has no lease operation") + "; call it without lease=");
}

namespace detail {
namespace {

struct FixedWindowLeaseSpec {
  std::shared_ptr<const std::string> prefix;
  std::shared_ptr<const Calendar> calendar;
  std::vector<RateLimit> limits;
  std::string key;
  std::int64_t least = 1;
  std::int64_t most = 1;
  std::vector<Request> before;
  LeaseGrant grant{};
  std::vector<std::int64_t> ends{};

  WindowPos where(const RateLimit& l, std::int64_t now) const {
    if (calendar) {
      const Period p = calendar->period(calendar_unit(l.unit).value_or(CalendarUnit::Day), now, l.multiple);
      return WindowPos{p.start_ms, p.start_ms, p.end_ms, p.end_ms + kLimiterGraceMs, p.end_ms - p.start_ms};
    }
    return locate(WindowSpec{l.window_ms, kLimiterGraceMs, false}, key, now);
  }

  std::vector<Request> batch(std::int64_t at) {
    std::vector<Request> out = std::move(before);
    before.clear();
    grant = LeaseGrant{};
    grant.at_ms = at;
    ends.clear();
    ScriptCall call{&kLeaseTakeScript, {}, {std::to_string(least), std::to_string(most)}};
    grant.window_end_ms = std::numeric_limits<std::int64_t>::max();
    grant.last_window_end_ms = std::numeric_limits<std::int64_t>::min();
    for (const auto& l : limits) {
      const WindowPos pos = where(l, at);
      call.keys.push_back(fixed_window_limiter_key(*prefix, key, pos.span_ms, pos.index));
      call.args.push_back(std::to_string(l.amount));
      call.args.push_back(std::to_string(pos.expire_at_ms));
      ends.push_back(pos.end_ms);
      grant.window_end_ms = std::min(grant.window_end_ms, pos.end_ms);
      grant.last_window_end_ms = std::max(grant.last_window_end_ms, pos.end_ms);
    }
    grant.keys = call.keys;
    out.emplace_back(std::move(call));
    return out;
  }

  LeaseGrant finish(std::vector<Reply>&& replies) {
    // Replies to the give-back calls come first; a failed one is not retried (its units
    // expire with their window: under-admission only).
    if (replies.empty()) throw ProtocolError("lease_take: no reply");
    const Ints v = integers(replies.back(), limits.size() + 1, "lease_take");
    grant.granted = v[0];
    const std::int64_t at = grant.at_ms;
    std::size_t binding = 0;
    std::int64_t fewest = std::numeric_limits<std::int64_t>::max();
    for (std::size_t i = 0; i < limits.size(); ++i) {
      const std::int64_t rem = remaining_of(limits[i].amount, v[1 + i]);
      if (rem < fewest || (rem == fewest && ends[i] > ends[binding])) {
        fewest = rem;
        binding = i;
      }
    }
    grant.store_remaining = fewest;
    grant.limit = limits[binding].amount;
    if (grant.granted <= 0) {
      grant.granted = 0;
      Decision& d = grant.refusal;
      d.allowed = false;
      d.remaining = fewest;
      for (std::size_t i = 0; i < limits.size(); ++i) {
        if (!exceeds(v[1 + i], least, limits[i].amount)) continue;
        const std::int64_t wait = ends[i] - at;
        if (wait > d.retry_after_ms) {
          d.retry_after_ms = wait;
          binding = i;
        }
      }
      d.limit = limits[binding].amount;
      d.reset_after_ms = ends[binding] - at;
    }
    return std::move(grant);
  }
};

}  // namespace

std::shared_ptr<Op<LeaseGrant>> make_fixed_window_lease(TimeSource time, std::shared_ptr<const std::string> prefix,
                                                        std::shared_ptr<const Calendar> calendar,
                                                        const std::vector<RateLimit>& limits, std::string_view key,
                                                        std::int64_t least, std::int64_t most,
                                                        std::vector<Request> before) {
  FixedWindowLeaseSpec spec;
  spec.prefix = std::move(prefix);
  spec.calendar = std::move(calendar);
  spec.limits = limits;
  spec.key = std::string(key);
  spec.least = least;
  spec.most = std::max(most, least);
  spec.before = std::move(before);
  return make_clocked_batch<LeaseGrant>(std::move(time), std::move(spec));
}

namespace {

// The scripted strategies' lease (the approximate sliding window, the exact log, the
// buckets): a test of `least` by the strategy's own script
// (what the limits allow now), then a hit of g units at the same time (all or nothing: a
// race with other callers never over-admits; it is then asked once more for `least`).
class ScriptedLease final : public Op<LeaseGrant> {
 public:
  ScriptedLease(TimeSource time, std::shared_ptr<const ScriptedRules> rules, const std::vector<RateLimit>& limits,
                 std::string_view key, std::int64_t least, std::int64_t most, std::vector<Request> before)
      : time_(std::move(time)),
        spec_{std::move(rules), limits, std::string(key), least, false},
        least_(least),
        most_(std::max(most, least)),
        before_(std::move(before)) {}

  std::vector<Request> prepare() override {
    if (time_.offset_stale()) {
      step_ = Step::Sync;
      return time_.refresh_requests(sent_ms_);
    }
    return ask();
  }

  std::vector<Request> finish(std::vector<Reply> replies) override {
    // Replies to the give-back calls come first; a failed one is not retried (its units
    // stay charged to their sub-bucket until it leaves the window: under-admission only).
    if (step_ == Step::Sync) {
      time_.refresh_done(replies, sent_ms_);
      return ask();
    }
    if (replies.empty()) throw ProtocolError("lease: no reply");
    Decision d = spec_.finish(std::move(replies.back()));
    if (step_ == Step::Test) {
      if (!d.allowed) return refuse(d);
      return charge(std::max(least_, std::min(most_, d.remaining / 2)));
    }
    if (d.allowed) {
      grant(d);
      return {};
    }
    if (spec_.cost > least_) return charge(least_);  // others took units meanwhile
    return refuse(d);
  }

 private:
  enum class Step { Sync, Test, Hit };

  std::vector<Request> ask() {
    at_ = time_.now_ms();
    step_ = Step::Test;
    std::vector<Request> out = std::move(before_);
    before_.clear();
    out.emplace_back(spec_.call(at_ * spec_.rules->time_scale()));
    return out;
  }

  std::vector<Request> charge(std::int64_t g) {
    step_ = Step::Hit;
    spec_.cost = g;
    spec_.hit = true;
    std::vector<Request> out;
    ScriptCall c = spec_.call(at_ * spec_.rules->time_scale());
    if (spec_.rules->adjust_kind() == "sw") {
      // The exact log: entries stamped with the lease's end (sliding_log.lua's 'lease:').
      auto args = std::make_shared<LogArgs>(static_cast<const LogArgs&>(*c.typed));
      args->stamp_at = log_end();
      spec_.sent = args;
      c.typed = std::move(args);
    }
    out.emplace_back(std::move(c));
    return out;
  }

  // The exact log's lease admits until then: a tenth of the shortest window (at least 1 ms),
  // which its entries count for beyond the window (under-admission, not more).
  std::int64_t log_end() const {
    std::int64_t w = std::numeric_limits<std::int64_t>::max();
    for (const auto& l : spec_.limits) w = std::min(w, l.window_ms);
    return at_ + std::max<std::int64_t>(1, w / 10);
  }

  std::vector<Request> refuse(const Decision& d) {
    LeaseGrant g;
    g.at_ms = at_;
    g.refusal = d;
    complete(std::move(g));
    return {};
  }

  void grant(const Decision& d) {
    LeaseGrant g;
    g.granted = spec_.cost;
    g.at_ms = at_;
    g.limit = d.limit;
    g.store_remaining = d.remaining;
    g.window_end_ms = std::numeric_limits<std::int64_t>::max();
    g.last_window_end_ms = std::numeric_limits<std::int64_t>::min();
    const std::string_view kind = spec_.rules->adjust_kind();
    if (kind == "tb" || kind == "gcra") {
      // The buckets: the lease's units refill away (LeaseGrant::refill) and go back by a
      // refund charged at the take, which credits only what has not refilled since.
      g.adjust_kind = std::string(kind);
      g.time_scale = spec_.rules->time_scale();
      for (const auto& l : spec_.limits) {
        const auto a = spec_.rules->adjust_args(l);
        g.keys.push_back(spec_.rules->storage_key(l, spec_.key));
        g.adjust_args.push_back(a);
        // Token bucket: amount tokens per window_ms; GCRA: one per emission interval (µs).
        const std::pair<std::int64_t, std::int64_t> rate = kind == "tb" ? std::pair{a[0], a[1]} : std::pair{1000L, a[0]};
        g.refill.push_back(rate);
        // Every granted unit has refilled by then: nothing to admit or give back after it.
        const std::int64_t all = ceil_div(g.granted * rate.second, rate.first);
        g.window_end_ms = std::min(g.window_end_ms, at_ + all);
      }
      g.last_window_end_ms = g.window_end_ms;
      complete(std::move(g));
      return;
    }
    if (kind == "sw") {
      // The exact log: the units' entries are stamped the lease's end; they go back by a
      // refund of that charge time (those entries, while they are still in the log).
      const std::int64_t end = log_end();
      g.adjust_kind = "sw";
      g.mark_ms = end;
      g.window_end_ms = end;
      g.last_window_end_ms = end;
      for (const auto& l : spec_.limits) {
        g.keys.push_back(spec_.rules->storage_key(l, spec_.key));
        g.adjust_args.push_back(spec_.rules->adjust_args(l));
        g.last_window_end_ms = std::max(g.last_window_end_ms, end + l.window_ms);
      }
      complete(std::move(g));
      return;
    }
    for (const auto& l : spec_.limits) {
      // adjust_args: {amount, sub-bucket ms, sub-buckets per window, 0}.
      const auto a = spec_.rules->adjust_args(l);
      const std::int64_t b = a[1], k = a[2], cur = at_ / b;
      g.keys.push_back(spec_.rules->storage_key(l, spec_.key));
      g.fields.push_back(std::to_string(cur));
      g.window_end_ms = std::min(g.window_end_ms, (cur + 1) * b);          // admits until then
      g.last_window_end_ms = std::max(g.last_window_end_ms, (cur + k + 1) * b);  // in the window until then
    }
    complete(std::move(g));
  }

  TimeSource time_;
  ScriptedSpec<Decision> spec_;
  std::int64_t least_, most_;
  std::vector<Request> before_;
  Step step_ = Step::Test;
  std::int64_t at_ = 0;
  std::int64_t sent_ms_ = 0;
};

}  // namespace

std::shared_ptr<Op<LeaseGrant>> ScriptedLimiter::make_take_lease(const std::vector<RateLimit>& limits,
                                                                 std::string_view key, std::int64_t least,
                                                                 std::int64_t most, std::vector<Request> before) {
  if (lease_refusal(name()) != nullptr) {
    return LimiterStrategy::make_take_lease(limits, key, least, most, std::move(before));
  }
  check(limits, key, least);
  return std::make_shared<ScriptedLease>(time_, rules_, limits, key, least, most, std::move(before));
}

}  // namespace detail

__extension__ typedef unsigned __int128 U128;

struct LeaseTable::Entry {
  std::mutex mu;
  std::condition_variable cv;
  bool refilling = false;  // a thread that waits for leases is taking one for this entry
  std::int64_t units = 0;  // charged in the store, not admitted yet
  std::int64_t ends_ms = 0;  // admits until then: the window's end or the ttl, whichever first
  std::int64_t window_end_ms = 0;
  std::int64_t last_window_end_ms = 0;
  std::int64_t limit = 0;
  std::int64_t store_remaining = 0;
  std::vector<std::string> keys;
  std::vector<std::string> fields;  // per key, the hash field the lease charged (none: string keys)
  // The buckets' leases (LeaseGrant::refill): units granted at at_ms refill away.
  std::int64_t granted = 0;
  std::int64_t at_ms = 0;
  std::vector<std::pair<std::int64_t, std::int64_t>> refill;
  std::string adjust_kind;
  std::vector<std::array<std::int64_t, 4>> adjust_args;
  std::int64_t time_scale = 1;
  std::optional<std::int64_t> mark_ms;
  int running = 0;  // refills started and not finished (Refill::running)
  // The store refused `refused_cost` (or more) until then: the key is exhausted for it.
  // Written under `mu`; read without it too (LeaseTable::hit's first look).
  std::atomic<std::int64_t> refused_until_ms{0};
  std::atomic<std::int64_t> refused_cost{0};

  // Under `mu`: drops the units that can no longer be admitted at `now`. A bucket's lease
  // keeps at most what has not refilled since the take (granted minus the units refilled,
  // the most over the limits): the store's level plus every held unit then never exceeds
  // the capacity, so no unit is admitted that the bucket did not hold at that moment.
  void expire(std::int64_t now) {
    if (refill.empty() || units <= 0) return;
    const std::int64_t elapsed = std::max<std::int64_t>(0, now - at_ms);
    std::int64_t gone = 0;
    for (const auto& [num, den] : refill) {
      // ceil(elapsed * num / den) without overflow: elapsed < the lease's span (window_end).
      const auto r = static_cast<std::int64_t>((static_cast<U128>(elapsed) * num + den - 1) / den);
      gone = std::max(gone, r);
    }
    units = std::max<std::int64_t>(0, std::min(units, granted - gone));
  }

  bool exhausted(std::int64_t cost, std::int64_t now) const {
    return now < refused_until_ms.load(std::memory_order_relaxed) &&
           cost >= refused_cost.load(std::memory_order_relaxed);
  }
  // Under `mu`: the store refused `cost` at `at`, until `until`.
  void refused(std::int64_t cost, std::int64_t at, std::int64_t until) {
    if (until <= at || until < refused_until_ms.load(std::memory_order_relaxed)) return;
    refused_cost.store(exhausted(cost, at) ? std::min(refused_cost.load(std::memory_order_relaxed), cost) : cost,
                       std::memory_order_relaxed);
    refused_until_ms.store(until, std::memory_order_relaxed);
  }
};

// The child of a fork has neither the parent's units nor its SIGTERM thread: SIGTERM gets
// its default action back (the child arms its own with its first lease).
static void after_fork_in_child();

// Every live table: the fork handlers reset them in the child, and a store's close gives
// their units back.
struct LeaseFork {
  std::mutex mu;
  std::vector<std::weak_ptr<LeaseTable>> live;

  static LeaseFork& get() {
    static auto* r = new LeaseFork;  // never destroyed: fork handlers may run at exit
    return *r;
  }
  static void install() {
    // Once for all tables, never unregistered (common/fork_hooks.h).
    static const auto* hooks = new ForkHooks([] { get().mu.lock(); }, [] { get().mu.unlock(); },
                                             [] {
                                               for (auto& w : get().live) {
                                                 if (auto t = w.lock()) t->forget_after_fork();
                                               }
                                               get().mu.unlock();
                                               after_fork_in_child();
                                             });
    (void)hooks;
  }
};

namespace {

// Set once the process gives its leases back for good (give_back_everything): later refills
// take only their cost, so nothing is held again.
std::atomic<bool> g_ending{false};

// The SIGTERM hand-off (arm_sigterm): the handler posts `sem` when the process that armed it
// receives the signal; `thread` then gives the units back and raises SIGTERM again.
struct TermHandoff {
  std::atomic<pid_t> armed{0};    // the process whose handler and thread are in place
  std::atomic<pid_t> decided{0};  // the process that looked at SIGTERM's action already
  sem_t sem;
};
static_assert(std::atomic<pid_t>::is_always_lock_free, "read in a signal handler");

TermHandoff& term_handoff() {
  static auto* t = new TermHandoff;  // never destroyed: the handler may run at exit
  return *t;
}

void on_sigterm(int) {
  // Async-signal-safe calls only. The default action comes back first: a second SIGTERM
  // ends the process at once, whatever the give-back is waiting for.
  const int saved = errno;
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  sigaction(SIGTERM, &dfl, nullptr);
  TermHandoff& t = term_handoff();
  if (t.armed.load(std::memory_order_relaxed) == getpid()) {
    sem_post(&t.sem);
  } else {
    raise(SIGTERM);  // a forked child whose handler was not reset: pending until we return
  }
  errno = saved;
}

// How long a SIGTERM waits for the give-back before the process ends anyway.
constexpr std::chrono::milliseconds kTermGiveBackWait{3000};

void term_thread() {
  TermHandoff& t = term_handoff();
  while (sem_wait(&t.sem) != 0 && errno == EINTR) {
  }
  // Bounded: a store that does not answer must not keep the process from ending.
  struct Done {
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
  };
  auto done = std::make_shared<Done>();
  start_thread([done] {
    try {
      (void)LeaseTable::give_back_everything(true);
    } catch (...) {
      // Ending anyway: the units expire with their windows.
    }
    std::lock_guard<std::mutex> g(done->mu);
    done->done = true;
    done->cv.notify_all();
  }).detach();
  {
    std::unique_lock<std::mutex> lk(done->mu);
    done->cv.wait_for(lk, kTermGiveBackWait, [&] { return done->done; });
  }
  kill(getpid(), SIGTERM);  // the default action now (or what the application set meanwhile)
}

// The call giving back e.units (expired ones dropped first: Entry::expire) at `now`.
Request give_back_call(const LeaseTable::Entry& e, std::int64_t now) {
  if (!e.adjust_kind.empty()) {
    // A refund of the held units. The lease applied the refund rule already: of the units
    // it took, it holds only what has not refilled since the take (Entry::expire), so every
    // one of them is credited (no charge time: the units' full tokens, capped at the
    // capacity). Sound: the bucket's level plus every unit held never exceeds the capacity
    // before, so it does not after.
    ScriptCall c{&kLimiterAdjustScript, e.keys, {}};
    c.args = {std::to_string(now * e.time_scale), e.adjust_kind, "refund", std::to_string(e.units), "1000", "lease",
              e.mark_ms ? std::to_string(*e.mark_ms * e.time_scale) : std::string()};
    for (const auto& a : e.adjust_args) {
      for (const std::int64_t x : a) c.args.push_back(std::to_string(x));
    }
    return c;
  }
  ScriptCall c{&kLeaseGiveBackScript, e.keys, {std::to_string(e.units)}};
  c.args.insert(c.args.end(), e.fields.begin(), e.fields.end());
  return c;
}

// The identity of a lease: the key and the limits' amounts and windows.
std::string lease_id(const std::vector<RateLimit>& limits, std::string_view key) {
  std::string id(key);
  char buf[24];
  for (const auto& l : limits) {
    id.push_back('\0');
    auto r = std::to_chars(buf, buf + sizeof buf, l.amount);
    id.append(buf, r.ptr);
    id.push_back('/');
    r = std::to_chars(buf, buf + sizeof buf, l.window_ms);
    id.append(buf, r.ptr);
    id.append(l.unit);
  }
  return id;
}

void lower(std::atomic<std::int64_t>& v, std::int64_t to) {
  std::int64_t cur = v.load(std::memory_order_relaxed);
  while (to < cur && !v.compare_exchange_weak(cur, to, std::memory_order_relaxed)) {
  }
}

// A refill counted in its lease's `running` until install() (under the lease's mutex: the
// callers it wakes must not see it running any more, or each would take only its cost, and
// so would the one after it), or until its last copy goes when it never completes (failed,
// cancelled).
struct RunningRefill {
  explicit RunningRefill(std::shared_ptr<LeaseTable::Entry> entry) : e(std::move(entry)) {}
  RunningRefill(const RunningRefill&) = delete;
  RunningRefill& operator=(const RunningRefill&) = delete;
  ~RunningRefill() {
    std::lock_guard<std::mutex> g(e->mu);
    finish();
  }
  void finish() {  // under e->mu
    if (!done) --e->running;
    done = true;
  }
  std::shared_ptr<LeaseTable::Entry> e;
  bool done = false;  // guarded by e->mu
};

Decision local_decision(const LeaseTable::Entry& e, std::int64_t now) {
  Decision d;
  d.allowed = true;
  d.limit = e.limit;
  d.remaining = e.store_remaining + e.units;
  d.reset_after_ms = std::max<std::int64_t>(0, e.window_end_ms - now);
  return d;
}

}  // namespace

LeaseTable::LeaseTable(LimiterStrategy& strategy) : strategy_(strategy), store_(strategy.store()) {}

LeaseTable::~LeaseTable() {
  {
    std::lock_guard<std::mutex> g(sweep_mu_);
    stopping_ = true;
  }
  sweep_cv_.notify_all();
  if (sweeper_ && sweeper_->joinable()) sweeper_->join();
}

void LeaseTable::wake_sweeper() {
  {
    std::lock_guard<std::mutex> g(sweep_mu_);
    if (stopping_) return;
    if (!sweeper_) sweeper_ = std::make_unique<std::thread>(start_thread([this] { sweep(); }));
  }
  sweep_cv_.notify_all();
}

void LeaseTable::sweep() {
  std::unique_lock<std::mutex> lk(sweep_mu_);
  while (!stopping_) {
    const std::int64_t due = next_due_ms_.load(std::memory_order_relaxed);
    const std::int64_t now = store_->now_ms();
    if (due == std::numeric_limits<std::int64_t>::max()) {
      sweep_cv_.wait(lk);  // no lease holds units: until one does (wake_sweeper)
      continue;
    }
    if (now < due) {
      // Never more than a second: the store's clock may be one a test moves by hand.
      const std::int64_t wait = std::min<std::int64_t>(due - now, 1000);
      sweep_cv_.wait_for(lk, std::chrono::milliseconds(wait));
      continue;
    }
    lk.unlock();
    std::vector<Request> batch = collect_due(now);
    if (!batch.empty()) {
      try {
        CommandsOp op(std::move(batch));
        run_operation(*store_, op);
      } catch (...) {
        // Not given back (a closed or unreachable store): they expire with their windows.
      }
    }
    lk.lock();
  }
}

std::shared_ptr<LeaseTable> LeaseTable::create(LimiterStrategy& strategy) {
  auto t = std::make_shared<LeaseTable>(strategy);
  LeaseFork::install();
  LeaseFork& r = LeaseFork::get();
  std::lock_guard<std::mutex> g(r.mu);
  std::erase_if(r.live, [](const std::weak_ptr<LeaseTable>& w) { return w.expired(); });
  r.live.push_back(t);
  return t;
}

void LeaseTable::forget_after_fork() {
  // The child has only the forking thread: another thread of the parent may have held
  // these. The parent's units stay the parent's (it gives them back); start empty, leaking
  // the old map and its mutexes rather than destroying what may be locked.
  new (&mu_) std::mutex();
  new (&map_) std::unordered_map<std::string, std::shared_ptr<Entry>>();
  new (&last_) std::shared_ptr<Entry>();
  new (&last_key_) std::string();
  new (&last_limits_) std::vector<LimitShape>();
  // The sweeper thread is the parent's: abandon its handle (joining or destroying a joinable
  // std::thread would hang or terminate) and start afresh, without one.
  (void)sweeper_.release();
  new (&sweep_mu_) std::mutex();
  new (&sweep_cv_) std::condition_variable();
  stopping_ = false;
  next_due_ms_.store(std::numeric_limits<std::int64_t>::max(), std::memory_order_relaxed);
}

void LeaseTable::set_ttl_ms(std::int64_t ttl_ms) {
  if (ttl_ms <= 0 || ttl_ms > kMaxExact) {
    throw InvalidArgument("lease_ttl must be > 0 seconds, got " + std::to_string(static_cast<double>(ttl_ms) / 1000.0));
  }
  ttl_ms_.store(ttl_ms, std::memory_order_relaxed);
}

void LeaseTable::check(std::int64_t units) const {
  if (const char* why = lease_refusal(strategy_.name())) {
    throw InvalidArgument(std::string(kLeasingStrategies) + ", not '" + std::string(strategy_.name()) + "': " + why +
                          "; call it without lease=");
  }
  if (units < 1 || units > kMaxExact) {
    throw InvalidArgument("lease must be a number of units >= 1, got " + std::to_string(units));
  }
}

std::shared_ptr<LeaseTable::Entry> LeaseTable::entry(const std::vector<RateLimit>& limits, std::string_view key,
                                                     bool create) {
  {
    // The hot key asked again (the common case): no id to build, nothing to hash.
    std::lock_guard<std::mutex> g(mu_);
    if (last_ && last_key_ == key && same_limits(last_limits_, limits)) return last_;
  }
  std::string id = lease_id(limits, key);
  std::lock_guard<std::mutex> g(mu_);
  auto it = map_.find(id);
  std::shared_ptr<Entry> e;
  if (it != map_.end()) {
    e = it->second;
  } else {
    if (!create) return nullptr;
    e = std::make_shared<Entry>();
    map_.emplace(std::move(id), e);
  }
  last_ = e;
  last_key_.assign(key);
  last_limits_.clear();
  for (const auto& l : limits) last_limits_.push_back({l.amount, l.window_ms, l.unit});
  return e;
}

bool LeaseTable::same_limits(const std::vector<LimitShape>& shape, const std::vector<RateLimit>& limits) {
  if (shape.size() != limits.size()) return false;
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (shape[i].amount != limits[i].amount || shape[i].window_ms != limits[i].window_ms ||
        shape[i].unit != limits[i].unit) {
      return false;
    }
  }
  return true;
}

std::optional<Decision> LeaseTable::admit_local(const std::vector<RateLimit>& limits, std::string_view key,
                                                std::int64_t cost) {
  const std::int64_t now = now_ms();
  if (now >= next_due_ms_.load(std::memory_order_relaxed)) return std::nullopt;  // some are due back
  auto e = entry(limits, key, false);
  if (!e) return std::nullopt;
  std::lock_guard<std::mutex> g(e->mu);
  e->expire(now);
  if (e->units < cost || now >= e->ends_ms) return std::nullopt;
  e->units -= cost;
  return local_decision(*e, now);
}

std::optional<Decision> LeaseTable::peek_local(const std::vector<RateLimit>& limits, std::string_view key,
                                               std::int64_t cost) {
  const std::int64_t now = now_ms();
  auto e = entry(limits, key, false);
  if (!e) return std::nullopt;
  std::lock_guard<std::mutex> g(e->mu);
  e->expire(now);
  if (e->units < cost || now >= e->ends_ms) return std::nullopt;
  return local_decision(*e, now);  // remaining: what is left now, as a test by the store reports it
}

std::vector<Request> LeaseTable::collect_due(std::int64_t now) {
  std::vector<Request> out;
  std::int64_t next = std::numeric_limits<std::int64_t>::max();
  std::lock_guard<std::mutex> g(mu_);
  for (auto it = map_.begin(); it != map_.end();) {
    Entry& e = *it->second;
    std::unique_lock<std::mutex> lk(e.mu);
    e.expire(now);
    if (e.units > 0 && now >= e.ends_ms) {
      if (now < e.last_window_end_ms) out.push_back(give_back_call(e, now));
      e.units = 0;
    }
    if (e.units > 0) next = std::min(next, e.ends_ms);
    // Forget leases whose windows have all ended (nobody waits on them).
    const bool stale = e.units == 0 && !e.refilling && now >= e.last_window_end_ms;
    lk.unlock();
    if (stale && it->second == last_) last_.reset();
    it = stale && it->second.use_count() == 1 ? map_.erase(it) : std::next(it);
  }
  next_due_ms_.store(next, std::memory_order_relaxed);
  return out;
}

LeaseTable::Step LeaseTable::begin(const std::vector<RateLimit>& limits, std::string_view key, std::int64_t cost,
                                   std::int64_t units, bool wait) {
  std::int64_t now = now_ms();
  std::vector<Request> due;
  if (now >= next_due_ms_.load(std::memory_order_relaxed)) due = collect_due(now);
  auto e = entry(limits, key, true);
  std::unique_lock<std::mutex> lk(e->mu);
  bool exhausted = false;
  for (;;) {
    e->expire(now);
    if (e->units >= cost && now < e->ends_ms) {
      e->units -= cost;
      Step s;
      s.decided = local_decision(*e, now);
      if (!due.empty()) s.give_back = std::make_shared<CommandsOp>(std::move(due));
      return s;
    }
    // The store refused this cost and will until the refusal's retry_after: ask it again
    // at once, as an unleased hit does, rather than after every caller queued before.
    exhausted = e->exhausted(cost, now);
    if (exhausted || !wait || !e->refilling) break;
    e->cv.wait(lk);
    now = now_ms();
  }
  if (e->units > 0 && (now >= e->ends_ms || e->units < cost)) {
    // Due back, not collected yet; or fewer than the cost: they go back in the round trip
    // that takes the new lease, which covers the whole cost, so that what the process
    // holds is never more than one lease's leftover.
    if (now < e->last_window_end_ms) due.push_back(give_back_call(*e, now));
    e->units = 0;
  }
  // One lease at a time: a refill running beside another (an asynchronous caller's, or one
  // of an exhausted key), or once the process is ending, takes just its cost.
  const bool full = e->running == 0 && !exhausted && !g_ending.load(std::memory_order_relaxed);
  Step s;
  s.refill.entry = e;
  s.refill.cost = cost;
  s.refill.owns_flag = wait && !exhausted;
  if (s.refill.owns_flag) e->refilling = true;
  ++e->running;
  s.refill.running = std::make_shared<RunningRefill>(e);
  lk.unlock();
  try {
    s.refill.op = strategy_.make_take_lease(limits, key, cost, full ? std::max(units, cost) : cost, std::move(due));
  } catch (...) {
    release_flag(s.refill);
    throw;
  }
  return s;
}

void LeaseTable::release_flag(const Refill& refill) {
  if (!refill.owns_flag) return;
  auto* e = static_cast<Entry*>(refill.entry.get());
  std::lock_guard<std::mutex> g(e->mu);
  e->refilling = false;
  e->cv.notify_all();
}

Decision LeaseTable::install(const Refill& refill, const LeaseGrant& grant) {
  auto* e = static_cast<Entry*>(refill.entry.get());
  std::unique_lock<std::mutex> g(e->mu);
  if (refill.running) static_cast<RunningRefill*>(refill.running.get())->finish();
  if (refill.owns_flag) {
    e->refilling = false;
    e->cv.notify_all();
  }
  if (grant.granted < refill.cost) {
    // Refused by the store; units another caller's lease brought in meanwhile still count.
    e->expire(grant.at_ms);
    if (e->units >= refill.cost && grant.at_ms < e->ends_ms) {
      e->units -= refill.cost;
      return local_decision(*e, grant.at_ms);
    }
    // Exhausted for this cost (and any larger one) until the window can admit it again.
    e->refused(refill.cost, grant.at_ms, grant.at_ms + grant.refusal.retry_after_ms);
    return grant.refusal;
  }
  e->refused_until_ms.store(0, std::memory_order_relaxed);  // it admits again (a reset, units given back, a new window)
  // An ended window's units: nothing to keep. A bucket's lease expires from its own take:
  // another refill's leftover (a caller beside this one) is dropped, charged (under-admission).
  if (grant.window_end_ms != e->window_end_ms || !grant.refill.empty()) e->units = 0;
  e->units += grant.granted - refill.cost;
  e->granted = grant.granted;
  e->at_ms = grant.at_ms;
  e->refill = grant.refill;
  e->adjust_kind = grant.adjust_kind;
  e->adjust_args = grant.adjust_args;
  e->time_scale = grant.time_scale;
  e->mark_ms = grant.mark_ms;
  e->window_end_ms = grant.window_end_ms;
  e->last_window_end_ms = grant.last_window_end_ms;
  e->ends_ms = std::min(grant.window_end_ms, grant.at_ms + ttl_ms());
  e->limit = grant.limit;
  e->store_remaining = grant.store_remaining;
  e->keys = grant.keys;
  e->fields = grant.fields;
  const bool holds = e->units > 0;
  if (holds) lower(next_due_ms_, e->ends_ms);
  Decision d = local_decision(*e, grant.at_ms);
  g.unlock();
  if (holds) {
    wake_sweeper();
    arm_sigterm();
  }
  return d;
}

Decision LeaseTable::hit(const std::vector<RateLimit>& limits, std::string_view key, std::int64_t cost,
                         std::int64_t units) {
  if (auto e = entry(limits, key, false)) {
    const std::int64_t now = now_ms();
    if (e->exhausted(cost, now)) {
      // An exhausted key: the strategy's read-only test of the cost, one round trip that
      // writes nothing (for the fixed window, a GET per limit), no more for the store than
      // an unleased refusal, and no lock held over it. When it admits, units came back (a
      // reset, a give-back): a lease is taken as usual.
      Decision d = strategy_.test(limits, key, cost);
      std::lock_guard<std::mutex> g(e->mu);
      if (!d.allowed) {
        e->refused(cost, now, now + d.retry_after_ms);
        return d;
      }
      e->refused_until_ms.store(0, std::memory_order_relaxed);
    }
  }
  Step s = begin(limits, key, cost, units, true);
  Store& store = *store_;
  if (s.decided) {
    if (s.give_back) {
      try {
        run_operation(store, *s.give_back);
      } catch (const Error&) {
        // Not given back: the units expire with their windows (under-admission only). This
        // call was decided already; the give-back's failure is not its own.
      }
    }
    return *s.decided;
  }
  LeaseGrant grant;
  try {
    grant = run(store, *s.refill.op);
  } catch (...) {
    release_flag(s.refill);
    throw;
  }
  return install(s.refill, grant);
}

std::int64_t LeaseTable::give_back_all() {
  const std::int64_t now = store_->now_ms();
  std::vector<Request> batch;
  std::int64_t total = 0;
  {
    std::lock_guard<std::mutex> g(mu_);
    for (auto& [id, e] : map_) {
      std::lock_guard<std::mutex> lk(e->mu);
      e->expire(now);
      if (e->units > 0 && now < e->last_window_end_ms) {
        batch.push_back(give_back_call(*e, now));
        total += e->units;
      }
      e->units = 0;
    }
    next_due_ms_.store(std::numeric_limits<std::int64_t>::max(), std::memory_order_relaxed);
  }
  if (batch.empty()) return 0;
  CommandsOp op(std::move(batch));
  run_operation(*store_, op);
  return total;
}

std::int64_t LeaseTable::held() const {
  std::int64_t total = 0;
  const std::int64_t now = store_->now_ms();
  std::lock_guard<std::mutex> g(mu_);
  for (const auto& [id, e] : map_) {
    std::lock_guard<std::mutex> lk(e->mu);
    e->expire(now);
    total += e->units;
  }
  return total;
}

std::int64_t LeaseTable::give_back_everything(bool ending) {
  if (ending) g_ending.store(true, std::memory_order_relaxed);
  std::vector<std::shared_ptr<LeaseTable>> tables;
  {
    std::lock_guard<std::mutex> g(LeaseFork::get().mu);
    for (auto& w : LeaseFork::get().live) {
      if (auto t = w.lock()) tables.push_back(std::move(t));
    }
  }
  std::int64_t total = 0;
  for (auto& t : tables) {
    try {
      total += t->give_back_all();
    } catch (const Error&) {
      // A closed or unreachable store: those units expire with their windows.
    }
  }
  return total;
}

std::int64_t LeaseTable::held_everywhere() {
  std::vector<std::shared_ptr<LeaseTable>> tables;
  {
    std::lock_guard<std::mutex> g(LeaseFork::get().mu);
    for (auto& w : LeaseFork::get().live) {
      if (auto t = w.lock()) tables.push_back(std::move(t));
    }
  }
  std::int64_t total = 0;
  for (auto& t : tables) total += t->held();
  return total;
}

void LeaseTable::arm_sigterm() {
  TermHandoff& t = term_handoff();
  const pid_t me = getpid();
  if (t.decided.load(std::memory_order_acquire) == me) return;
  std::lock_guard<std::mutex> g(LeaseFork::get().mu);  // one arming at a time; reset at fork
  if (t.decided.load(std::memory_order_relaxed) == me) return;
  t.decided.store(me, std::memory_order_release);
  struct sigaction cur {};
  if (sigaction(SIGTERM, nullptr, &cur) != 0) return;
  // Someone handles SIGTERM (an application, a server such as gunicorn or uvicorn, Python
  // code, or it is ignored): theirs is how the process ends; ours stays out.
  if ((cur.sa_flags & SA_SIGINFO) != 0 || cur.sa_handler != SIG_DFL) return;
  if (sem_init(&t.sem, 0, 0) != 0) return;
  // The thread takes no signal (start_thread): they go to the application's threads, as before.
  try {
    start_thread(term_thread).detach();
  } catch (...) {
    return;  // no thread: SIGTERM keeps its default action
  }
  t.armed.store(me, std::memory_order_relaxed);
  struct sigaction act {};
  act.sa_handler = on_sigterm;
  sigemptyset(&act.sa_mask);
  act.sa_flags = SA_RESTART;
  sigaction(SIGTERM, &act, nullptr);
}

bool LeaseTable::sigterm_armed() {
  if (term_handoff().armed.load(std::memory_order_relaxed) != getpid()) return false;
  struct sigaction cur {};
  return sigaction(SIGTERM, nullptr, &cur) == 0 && (cur.sa_flags & SA_SIGINFO) == 0 && cur.sa_handler == on_sigterm;
}

static void after_fork_in_child() {
  g_ending.store(false, std::memory_order_relaxed);
  TermHandoff& t = term_handoff();
  if (t.armed.load(std::memory_order_relaxed) != 0) {
    struct sigaction cur {};
    if (sigaction(SIGTERM, nullptr, &cur) == 0 && (cur.sa_flags & SA_SIGINFO) == 0 && cur.sa_handler == on_sigterm) {
      struct sigaction dfl {};
      dfl.sa_handler = SIG_DFL;
      sigemptyset(&dfl.sa_mask);
      sigaction(SIGTERM, &dfl, nullptr);
    }
  }
  t.armed.store(0, std::memory_order_relaxed);
  t.decided.store(0, std::memory_order_relaxed);
}

std::int64_t LeaseTable::give_back_all_of(const Store* store) {
  // The tables are taken out of the registry first: no lock is held over the I/O.
  std::vector<std::shared_ptr<LeaseTable>> tables;
  {
    std::lock_guard<std::mutex> g(LeaseFork::get().mu);
    for (auto& w : LeaseFork::get().live) {
      auto t = w.lock();
      if (t && t->store_.get() == store) tables.push_back(std::move(t));
    }
  }
  std::int64_t total = 0;
  for (auto& t : tables) {
    try {
      total += t->give_back_all();
    } catch (const Error&) {
      // Closing anyway: the units expire with their windows.
    }
  }
  return total;
}

}  // namespace redcount
