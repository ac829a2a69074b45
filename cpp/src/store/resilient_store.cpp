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

bool has_transaction(const std::vector<Request>& batch) {
  for (const Request& r : batch) {
    const auto* cmd = std::get_if<Command>(&r);
    if (cmd && !cmd->args.empty() && ascii_lower(cmd->args[0]) == "multi") return true;
  }
  return false;
}

// With breakers per node (the primary is routed): what a failure of the primary becomes.
// A node's breaker refused (Unavailable) or a node failed: the requests of the batch that
// were never sent rerun on the fallback, when there is one and they can run there.
std::vector<Reply> node_failure(const Breaker& breaker, Store* fallback, const std::vector<Request>& batch,
                                const ConnectionError& e) {
  // Unavailable already (a node's breaker refused the whole batch) or a node's own error.
  const bool refused = dynamic_cast<const Unavailable*>(&e) != nullptr;
  auto unavailable = [&](std::string message, bool maybe, std::shared_ptr<const std::vector<RequestOutcome>> o) {
    Unavailable u(refused ? std::move(message) : breaker.unavailable_text(message), maybe);
    if (o) u.set_outcomes(std::move(o));
    return u;
  };
  const auto& outcomes = e.outcomes();
  if (!outcomes || outcomes->size() != batch.size()) {
    // Nothing of the batch completed: as on one server.
    if (fallback && !e.maybe_applied() && !has_transaction(batch)) return fallback->execute(batch);
    throw unavailable(e.what(), e.maybe_applied(), outcomes);
  }
  // Some nodes answered: rerun on the fallback what was never sent, when it can run there.
  std::vector<Request> rerun;
  std::vector<std::size_t> where;
  bool maybe = false;
  for (std::size_t i = 0; i < outcomes->size(); ++i) {
    const auto kind = (*outcomes)[i].kind;
    if (kind == RequestOutcome::Kind::Maybe) maybe = true;
    if (kind == RequestOutcome::Kind::NotSent) {
      rerun.push_back(batch[i]);
      where.push_back(i);
    }
  }
  if (!fallback || rerun.empty() || has_transaction(rerun)) throw unavailable(e.what(), e.maybe_applied(), outcomes);
  std::vector<Reply> again = fallback->execute(rerun);
  if (!maybe) {
    std::vector<Reply> replies(batch.size());
    for (std::size_t i = 0; i < outcomes->size(); ++i) replies[i] = (*outcomes)[i].reply;
    for (std::size_t j = 0; j < where.size(); ++j) replies[where[j]] = std::move(again[j]);
    return replies;
  }
  auto merged = std::make_shared<std::vector<RequestOutcome>>(*outcomes);
  for (std::size_t j = 0; j < where.size(); ++j) {
    (*merged)[where[j]].kind = RequestOutcome::Kind::Reply;
    (*merged)[where[j]].reply = std::move(again[j]);
  }
  throw unavailable(e.what(), true, std::move(merged));
}

using Steady = std::chrono::steady_clock;

// Whether a failure counts against Redis for the breaker. A timeout that reached the caller
// more than twice the budget after the call began (a budget for a connection, one for the
// reply, plus a little) was late because this process was not running (descheduled on a
// starved machine, or stopped), so it says nothing about Redis: it never opens the breaker.
// The engine already uses a reply that arrived meanwhile and counts the wait for a reply
// from its write; this covers what is left.
bool counts_against_redis(const ConnectionError& e, Steady::time_point started, std::chrono::milliseconds budget) {
  if (budget.count() <= 0 || dynamic_cast<const TimeoutError*>(&e) == nullptr) return true;
  return Steady::now() - started <= 2 * budget + std::chrono::milliseconds(10);
}

}  // namespace

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
  breaker_ = std::make_shared<Breaker>(options_, primary_->describe(), fallback_ != nullptr);
  per_node_ = options_.breaker && primary_->use_node_breakers(options_, fallback_ != nullptr);
}

ResilientStore::~ResilientStore() = default;

ResilientStore::Route ResilientStore::route() {
  if (per_node_) return Route::Primary;  // the router refuses (or not) node by node
  switch (breaker_->admit()) {
    case Breaker::Admit::Go:
      return Route::Primary;
    case Breaker::Admit::Probe: {
      // In the background: this call does not wait for the probe (it may take the budget).
      std::vector<Request> ping;
      ping.emplace_back(Command{{"PING"}});
      primary_->submit(std::move(ping), [b = breaker_](std::vector<Reply>&& replies, std::exception_ptr error) {
        b->probe_done(replies, std::move(error));
      });
      break;
    }
    case Breaker::Admit::Refuse:
      break;
  }
  return fallback_ ? Route::Fallback : Route::Refuse;
}


bool ResilientStore::has_expire_options() const noexcept {
  if (fallback_ && state() != State::Closed) return false;
  return primary_->has_expire_options();
}

bool ResilientStore::contended() const noexcept { return primary_->contended(); }

std::vector<Reply> ResilientStore::execute(const std::vector<Request>& batch) {
  const Route r = route();
  if (r == Route::Refuse) throw Unavailable(breaker_->refusal_text(), false);
  auto on_fallback = [&] {
    if (has_transaction(batch)) {
      throw Unavailable(breaker_->where() + " is unavailable, and this transaction (MULTI) was prepared for Redis; "
                        "the fallback store cannot run it. Nothing was sent; retry",
                        false);
    }
    return fallback_->execute(batch);
  };
  if (r == Route::Fallback) return on_fallback();
  const auto started = Steady::now();
  try {
    std::vector<Reply> replies = primary_->execute(batch);
    breaker_->on_success();
    return replies;
  } catch (const StoreClosed&) {
    throw;
  } catch (const ConnectionError& e) {
    if (per_node_) return node_failure(*breaker_, fallback_.get(), batch, e);
    if (counts_against_redis(e, started, options_.budget)) breaker_->on_failure(e.what());
    // Nothing of it reached Redis, so it may run on the fallback instead.
    if (fallback_ && !e.maybe_applied()) return on_fallback();
    throw Unavailable(breaker_->unavailable_text(e.what()), e.maybe_applied());
  }
}

void ResilientStore::submit(std::vector<Request> batch, BatchDone done, CancelFlag cancelled) {
  const Route r = route();
  if (r == Route::Refuse) return done({}, std::make_exception_ptr(Unavailable(breaker_->refusal_text(), false)));
  if (r == Route::Fallback) {
    if (has_transaction(batch)) {
      return done({}, std::make_exception_ptr(Unavailable(
                          breaker_->where() + " is unavailable, and this transaction (MULTI) was prepared for Redis; "
                                           "the fallback store cannot run it. Nothing was sent; retry",
                          false)));
    }
    return fallback_->submit(std::move(batch), std::move(done), std::move(cancelled));
  }
  // Kept for a rerun on the fallback when the primary refuses the batch unsent.
  std::shared_ptr<std::vector<Request>> copy;
  if (per_node_) {
    auto kept = std::make_shared<std::vector<Request>>(batch);
    return primary_->submit(
        std::move(batch),
        [b = breaker_, fb = fallback_, kept, done = std::move(done)](std::vector<Reply>&& replies,
                                                                     std::exception_ptr error) mutable {
          if (!error) return done(std::move(replies), nullptr);
          std::vector<Reply> out;
          try {
            try {
              std::rethrow_exception(error);
            } catch (const StoreClosed&) {
              throw;
            } catch (const ConnectionError& e) {
              // The fallback is a memory store: it runs on this (I/O) thread without blocking.
              out = node_failure(*b, fb.get(), *kept, e);
            }
          } catch (...) {
            return done({}, std::current_exception());
          }
          done(std::move(out), nullptr);
        },
        cancelled);
  }
  if (fallback_ && !has_transaction(batch)) copy = std::make_shared<std::vector<Request>>(batch);
  primary_->submit(
      std::move(batch),
      [sh = breaker_, fb = fallback_, copy = std::move(copy), done = std::move(done), cancelled,
       started = Steady::now(), budget = options_.budget](std::vector<Reply>&& replies,
                                                          std::exception_ptr error) mutable {
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
          if (counts_against_redis(e, started, budget)) sh->on_failure(e.what());
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

ResilientStore::State ResilientStore::state() const {
  if (!per_node_) return breaker_->state();
  State worst = State::Closed;
  for (const auto& n : primary_->node_breakers()) {
    if (n.state == State::Open) return State::Open;
    if (n.state == State::HalfOpen) worst = State::HalfOpen;
  }
  return worst;
}

bool ResilientStore::using_fallback() const { return fallback_ && state() != State::Closed; }

std::uint64_t ResilientStore::switches() const {
  if (!per_node_) return breaker_->switches();
  std::uint64_t total = 0;
  for (const auto& n : primary_->node_breakers()) total += n.switches;
  return total;
}

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
  auto limit = [&](StoreOptions& o) {
    if (options.budget.count() > 0) {
      auto cap = [&](std::chrono::milliseconds& t) {
        if (t.count() == 0 || t > options.budget) t = options.budget;
      };
      // Not connect_timeout: a call waiting for a connection still fails at its own deadline
      // (the command timeout), while a set-up slower than the budget (a loaded machine, the
      // handshake's SCRIPT LOADs) goes on in the background for the calls after it.
      cap(o.command_timeout);
      cap(o.pool_timeout);
    }
    if (options.breaker) {
      // The breaker sets the pace of reconnect attempts (its probes); a long reconnect backoff
      // in the engine under it would only delay its return to Redis.
      o.reconnect_backoff_max = std::min(o.reconnect_backoff_max, std::chrono::milliseconds(100));
      o.reconnect_backoff_min = std::min(o.reconnect_backoff_min, o.reconnect_backoff_max);
    }
  };
  limit(primary);
  for (auto& member : primary.ring) limit(member);  // a ring's servers, each with its own options
  return std::make_shared<ResilientStore>(open_store(primary), std::move(fallback), options);
}

}  // namespace redcount
