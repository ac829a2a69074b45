#include "redcount/redis/topology/master_follower.h"

#include <algorithm>

#include "redcount/common/errors.h"
#include "redcount/redis/io/engine.h"

namespace redcount::redis {
namespace {

SentinelOptions resolver_options(const StoreOptions& o) {
  if (!o.sentinel) throw InvalidArgument("a Sentinel store needs a redis+sentinel:// URL");
  SentinelOptions s = sentinel_options(o, o.tls ? make_tls_context(o) : nullptr);
  // A sentinel that does not answer quickly is skipped for the next one; never wait longer
  // for one than the store would for a data node.
  auto cap = [](std::chrono::milliseconds own, std::chrono::milliseconds store) {
    return store.count() > 0 ? std::min(own, store) : own;
  };
  s.link.connect_timeout = cap(s.link.connect_timeout, o.connect_timeout);
  s.link.command_timeout = cap(s.link.command_timeout, o.command_timeout);
  s.node_link.connect_timeout = s.link.connect_timeout;
  s.node_link.command_timeout = s.link.command_timeout;
  return s;
}

// A reply that says the server answering is no longer (or not yet) a writable master.
bool stale_master_reply(const Reply& r) {
  if (!r.is_error()) return false;
  const std::string_view s = r.str;
  return s.starts_with("READONLY") || s.starts_with("NOREPLICAS") || s.starts_with("MASTERDOWN");
}

std::int64_t steady_ns(TimePoint t) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
}

}  // namespace

MasterFollower::MasterFollower(StoreOptions options)
    : options_(std::move(options)), resolver_(std::make_shared<SentinelResolver>(resolver_options(options_))) {
  Engine validate(options_);  // the same checks as a plain store (connections, timeouts); starts nothing
  watcher_ = std::make_unique<SwitchMasterWatcher>(
      resolver_, [this](const Address& a) { move_to(a); }, std::chrono::milliseconds(1000),
      [this](bool on) { hold(on); });
}

MasterFollower::~MasterFollower() { close(); }

void MasterFollower::throw_closed() const {
  throw StoreClosed("the store for Sentinel service '" + options_.sentinel_service +
                    "' is closed; open a new one with redcount.connect()");
}

MasterFollower::GenPtr MasterFollower::make_generation(const Address& at, std::uint64_t number) {
  StoreOptions o = options_;
  o.host = at.host;
  o.port = at.port;
  auto g = std::make_shared<Generation>();
  g->at = at;
  g->number = number;
  g->engine = std::make_shared<Engine>(o);
  return g;
}

std::exception_ptr MasterFollower::held_error() const {
  return std::make_exception_ptr(ConnectionError(
      "Sentinel was failing service '" + options_.sentinel_service +
      "' over to a new master, and the call waited for it until its deadline (command_timeout); nothing of it was "
      "sent: retry it, or raise command_timeout above the promotion time"));
}

MasterFollower::GenPtr MasterFollower::acquire(TimePoint deadline) {
  {
    std::unique_lock<std::mutex> lock(mu_);
    if (closed_) throw_closed();
    if (current_) {
      if (holding_) {
        auto released = [&] { return closed_ || !holding_; };
        if (deadline == kNever) {
          switched_cv_.wait(lock, released);
        } else if (!switched_cv_.wait_until(lock, deadline, released)) {
          std::rethrow_exception(held_error());
        }
        if (closed_) throw_closed();
      }
      current_->calls.fetch_add(1);
      return current_;
    }
  }
  // The first call asks the sentinels; concurrent first calls wait for that one answer.
  std::lock_guard<std::mutex> first(resolve_mu_);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) throw_closed();
    if (current_) {
      current_->calls.fetch_add(1);
      return current_;
    }
  }
  const Address at = resolver_->resolve();  // throws ConnectionError / AuthenticationError
  GenPtr g = make_generation(at, 0);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) {
      g->engine->close();
      throw_closed();
    }
    if (!current_) current_ = g;  // the watcher may have reported one meanwhile (it is not started yet)
    current_->calls.fetch_add(1);
    g = current_;
  }
  watcher_->start(at);  // a second start() is a no-op
  return g;
}

void MasterFollower::release(const GenPtr& g) {
  if (g->calls.fetch_sub(1) == 1 && g->retired.load()) g->engine->close();
}

void MasterFollower::hold(bool on) {
  std::vector<Parked> held;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_ || !current_ || holding_ == on) return;
    holding_ = on;
    if (on) return;
    // Ended without a switch (aborted, or the hold's limit): the held calls go to the master
    // followed, as they would have.
    for (auto it = parked_.begin(); it != parked_.end();) {
      if (it->held) {
        held.push_back(std::move(*it));
        it = parked_.erase(it);
      } else {
        ++it;
      }
    }
  }
  switched_cv_.notify_all();
  for (auto& p : held) {
    GenPtr g;
    if (!(p.call->cancelled && p.call->cancelled->load(std::memory_order_relaxed))) {
      std::lock_guard<std::mutex> lock(mu_);
      if (!closed_ && current_) {
        current_->calls.fetch_add(1);
        g = current_;
      }
    }
    if (g) {
      send(g, p.call);
    } else {
      p.call->done({}, p.error);
    }
  }
}

void MasterFollower::move_to(const Address& at) {
  std::uint64_t number = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_ || (current_ && current_->at == at)) return;
    number = current_ ? current_->number + 1 : 0;
  }
  GenPtr g = make_generation(at, number);
  GenPtr old;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) return;
    old = std::move(current_);
    current_ = g;
    holding_ = false;  // a switch ends a failover hold; the held calls go to the new master below
    if (old) {
      old->retired.store(true);
      retired_.push_back(old);
    }
  }
  if (old) {
    // Requests the old master refuses (READONLY, NOREPLICAS) come back now rather than at
    // their deadline, and execute() sends them to the new master.
    old->engine->stop_retries();
    switches_.fetch_add(1);
  }
  switched_cv_.notify_all();
  // Asynchronous calls that waited for this: sent now, each once.
  std::vector<Parked> waiting;
  {
    std::lock_guard<std::mutex> lock(mu_);
    waiting.swap(parked_);
  }
  for (auto& p : waiting) {
    GenPtr next = (p.call->cancelled && p.call->cancelled->load(std::memory_order_relaxed)) ? nullptr
                                                                                             : newer_than(p.seen);
    if (next) {
      send(next, p.call);
    } else {
      p.call->done({}, p.error);
    }
  }
  // Nothing inside the old engine: close it now (otherwise the last call out does).
  if (old && old->calls.load() == 0) old->engine->close();
}

MasterFollower::GenPtr MasterFollower::newer_than(std::uint64_t seen) {
  std::lock_guard<std::mutex> lock(mu_);
  if (closed_ || !current_ || current_->number <= seen) return nullptr;
  current_->calls.fetch_add(1);
  return current_;
}

MasterFollower::GenPtr MasterFollower::wait_newer(std::uint64_t seen, TimePoint deadline) {
  std::unique_lock<std::mutex> lock(mu_);
  auto newer = [&] { return closed_ || (current_ && current_->number > seen); };
  if (deadline == kNever) {
    switched_cv_.wait(lock, newer);
  } else if (!switched_cv_.wait_until(lock, deadline, newer)) {
    return nullptr;
  }
  if (closed_) return nullptr;
  current_->calls.fetch_add(1);
  return current_;
}

TimePoint MasterFollower::call_deadline() const {
  return options_.command_timeout.count() > 0 ? SteadyClock::now() + options_.command_timeout : kNever;
}

void MasterFollower::observe(const GenPtr& g, const std::vector<Reply>& replies) {
  if (g->retired.load()) return;  // a master left already: nothing to learn of the current one
  for (const auto& r : replies) {
    if (stale_master_reply(r)) {
      watcher_->request_resolve();
      return;
    }
  }
}

void MasterFollower::observe_error(const GenPtr& g, std::exception_ptr error) {
  if (g->retired.load()) return;
  try {
    std::rethrow_exception(error);
  } catch (const StoreClosed&) {
  } catch (const ConnectionError&) {
    watcher_->request_resolve();
  } catch (const ReplyError& e) {
    const std::string_view s = e.what();
    if (s.starts_with("READONLY") || s.starts_with("NOREPLICAS")) watcher_->request_resolve();
  } catch (...) {
  }
}

void MasterFollower::maybe_recheck_role(const GenPtr& g) {
  const TimePoint now = SteadyClock::now();
  std::int64_t due = next_role_check_ns_.load(std::memory_order_relaxed);
  if (steady_ns(now) < due) return;
  const std::int64_t next = steady_ns(now + recheck_interval_.interval());
  if (!next_role_check_ns_.compare_exchange_strong(due, next)) return;  // another caller sends it
  g->calls.fetch_add(1);
  std::vector<Request> batch;
  batch.emplace_back(role_command());
  g->engine->submit(
      std::move(batch),
      [this, g](std::vector<Reply>&& replies, std::exception_ptr error) {
        // An answer other than master (an ACL refusing ROLE is Unknown: nothing to learn).
        if (!error && replies.size() == 1) {
          const Role role = parse_role(replies[0]);
          if (role == Role::Replica || role == Role::Sentinel) watcher_->request_resolve();
        }
        release(g);
      },
      nullptr);
}

std::vector<Reply> MasterFollower::execute(const std::vector<Request>& batch) {
  const TimePoint deadline = call_deadline();
  GenPtr g = acquire(deadline);
  for (;;) {
    maybe_recheck_role(g);
    try {
      std::vector<Reply> replies = g->engine->execute(batch);
      release(g);
      observe(g, replies);
      // Every request was refused as "not a writable master" (the engine retried until the
      // deadline): nothing ran, so a master found meanwhile gets the batch once.
      if (!replies.empty() && std::all_of(replies.begin(), replies.end(), stale_master_reply)) {
        if (GenPtr next = newer_than(g->number)) {
          g = std::move(next);
          continue;
        }
      }
      return replies;
    } catch (const StoreClosed&) {
      release(g);
      throw;
    } catch (const ConnectionError& e) {
      release(g);
      if (!g->retired.load()) watcher_->request_resolve();
      if (e.maybe_applied()) throw;
      // Nothing of the batch ran: send it to the next master once the sentinels name one.
      GenPtr next = wait_newer(g->number, deadline);
      if (!next) throw;
      g = std::move(next);
    } catch (...) {
      release(g);
      throw;
    }
  }
}

void MasterFollower::submit(std::vector<Request> batch, BatchDone done, CancelFlag cancelled) {
  auto call = std::make_shared<AsyncCall>(AsyncCall{std::move(batch), std::move(done), std::move(cancelled), call_deadline()});
  GenPtr g;
  {
    // During a failover hold the call is parked, not sent: the caller's thread (an event
    // loop) never waits here.
    std::lock_guard<std::mutex> lock(mu_);
    if (!closed_ && current_) {
      if (holding_) return park_locked(Parked{call, current_->number, held_error(), true});
      current_->calls.fetch_add(1);
      g = current_;
    }
  }
  if (!g) {
    try {
      g = acquire(call->deadline);  // the first call: asks the sentinels (no hold before that)
    } catch (...) {
      return call->done({}, std::current_exception());
    }
  }
  maybe_recheck_role(g);
  send(g, call);
}

void MasterFollower::send(const GenPtr& g, const CallPtr& call) {
  std::vector<Request> batch = call->batch;  // the call keeps its own for a later resend
  g->engine->submit(
      std::move(batch),
      [this, g, call](std::vector<Reply>&& replies, std::exception_ptr error) {
        release(g);
        if (error) {
          observe_error(g, error);
        } else {
          observe(g, replies);
        }
        if (follow(g, call, replies, error)) return;
        call->done(std::move(replies), error);
      },
      call->cancelled);
}

bool MasterFollower::follow(const GenPtr& g, const CallPtr& call, const std::vector<Reply>& replies,
                            std::exception_ptr error) {
  if (call->cancelled && call->cancelled->load(std::memory_order_relaxed)) return false;
  if (error) {
    // Only a call of which nothing ran: the same rule as execute().
    try {
      std::rethrow_exception(error);
    } catch (const StoreClosed&) {
      return false;
    } catch (const ConnectionError& e) {
      if (e.maybe_applied()) return false;
    } catch (...) {
      return false;
    }
    if (GenPtr next = newer_than(g->number)) {
      send(next, call);
      return true;
    }
    if (SteadyClock::now() >= call->deadline) return false;
    park(Parked{call, g->number, error});
    return true;
  }
  // Every request refused as "not a writable master": nothing ran; a master known by now
  // gets it once (a call is not parked for this: the engine already used its deadline).
  if (!replies.empty() && std::all_of(replies.begin(), replies.end(), stale_master_reply)) {
    if (GenPtr next = newer_than(g->number)) {
      send(next, call);
      return true;
    }
  }
  return false;
}

void MasterFollower::park(Parked p) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    const bool newer = current_ && current_->number > p.seen;
    if (!closed_ && !newer) return park_locked(std::move(p));
  }
  // The master changed (or the store closed) since the call's answer: no wait.
  if (GenPtr next = newer_than(p.seen)) return send(next, p.call);
  p.call->done({}, p.error);
}

void MasterFollower::park_locked(Parked p) {
  const TimePoint deadline = p.call->deadline;
  std::weak_ptr<AsyncCall> call = p.call;
  parked_.push_back(std::move(p));
  // A call without a deadline waits for a master or close().
  if (deadline != kNever) timer_.schedule(deadline, [this, call] { expire(call); });
}

void MasterFollower::expire(const std::weak_ptr<AsyncCall>& call) {
  std::vector<Parked> due;
  {
    std::lock_guard<std::mutex> lock(mu_);
    const CallPtr c = call.lock();
    for (auto it = parked_.begin(); it != parked_.end();) {
      // Already sent elsewhere (and parked again later, maybe): only a call still parked at
      // its deadline, or every call once the store closed.
      if (closed_ || it->call == c) {
        due.push_back(std::move(*it));
        it = parked_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (auto& p : due) p.call->done({}, p.error);  // no master came in time: nothing ran
}

void MasterFollower::close() {
  std::vector<GenPtr> all;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) return;
    closed_ = true;
    all = retired_;
    if (current_) all.push_back(current_);
  }
  switched_cv_.notify_all();
  // The parked calls get their errors now: the expiries still due run at once, then any
  // call without a deadline.
  timer_.close();
  expire({});
  if (watcher_) watcher_->stop();
  for (auto& g : all) g->engine->close();
}

int MasterFollower::open_connections() const {
  std::lock_guard<std::mutex> lock(mu_);
  int n = current_ ? current_->engine->open_connections() : 0;
  for (const auto& g : retired_) n += g->engine->open_connections();
  return n;
}

bool MasterFollower::contended() const noexcept {
  std::lock_guard<std::mutex> lock(mu_);
  return current_ && current_->engine->sync_contended();
}

int MasterFollower::server_major() const noexcept {
  std::lock_guard<std::mutex> lock(mu_);
  return current_ ? current_->engine->server_major() : 0;
}

std::uint64_t MasterFollower::holds() const noexcept { return watcher_ ? watcher_->holds() : 0; }

std::uint64_t MasterFollower::early_switches() const noexcept { return watcher_ ? watcher_->early_switches() : 0; }

std::uint64_t MasterFollower::aborted_holds() const noexcept { return watcher_ ? watcher_->aborted_holds() : 0; }

void MasterFollower::submit_routed(std::vector<Request> batch, BatchDone done, CancelFlag cancelled, TimePoint,
                                   std::shared_ptr<std::vector<std::uint8_t>>) {
  submit(std::move(batch), std::move(done), std::move(cancelled));
}

std::vector<Reply> MasterFollower::execute_routed(const std::vector<Request>& batch, TimePoint) { return execute(batch); }

FollowerStats MasterFollower::follower_stats() const {
  const auto at = master();
  return FollowerStats{at ? at->text() : std::string(), switches(), holds(), early_switches(), aborted_holds()};
}

std::string MasterFollower::describe() const { return sentinel_url(options_); }

std::string MasterFollower::address() const {
  if (const auto at = master()) return at->text();
  std::string hosts;
  for (const auto& s : options_.sentinels) {
    if (!hosts.empty()) hosts += ',';
    hosts += s.text();
  }
  return hosts;
}

std::optional<Address> MasterFollower::master() const {
  std::lock_guard<std::mutex> lock(mu_);
  if (!current_) return std::nullopt;
  return current_->at;
}

}  // namespace redcount::redis
