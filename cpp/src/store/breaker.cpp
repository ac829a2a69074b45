#include "redcount/store/breaker.h"

#include <algorithm>
#include <condition_variable>
#include <deque>

#include "redcount/common/util.h"

namespace redcount {
namespace {

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

}  // namespace

std::vector<BreakerEvent> take_breaker_events(std::chrono::milliseconds wait) {
  EventQueue& q = event_queue();
  std::unique_lock<std::mutex> lock(q.mu);
  if (wait.count() > 0) q.cv.wait_for(lock, wait, [&] { return !q.events.empty(); });
  std::vector<BreakerEvent> out(std::make_move_iterator(q.events.begin()), std::make_move_iterator(q.events.end()));
  q.events.clear();
  return out;
}

Breaker::Breaker(ResilienceOptions options, std::string where, bool has_fallback)
    : options_(options), where_(std::move(where)), has_fallback_(has_fallback) {}

void Breaker::set_state_locked(BreakerState s) {
  state_ = s;
  public_state_.store(s, std::memory_order_release);
}

Breaker::Admit Breaker::admit() {
  if (public_state_.load(std::memory_order_acquire) == BreakerState::Closed) return Admit::Go;
  std::lock_guard<std::mutex> lock(mu_);
  if (state_ == BreakerState::Closed) return Admit::Go;
  if (state_ == BreakerState::Open && Steady::now() >= next_probe_) {
    set_state_locked(BreakerState::HalfOpen);
    record(BreakerEvent::Level::Debug, "redcount: circuit breaker of " + where_ + " half-open: probing with PING");
    return Admit::Probe;
  }
  return Admit::Refuse;
}

void Breaker::on_success() {
  if (public_state_.load(std::memory_order_acquire) != BreakerState::Closed) return;
  std::lock_guard<std::mutex> lock(mu_);
  // A late success of a call sent before the breaker opened proves nothing now: only the
  // probe closes it.
  if (state_ == BreakerState::Closed) failures_ = 0;
}

void Breaker::on_failure(const std::string& why) {
  if (!options_.breaker) return;
  std::lock_guard<std::mutex> lock(mu_);
  last_error_ = why;
  if (state_ != BreakerState::Closed || ++failures_ < options_.failure_threshold) return;
  set_state_locked(BreakerState::Open);
  pause_ = options_.probe_min;
  next_probe_ = Steady::now() + jittered(pause_);
  switches_.fetch_add(1, std::memory_order_relaxed);
  record(BreakerEvent::Level::Warning,
         "redcount: " + where_ + " is unreachable (" + std::to_string(failures_) +
             " consecutive connection failures; last: " + why + "); circuit breaker open: " +
             (has_fallback_ ? "calls go to the fallback memory:// store until it is back"
                            : "calls fail fast with Unavailable until it is back"));
}

void Breaker::probe_done(const std::vector<Reply>& replies, std::exception_ptr error) {
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
    why = replies.empty() ? "no reply" : replies.front().str;
  }
  probe_done(why.empty(), why);
}

void Breaker::probe_done(bool ok, const std::string& why) {
  std::lock_guard<std::mutex> lock(mu_);
  if (state_ != BreakerState::HalfOpen) return;
  if (ok) {
    set_state_locked(BreakerState::Closed);
    failures_ = 0;
    pause_ = std::chrono::milliseconds(0);
    switches_.fetch_add(1, std::memory_order_relaxed);
    record(BreakerEvent::Level::Warning,
           "redcount: " + where_ + " is reachable again; circuit breaker closed: calls go to Redis again" +
               (has_fallback_ ? " (counts made on the fallback memory:// store are not merged back)" : ""));
    return;
  }
  set_state_locked(BreakerState::Open);
  last_error_ = why;
  pause_ = std::min(pause_ * 2, options_.probe_max);
  const auto wait = jittered(pause_);
  next_probe_ = Steady::now() + wait;
  record(BreakerEvent::Level::Debug,
         "redcount: probe of " + where_ + " failed (" + why + "); next probe in " + ms_text(wait));
}

std::string Breaker::refusal_text() {
  std::lock_guard<std::mutex> lock(mu_);
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(next_probe_ - Steady::now());
  return where_ + " is unavailable: the circuit breaker is open (last error: " + last_error_ +
         "); failing fast, nothing was sent; next probe in " + ms_text(std::max(left, std::chrono::milliseconds(0)));
}

std::string Breaker::unavailable_text(const std::string& why) const {
  return where_ + " is unavailable: " + why +
         (options_.budget.count() > 0 ? " (budget " + ms_text(options_.budget) + ")" : std::string());
}

}  // namespace redcount
