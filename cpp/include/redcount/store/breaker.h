// A circuit breaker: consecutive connection-level failures of one server open it; while it
// is open, calls for that server fail fast (or go to a fallback) and, after a jittered
// pause, one PING probes the server in the background and closes the breaker when answered.
//
//   Breaker b(options, "redis://cache:6379/0", /*has_fallback=*/false);
//   switch (b.admit()) {
//     case Breaker::Admit::Go: ... send; then b.on_success() or b.on_failure(why) ...
//     case Breaker::Admit::Probe: ... send one PING in the background -> b.probe_done(ok, why); refuse
//     case Breaker::Admit::Refuse: throw Unavailable(b.refusal_text(), false);
//   }
//
// A ResilientStore (resilient_store.h) keeps one in front of a single server; a routed store
// (a Redis Cluster or a client-side ring) keeps one per node, so a dead node fails fast for
// its own slots while the others keep serving. Switches are recorded as events in one
// process-wide queue (take_breaker_events), never reported by calling back into callers.
//
// Thread-safe.
#pragma once

#include <atomic>
#include <exception>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "redcount/store/reply.h"

namespace redcount {

struct ResilienceOptions {
  std::chrono::milliseconds budget{0};  // 0 = no budget: the store's own timeouts apply
  bool breaker = true;
  int failure_threshold = 3;                  // consecutive connection failures that open it
  std::chrono::milliseconds probe_min{50};    // first pause before a probe
  // Longest pause between probes; below a second so that limits are enforced again within
  // a second of Redis coming back (plus the engine's reconnect backoff, capped below).
  std::chrono::milliseconds probe_max{500};
};

enum class BreakerState { Closed, Open, HalfOpen };

// One switch of a breaker, for the log.
struct BreakerEvent {
  enum class Level { Debug, Info, Warning };
  Level level = Level::Info;
  std::string message;
};

// Takes every recorded switch event (of every breaker in the process). With a positive
// `wait`, blocks up to that long for the first one. Thread-safe.
std::vector<BreakerEvent> take_breaker_events(std::chrono::milliseconds wait = std::chrono::milliseconds(0));

// One node's breaker, as a routed store reports it.
struct NodeBreakerState {
  std::string where;  // the node ("redis://10.0.0.2:6379/0", a ring member's name in front)
  BreakerState state = BreakerState::Closed;
  std::uint64_t switches = 0;
};

class Breaker {
 public:
  enum class Admit { Go, Refuse, Probe };

  // `where` names the server in messages ("redis://cache:6379/0"); `has_fallback` only
  // changes what the messages say happens to calls while it is open.
  Breaker(ResilienceOptions options, std::string where, bool has_fallback);

  // Go while closed. While open: Refuse, except for the first call past the pause, which
  // gets Probe (the breaker is half-open from then on: the caller sends one PING in the
  // background and reports it to probe_done(); that call itself is refused).
  Admit admit();
  void on_success();
  void on_failure(const std::string& why);
  void probe_done(bool ok, const std::string& why);
  // The same, from the probe PING's completion: ok on a PONG; an error reply (LOADING and
  // the like: up, but not serving yet) or a failed call keeps the breaker open.
  void probe_done(const std::vector<Reply>& replies, std::exception_ptr error);

  std::string refusal_text();
  std::string unavailable_text(const std::string& why) const;
  const std::string& where() const noexcept { return where_; }
  BreakerState state() const noexcept { return public_state_.load(std::memory_order_acquire); }
  std::uint64_t switches() const noexcept { return switches_.load(std::memory_order_relaxed); }

 private:
  using Steady = std::chrono::steady_clock;
  void set_state_locked(BreakerState s);

  ResilienceOptions options_;
  std::string where_;
  bool has_fallback_ = false;

  std::mutex mu_;
  BreakerState state_ = BreakerState::Closed;  // under mu_; mirrored in public_state_
  int failures_ = 0;                            // consecutive, while closed
  std::chrono::milliseconds pause_{0};
  Steady::time_point next_probe_{};
  std::string last_error_;
  std::atomic<BreakerState> public_state_{BreakerState::Closed};
  std::atomic<std::uint64_t> switches_{0};
};

}  // namespace redcount
