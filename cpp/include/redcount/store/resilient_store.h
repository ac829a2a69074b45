// A store that decides within a budget when Redis fails: a circuit breaker in front of the
// Redis store and an optional fallback store behind it. Every counter and limiter runs on it
// unchanged (it is a Store), so they all share one breaker per connection.
//
//   ResilienceOptions r;
//   r.budget = std::chrono::milliseconds(50);
//   r.breaker = true;
//   auto store = open_resilient_store(parse_url("redis://cache:6379/0"), r, "memory://");
//   FixedWindowCounter views(store, ...);   // nothing else changes
//
// The contract:
// - Budget: the primary's command and pool timeouts are capped at `budget`, so each round
//   trip (waiting for a connection, the engine's own retries of LOADING/NOSCRIPT included)
//   ends within it. The connect timeout is not: a connection slower than the budget to set
//   up keeps going in the background while the calls waiting for it fail at their deadline. A connection-level failure (ConnectionError, TimeoutError) comes back as
//   Unavailable, with maybe_applied kept. Error replies (WRONGTYPE, a script error) and bad
//   input (InvalidArgument) pass through untouched and never count against Redis.
// - Breaker (when `breaker`): `failure_threshold` consecutive connection-level failures open
//   it. A timeout that reached the caller more than twice the budget after the call began
//   is not one of them: the process itself was not running (a CPU-starved machine, a
//   stopped process), which says nothing about Redis (with breakers per node, the router
//   counts its own). While open, calls never touch the primary: they go to the fallback or fail at once
//   with Unavailable (maybe_applied = false). After a jittered, exponentially growing pause
//   (probe_min .. probe_max) the next call sends one PING to the primary in the background
//   (half-open; that call itself still goes to the fallback or fails fast) and the breaker
//   closes when the PING is answered, reopens with a longer pause when it is not. With no
//   traffic, nothing is probed.
// - Fallback: while the breaker is open, calls go to the fallback store (an embedded memory
//   store: same scripts, its twins), and back to the primary once it closes. Counts made
//   on the fallback are not merged back into Redis. A call that failed on the primary before
//   anything of it was sent (a refused connection) is rerun on the fallback at once; one that
//   may have run on Redis is not (Unavailable, maybe_applied = true).
// - Breakers per node: when the primary is routed (a Redis Cluster, a client-side ring),
//   the breaker is not one for the whole store but one per node, kept by the router
//   (Store::use_node_breakers): a node's consecutive failures open its breaker only; calls
//   for its slots fail fast (or go to the fallback, those requests only) while the other
//   nodes keep serving. A batch that spans nodes completes on the healthy ones; the
//   requests of a refused node fail with Unavailable (with outcomes, as any ConnectionError
//   of a routed batch), or run on the fallback when nothing of them was sent.
// - Switches (open, half-open, closed) are recorded as events in one process-wide queue,
//   drained by whoever reports them (the Python bindings log each once through `logging`);
//   nothing here calls back into the caller's code from the I/O thread.
//
// Thread-safe.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "redcount/common/options.h"
#include "redcount/store/breaker.h"
#include "redcount/store/store.h"

namespace redcount {

class ResilientStore final : public Store {
 public:
  using State = BreakerState;

  // `fallback` may be null. Throws InvalidArgument for a threshold < 1, a budget < 0, or
  // a fallback without the breaker (it is used only while the breaker is open).
  ResilientStore(std::shared_ptr<Store> primary, std::shared_ptr<Store> fallback, ResilienceOptions options);
  ~ResilientStore() override;
  ResilientStore(const ResilientStore&) = delete;
  ResilientStore& operator=(const ResilientStore&) = delete;

  std::vector<Reply> execute(const std::vector<Request>& batch) override;
  void submit(std::vector<Request> batch, BatchDone done, CancelFlag cancelled = nullptr) override;
  std::uint32_t shard_of(std::string_view key) const noexcept override { return primary_->shard_of(key); }
  std::vector<std::shared_ptr<Store>> nodes() override { return primary_->nodes(); }
  std::int64_t now_ms() const override { return primary_->now_ms(); }
  bool accepts_typed_args() const noexcept override {
    return primary_->accepts_typed_args() && (!fallback_ || fallback_->accepts_typed_args());
  }
  bool server_clock_is_local() const noexcept override { return primary_->server_clock_is_local(); }
  // False while calls go to the fallback: its interpreter has no MULTI, so an increment must
  // take the script path there.
  bool has_expire_options() const noexcept override;
  bool contended() const noexcept override;
  std::string describe() const override { return primary_->describe(); }
  bool is_memory() const noexcept override { return false; }
  void close() override;

  // With breakers per node: Open while any node's is open, else HalfOpen while any is
  // half-open, else Closed.
  State state() const;
  // True while calls go to the fallback store (with breakers per node: some of them).
  bool using_fallback() const;
  // How many times the breaker opened or closed (with breakers per node: all of them).
  std::uint64_t switches() const;
  // True when the primary is a routed store (a cluster, a ring) keeping a breaker per node.
  bool per_node() const noexcept { return per_node_; }
  const ResilienceOptions& options() const noexcept { return options_; }
  const std::shared_ptr<Store>& primary() const noexcept { return primary_; }
  const std::shared_ptr<Store>& fallback() const noexcept { return fallback_; }

  std::vector<NodeBreakerState> node_breakers() const override { return primary_->node_breakers(); }

 private:
  enum class Route { Primary, Fallback, Refuse };
  Route route();
  // With breakers per node: what a primary failure becomes (the requests it did not send
  // rerun on the fallback when there is one).
  std::vector<Reply> per_node_failure(const std::vector<Request>& batch, const ConnectionError& e);

  std::shared_ptr<Store> primary_;
  std::shared_ptr<Store> fallback_;
  ResilienceOptions options_;
  std::shared_ptr<Breaker> breaker_;  // shared with in-flight callbacks and probes
  bool per_node_ = false;
};

// Opens the primary store from `primary` with its command and pool timeouts capped at the budget (and its
// reconnect backoff kept short, so the breaker decides the pace), and the fallback from
// `fallback_url` (empty = none; only memory:// is accepted: a second network store would
// fail the same way). Returns the plain store when there is nothing to add (memory://, or
// neither budget nor fallback).
std::shared_ptr<Store> open_resilient_store(StoreOptions primary, const ResilienceOptions& options,
                                            const std::string& fallback_url);

}  // namespace redcount
