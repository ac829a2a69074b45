#include "redcount/store/resilient_store.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <utility>

#include "redcount/common/errors.h"
#include "redcount/common/util.h"

namespace redcount {
namespace {

using Steady = std::chrono::steady_clock;

// Events waiting to be reported. Never destroyed: a reporting thread may still wait on it
// while the process exits.
struct EventQueue {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<BreakerEvent> events;
};

EventQueue& event_queue() {
  static auto* q = new EventQueue;
  return *q;
}

// Bounded, so a process that never drains the queue (C++ only) does not grow it.
constexpr std::size_t kMaxEvents = 256;

void record(BreakerEvent::Level level, std::string message) {
  EventQueue& q = event_queue();
  {
    std::lock_guard<std::mutex> lock(q.mu);
    if (q.events.size() >= kMaxEvents) q.events.pop_front();
    q.events.push_back(BreakerEvent{level, std::move(message)});
  }
  q.cv.notify_all();
}

std::string ms_text(std::chrono::milliseconds ms) { return std::to_string(ms.count()) + " ms"; }

bool has_transaction(const std::vector<Request>& batch) {
  for (const Request& r : batch) {
    const auto* cmd = std::get_if<Command>(&r);
    if (cmd && !cmd->args.empty() && ascii_lower(cmd->args[0]) == "multi") return true;
  }
  return false;
}

}  // namespace

std::vector<BreakerEvent> take_breaker_events(std::chrono::milliseconds wait) {
  EventQueue& q = event_queue();
  std::unique_lock<std::mutex> lock(q.mu);
  if (wait.count() > 0) q.cv.wait_for(lock, wait, [&] { return !q.events.empty(); });
  std::vector<BreakerEvent> out(std::make_move_iterator(q.events.begin()), std::make_move_iterator(q.events.end()));
  q.events.clear();
  return out;
}

struct ResilientStore::Shared {
  ResilienceOptions options;
  std::string where;
  bool has_fallback = false;

  std::mutex mu;
  State state = State::Closed;  // under mu; mirrored in `public_state` for lock-free reads
  int failures = 0;             // consecutive, while closed
  std::chrono::milliseconds pause{0};
  Steady::time_point next_probe{};
  std::string last_error;
  std::atomic<State> public_state{State::Closed};
  std::atomic<std::uint64_t> switches{0};

  void set_state_locked(State s) {
    state = s;
    public_state.store(s, std::memory_order_release);
  }

  void on_success() {
    if (public_state.load(std::memory_order_acquire) != State::Closed) return;
    std::lock_guard<std::mutex> lock(mu);
    // A late success of a call sent before the breaker opened proves nothing now: only the
    // probe closes it.
    if (state == State::Closed) failures = 0;
  }

  void on_failure(const std::string& why) {
    if (!options.breaker) return;
    std::lock_guard<std::mutex> lock(mu);
    last_error = why;
    if (state != State::Closed || ++failures < options.failure_threshold) return;
    set_state_locked(State::Open);
    pause = options.probe_min;
    next_probe = Steady::now() + jittered(pause);
    switches.fetch_add(1, std::memory_order_relaxed);
    record(BreakerEvent::Level::Warning,
           "redcount: " + where + " is unreachable (" + std::to_string(failures) +
               " consecutive connection failures; last: " + why + "); circuit breaker open: " +
               (has_fallback ? "calls go to the fallback memory:// store until it is back"
                             : "calls fail fast with Unavailable until it is back"));
  }

  void probe_done(bool ok, const std::string& why) {
    std::lock_guard<std::mutex> lock(mu);
    if (state != State::HalfOpen) return;
    if (ok) {
      set_state_locked(State::Closed);
      failures = 0;
      pause = std::chrono::milliseconds(0);
      switches.fetch_add(1, std::memory_order_relaxed);
      record(BreakerEvent::Level::Warning,
             "redcount: " + where + " is reachable again; circuit breaker closed: calls go to Redis again" +
                 (has_fallback ? " (counts made on the fallback memory:// store are not merged back)" : ""));
      return;
    }
    set_state_locked(State::Open);
    last_error = why;
    pause = std::min(pause * 2, options.probe_max);
    const auto wait = jittered(pause);
    next_probe = Steady::now() + wait;
    record(BreakerEvent::Level::Debug,
           "redcount: probe of " + where + " failed (" + why + "); next probe in " + ms_text(wait));
  }

  std::string refusal_text() {
    std::lock_guard<std::mutex> lock(mu);
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(next_probe - Steady::now());
    return where + " is unavailable: the circuit breaker is open (last error: " + last_error +
           "); failing fast, nothing was sent; next probe in " +
           ms_text(std::max(left, std::chrono::milliseconds(0)));
  }

  std::string unavailable_text(const std::string& why) const {
    return where + " is unavailable: " + why +
           (options.budget.count() > 0 ? " (budget " + ms_text(options.budget) + ")" : std::string());
  }
};

ResilientStore::ResilientStore(std::shared_ptr<Store> primary, std::shared_ptr<Store> fallback,
                               ResilienceOptions options)
    : primary_(std::move(primary)), fallback_(std::move(fallback)), options_(options) {
  if (!primary_) throw InvalidArgument("a resilient store needs a primary store");
  if (options_.budget.count() < 0) throw InvalidArgument("budget must be > 0 seconds");
  if (options_.failure_threshold < 1) {
    throw InvalidArgument("failure_threshold must be >= 1, got " + std::to_string(options_.failure_threshold));
  }
  if (options_.probe_min.count() < 1 || options_.probe_max < options_.probe_min) {
    throw InvalidArgument("probe pauses must satisfy 1 ms <= probe_min <= probe_max");
  }
  if (fallback_ && !options_.breaker) {
    throw InvalidArgument(
        "a fallback store needs the circuit breaker (breaker=True): calls go to the fallback only while it is open");
  }
  shared_ = std::make_shared<Shared>();
  shared_->options = options_;
  shared_->where = primary_->describe();
  shared_->has_fallback = fallback_ != nullptr;
}

ResilientStore::~ResilientStore() = default;

ResilientStore::Route ResilientStore::route() {
  Shared& s = *shared_;
  if (s.public_state.load(std::memory_order_acquire) == State::Closed) return Route::Primary;
  bool probe = false;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    if (s.state == State::Closed) return Route::Primary;
    if (s.state == State::Open && Steady::now() >= s.next_probe) {
      s.set_state_locked(State::HalfOpen);
      probe = true;
      record(BreakerEvent::Level::Debug, "redcount: circuit breaker of " + s.where + " half-open: probing with PING");
    }
  }
  if (probe) {
    // In the background: this call does not wait for the probe (it may take the budget).
    std::vector<Request> ping;
    ping.emplace_back(Command{{"PING"}});
    primary_->submit(std::move(ping), [sh = shared_](std::vector<Reply>&& replies, std::exception_ptr error) {
      std::string why;
      if (error) {
        try {
          std::rethrow_exception(error);
        } catch (const std::exception& e) {
          why = e.what();
        } catch (...) {
          why = "unknown error";
        }
      } else if (replies.empty() || replies.front().is_error()) {
        // LOADING and the like: up, but not serving yet.
        why = replies.empty() ? "no reply" : replies.front().str;
      }
      sh->probe_done(why.empty(), why);
    });
  }
  return fallback_ ? Route::Fallback : Route::Refuse;
}

bool ResilientStore::has_expire_options() const noexcept {
  if (fallback_ && shared_->public_state.load(std::memory_order_acquire) != State::Closed) return false;
  return primary_->has_expire_options();
}

bool ResilientStore::contended() const noexcept { return primary_->contended(); }

std::vector<Reply> ResilientStore::execute(const std::vector<Request>& batch) {
  const Route r = route();
  if (r == Route::Refuse) throw Unavailable(shared_->refusal_text(), false);
  auto on_fallback = [&] {
    if (has_transaction(batch)) {
      throw Unavailable(shared_->where + " is unavailable, and this transaction (MULTI) was prepared for Redis; "
                        "the fallback store cannot run it. Nothing was sent; retry",
                        false);
    }
    return fallback_->execute(batch);
  };
  if (r == Route::Fallback) return on_fallback();
  try {
    std::vector<Reply> replies = primary_->execute(batch);
    shared_->on_success();
    return replies;
  } catch (const StoreClosed&) {
    throw;
  } catch (const ConnectionError& e) {
    shared_->on_failure(e.what());
    // Nothing of it reached Redis, so it may run on the fallback instead.
    if (fallback_ && !e.maybe_applied()) return on_fallback();
    throw Unavailable(shared_->unavailable_text(e.what()), e.maybe_applied());
  }
}

void ResilientStore::submit(std::vector<Request> batch, BatchDone done, CancelFlag cancelled) {
  const Route r = route();
  if (r == Route::Refuse) return done({}, std::make_exception_ptr(Unavailable(shared_->refusal_text(), false)));
  if (r == Route::Fallback) {
    if (has_transaction(batch)) {
      return done({}, std::make_exception_ptr(Unavailable(
                          shared_->where + " is unavailable, and this transaction (MULTI) was prepared for Redis; "
                                           "the fallback store cannot run it. Nothing was sent; retry",
                          false)));
    }
    return fallback_->submit(std::move(batch), std::move(done), std::move(cancelled));
  }
  // Kept for a rerun on the fallback when the primary refuses the batch unsent.
  std::shared_ptr<std::vector<Request>> copy;
  if (fallback_ && !has_transaction(batch)) copy = std::make_shared<std::vector<Request>>(batch);
  primary_->submit(
      std::move(batch),
      [sh = shared_, fb = fallback_, copy = std::move(copy), done = std::move(done), cancelled](
          std::vector<Reply>&& replies, std::exception_ptr error) mutable {
        if (!error) {
          sh->on_success();
          return done(std::move(replies), nullptr);
        }
        std::exception_ptr out = error;
        bool rerun = false;
        try {
          std::rethrow_exception(error);
        } catch (const StoreClosed&) {
        } catch (const ConnectionError& e) {
          sh->on_failure(e.what());
          rerun = fb && copy && !e.maybe_applied() && !(cancelled && cancelled->load());
          if (!rerun) out = std::make_exception_ptr(Unavailable(sh->unavailable_text(e.what()), e.maybe_applied()));
        } catch (...) {
        }
        if (rerun) return fb->submit(std::move(*copy), std::move(done), std::move(cancelled));
        done({}, out);
      },
      cancelled);
}

void ResilientStore::close() {
  primary_->close();
  if (fallback_) fallback_->close();
}

ResilientStore::State ResilientStore::state() const { return shared_->public_state.load(std::memory_order_acquire); }

bool ResilientStore::using_fallback() const { return fallback_ && state() != State::Closed; }

std::uint64_t ResilientStore::switches() const { return shared_->switches.load(std::memory_order_relaxed); }

std::shared_ptr<Store> open_resilient_store(StoreOptions primary, const ResilienceOptions& options,
                                            const std::string& fallback_url) {
  if (options.budget.count() < 0) throw InvalidArgument("budget must be > 0 seconds");
  std::shared_ptr<Store> fallback;
  if (!fallback_url.empty()) {
    StoreOptions f = parse_url(fallback_url);
    if (f.kind != StoreOptions::Kind::Memory) {
      throw InvalidArgument(
          "fallback must be \"memory://\" (an embedded store); a second network store would fail with the first");
    }
    if (primary.kind == StoreOptions::Kind::Memory) {
      throw InvalidArgument("a fallback applies to a Redis URL; the memory:// store does not fail over");
    }
    if (!options.breaker) {
      throw InvalidArgument(
          "a fallback store needs the circuit breaker (breaker=True): calls go to the fallback only while it is open");
    }
    f.clock = primary.clock;
    f.sweep_interval = primary.sweep_interval;
    fallback = open_store(f);
  }
  // The memory store answers in microseconds and never loses its connection.
  if (primary.kind == StoreOptions::Kind::Memory || (options.budget.count() == 0 && !fallback)) {
    return open_store(primary);
  }
  if (options.budget.count() > 0) {
    auto cap = [&](std::chrono::milliseconds& t) {
      if (t.count() == 0 || t > options.budget) t = options.budget;
    };
    // Not connect_timeout: a call waiting for a connection still fails at its own deadline
    // (the command timeout), while a set-up slower than the budget (a loaded machine, the
    // handshake's SCRIPT LOADs) goes on in the background for the calls after it.
    cap(primary.command_timeout);
    cap(primary.pool_timeout);
  }
  if (options.breaker) {
    // The breaker sets the pace of reconnect attempts (its probes); a long reconnect backoff
    // in the engine under it would only delay its return to Redis.
    primary.reconnect_backoff_max = std::min(primary.reconnect_backoff_max, std::chrono::milliseconds(100));
    primary.reconnect_backoff_min = std::min(primary.reconnect_backoff_min, primary.reconnect_backoff_max);
  }
  return std::make_shared<ResilientStore>(open_store(primary), std::move(fallback), options);
}

}  // namespace redcount
