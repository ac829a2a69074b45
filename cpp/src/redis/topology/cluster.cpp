#include "redcount/redis/topology/cluster.h"

#include <algorithm>
#include <random>

#include "redcount/common/slot.h"
#include "redcount/common/errors.h"
#include "redcount/redis/io/engine.h"
#include "redcount/redis/topology/open_target.h"
#include "redcount/redis/topology/sentinel.h"
#include "redcount/redis/topology/ring.h"
#include "redcount/common/util.h"

namespace redcount::redis {
namespace {

constexpr std::chrono::milliseconds kRetryMin{5};
constexpr std::chrono::milliseconds kRetryMax{200};

bool word_is(std::string_view text, std::string_view word) {
  return text.starts_with(word) && (text.size() == word.size() || text[word.size()] == ' ');
}

std::optional<Address> parse_address(std::string_view text) {
  const auto colon = text.rfind(':');
  if (colon == std::string_view::npos) return std::nullopt;
  // "host:port@cport" (CLUSTER NODES style) never appears in MOVED, but be lenient.
  std::string_view port = text.substr(colon + 1);
  if (auto at = port.find('@'); at != std::string_view::npos) port = port.substr(0, at);
  auto p = parse_int64(port);
  if (!p || *p < 1 || *p > 65535) return std::nullopt;
  std::string_view host = text.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  return Address{std::string(host), static_cast<int>(*p)};
}

std::mt19937& rng() {
  static thread_local std::mt19937 r{std::random_device{}()};
  return r;
}

bool needs_router(const Reply& r) {
  if (!r.is_error()) return false;
  const std::string_view t = r.str;
  return word_is(t, "MOVED") || word_is(t, "ASK") || word_is(t, "TRYAGAIN") || word_is(t, "CLUSTERDOWN");
}

}  // namespace

std::vector<SlotRange> parse_cluster_slots(const Reply& reply, const std::string& asked) {
  if (reply.is_error()) throw_reply_error(reply.str);
  if (reply.type != Reply::Type::Array) throw ProtocolError("CLUSTER SLOTS: expected an array reply");
  std::vector<SlotRange> out;
  for (const Reply& e : reply.elements) {
    if (e.type != Reply::Type::Array || e.elements.size() < 3 || e.elements[0].type != Reply::Type::Integer ||
        e.elements[1].type != Reply::Type::Integer || e.elements[2].type != Reply::Type::Array ||
        e.elements[2].elements.size() < 2) {
      throw ProtocolError("CLUSTER SLOTS: unexpected entry shape");
    }
    const auto first = e.elements[0].integer, last = e.elements[1].integer;
    if (first < 0 || last < first || last >= static_cast<std::int64_t>(kClusterSlots)) {
      throw ProtocolError("CLUSTER SLOTS: slot range out of bounds");
    }
    const Reply& m = e.elements[2];
    std::string host = m.elements[0].str;  // String; empty or "?" = the node asked
    if (host.empty() || host == "?") host = asked;
    if (m.elements[1].type != Reply::Type::Integer) throw ProtocolError("CLUSTER SLOTS: port is not an integer");
    SlotRange range{static_cast<std::uint32_t>(first), static_cast<std::uint32_t>(last),
                    Address{std::move(host), static_cast<int>(m.elements[1].integer)}, {}};
    for (std::size_t k = 3; k < e.elements.size(); ++k) {
      const Reply& r = e.elements[k];
      // A replica without a usable endpoint ("" or "?": unknown) is left out.
      if (r.type != Reply::Type::Array || r.elements.size() < 2 || r.elements[1].type != Reply::Type::Integer) continue;
      const std::string& rh = r.elements[0].str;
      if (rh.empty() || rh == "?" || r.elements[1].integer < 1 || r.elements[1].integer > 65535) continue;
      range.replicas.push_back(Address{rh, static_cast<int>(r.elements[1].integer)});
    }
    out.push_back(std::move(range));
  }
  return out;
}

std::optional<Redirect> parse_redirect(const Reply& reply) {
  if (!reply.is_error()) return std::nullopt;
  const std::string_view t = reply.str;
  Redirect r;
  std::string_view rest;
  // A bare "MOVED" or "ASK" (a script's error_reply, a proxy) has no slot: not a redirect.
  if (word_is(t, "MOVED")) {
    rest = t.substr(std::min<std::size_t>(t.size(), 6));
  } else if (word_is(t, "ASK")) {
    r.ask = true;
    rest = t.substr(std::min<std::size_t>(t.size(), 4));
  } else {
    return std::nullopt;
  }
  const auto sp = rest.find(' ');
  if (sp == std::string_view::npos) return std::nullopt;
  auto slot = parse_int64(rest.substr(0, sp));
  if (!slot || *slot < 0 || *slot >= static_cast<std::int64_t>(kClusterSlots)) return std::nullopt;
  auto to = parse_address(rest.substr(sp + 1));
  if (!to) return std::nullopt;
  r.slot = static_cast<std::uint32_t>(*slot);
  r.to = std::move(*to);
  return r;
}

Child build_child(const std::vector<Request>& batch, const std::vector<Unit>& all_units,
                  const std::vector<std::uint32_t>& units, const std::vector<char>& asking) {
  Child c;
  c.units = units;
  std::size_t n = 0;
  for (auto u : units) n += all_units[u].end - all_units[u].begin + (asking[u] ? 1 : 0);
  c.requests.reserve(n);
  c.origin.reserve(n);
  for (auto u : units) {
    const Unit& unit = all_units[u];
    for (std::uint32_t i = unit.begin; i < unit.end; ++i) {
      if (asking[u] && i == unit.ask_at) {
        c.requests.emplace_back(Command{{"ASKING"}});
        c.origin.push_back(-1);
      }
      c.requests.push_back(batch[i]);
      c.origin.push_back(static_cast<std::int32_t>(i));
    }
  }
  return c;
}

// ----------------------------------------------------------------------------- batch

struct Cluster::Batch {
  enum class State : std::uint8_t { Pending, Done, Maybe, NotSent };
  std::vector<Request> requests;
  std::vector<Unit> units;
  BatchDone done;
  CancelFlag cancelled;
  TimePoint deadline = kNever;

  std::mutex mu;
  std::vector<Reply> replies;
  std::vector<char> have;        // per request: replies[i] is the server's answer
  std::vector<State> state;      // per unit
  std::vector<char> replied;     // per unit: holds a reply (a rejection that may be final)
  std::vector<std::optional<Address>> ask;  // per unit: ASK target for the next send
  std::vector<int> moved;        // per unit
  int children = 0;
  bool delay = false;            // a unit waits for a backoff before it is sent again
  bool topology = false;         // ... for a reason a new table may end (node failure, CLUSTERDOWN, unserved)
  std::uint64_t parked = 0;      // the ticket of the backoff it waits for (0: none)
  std::chrono::milliseconds backoff{0};
  std::exception_ptr fatal;      // ends the batch as it is (closed, cancelled, auth...)
  std::string not_sent;          // why units could not be sent (the last reason)
  std::string maybe;             // why units may or may not have run (the first reason)
  std::exception_ptr not_sent_error, maybe_error;  // the same, as raised by the node's engine
};

// ----------------------------------------------------------------------------- ring members

Address ring_member_address(const StoreOptions& member) {
  if (member.sentinel && !member.sentinels.empty()) {
    return Address{member.sentinel_service + "@" + member.sentinels.front().host, member.sentinels.front().port};
  }
  return Address{member.host, member.port};
}


// ----------------------------------------------------------------------------- cluster

Cluster::Cluster(const StoreOptions& options) : options_(options), slots_(kClusterSlots, -1) {
  if (!options_.ring.empty()) {
    ring_ = true;
    ring_names_ = options_.ring_names;
    if (ring_names_.empty()) {
      for (const auto& m : options_.ring) ring_names_.push_back(ring_member_address(m).text());
    }
    if (ring_names_.size() != options_.ring.size()) {
      throw InvalidArgument("a ring needs one name per server: got " + std::to_string(ring_names_.size()) +
                            " names for " + std::to_string(options_.ring.size()) + " servers");
    }
    for (std::size_t i = 0; i < options_.ring.size(); ++i) {
      for (std::size_t j = 0; j < i; ++j) {
        const Address a = ring_member_address(options_.ring[i]), b = ring_member_address(options_.ring[j]);
        if (a == b) throw InvalidArgument("ring members must be distinct servers: " + a.text() + " is given twice");
      }
    }
    const Ring ring(ring_names_);  // validates the names
    std::lock_guard<std::mutex> lock(mu_);
    for (std::size_t i = 0; i < options_.ring.size(); ++i) {
      StoreOptions o = options_.ring[i];
      if (o.kind != StoreOptions::Kind::Tcp || o.cluster || !o.ring.empty()) {
        throw InvalidArgument("ring member '" + printable(ring_names_[i]) +
                              "' must be a redis://, rediss:// or redis+sentinel:// URL (not memory://, unix:// or "
                              "a cluster)");
      }
      o.ring.clear();
      o.ring_names.clear();
      const Address address = ring_member_address(o);
      if (nodes_.count(address.text()) != 0) {
        throw InvalidArgument("ring members must be distinct servers: " + address.text() + " is given twice");
      }
      auto n = std::make_shared<Node>();
      n->address = address;
      n->name = ring_names_[i];
      n->target = open_target(o);  // validates; connects at the first call
      n->options = o;
      if (o.sentinel) n->where = sentinel_url(o);
      nodes_.emplace(address.text(), n);
      masters_.push_back(n);
    }
    for (std::uint32_t slot = 0; slot < kClusterSlots; ++slot) {
      slots_[slot] = static_cast<std::int32_t>(ring.node_of(slot));
    }
    // "ring:name=redis://host:port/db,..." (no space: it shows in reprs)
    describe_ = "ring:";
    for (std::size_t i = 0; i < options_.ring.size(); ++i) {
      if (i > 0) describe_ += ',';
      if (i > 0) address_ += ',';
      describe_ += i < options_.ring_names.size() ? printable(options_.ring_names[i]) : masters_[i]->address.text();
      describe_ += '=' + masters_[i]->target->describe();
      address_ += masters_[i]->address.text();
    }
    options_.ring.clear();
    options_.ring_names.clear();
    seeds_.push_back(masters_.front()->address);
    periodic_started_ = true;  // a static table: never refreshed
  } else {
    seeds_ = options_.seeds;
    for (const auto& seed : options_.seeds) {
      if (!address_.empty()) address_ += ',';
      address_ += seed.text();
    }
    describe_ = std::string(options_.tls ? "rediss+cluster://" : "redis+cluster://") +
                (options_.username.empty() ? std::string() : options_.username + "@") + address_ + "/" +
                std::to_string(options_.db);
    if (seeds_.empty()) seeds_.push_back(Address{options_.host, options_.port});
    options_.cluster = false;
    options_.seeds.clear();
    // Validates the per-node options (connections, timeouts) now, as a single server does.
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& s : seeds_) node_locked(s);
  }
}

Cluster::~Cluster() { close(); }

void Cluster::close() {
  std::vector<std::shared_ptr<Node>> nodes;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!closed_) {
      closed_ = true;
      for (auto& [k, n] : nodes_) nodes.push_back(n);
    }
    refresh_cv_.notify_all();
  }
  // Batches waiting for a backoff end now, with StoreClosed (dispatch sees closed_).
  timer_.close();
  for (auto& n : nodes) n->target->close();
}

std::shared_ptr<Cluster::Node> Cluster::node_locked(const Address& address) {
  const std::string key = address.text();
  auto it = nodes_.find(key);
  if (it != nodes_.end()) return it->second;
  StoreOptions o = options_;
  o.host = address.host;
  o.port = address.port;
  auto n = std::make_shared<Node>();
  n->address = address;
  n->target = std::make_shared<Engine>(o);
  n->options = std::move(o);
  if (breakers_on_.load(std::memory_order_relaxed)) n->breaker = make_breaker_locked(*n);
  nodes_.emplace(key, n);
  return n;
}

std::optional<Address> Cluster::master_of(std::uint32_t slot) const {
  std::lock_guard<std::mutex> lock(mu_);
  const auto i = slots_[slot % kClusterSlots];
  if (i < 0) return std::nullopt;
  return masters_[static_cast<std::size_t>(i)]->address;
}

std::vector<Member> Cluster::masters() {
  std::vector<Member> out;
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& m : masters_) out.push_back(Member{m->options, m->target});
  return out;
}

std::vector<Member> Cluster::members() {
  auto out = masters();
  if (!out.empty() || ring_) return out;
  refresh_now(options_.command_timeout.count() > 0 ? options_.command_timeout : std::chrono::milliseconds(2000));
  out = masters();
  if (out.empty()) throw ConnectionError("no node of the cluster answered CLUSTER SLOTS (seeds: " + describe_ + ")");
  return out;
}

int Cluster::server_major() const noexcept {
  std::lock_guard<std::mutex> lock(mu_);
  if (masters_.empty()) return 0;
  int major = masters_.front()->target->server_major();
  for (const auto& n : masters_) major = std::min(major, n->target->server_major());
  return major;
}

std::uint32_t Cluster::shard_of(std::string_view key) const noexcept { return key_slot(key); }

std::string Cluster::describe() const { return describe_; }

std::string Cluster::address() const { return address_; }

void Cluster::submit_routed(std::vector<Request> batch, BatchDone done, CancelFlag cancelled, TimePoint,
                            std::shared_ptr<std::vector<std::uint8_t>>) {
  submit(std::move(batch), std::move(done), std::move(cancelled));
}

std::vector<Reply> Cluster::execute_routed(const std::vector<Request>& batch, TimePoint) { return execute(batch); }

bool Cluster::masters_at_least(int major) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (masters_.empty()) return false;
  return std::all_of(masters_.begin(), masters_.end(),
                     [major](const std::shared_ptr<Node>& n) { return n->target->server_major() >= major; });
}

bool Cluster::contended() const noexcept {
  std::lock_guard<std::mutex> lock(mu_);
  return std::any_of(masters_.begin(), masters_.end(),
                     [](const std::shared_ptr<Node>& n) { return n->target->contended(); });
}

int Cluster::open_connections() const {
  std::lock_guard<std::mutex> lock(mu_);
  int total = 0;
  for (const auto& [k, n] : nodes_) total += n->target->open_connections();
  return total;
}

// ----------------------------------------------------------------------------- breakers

std::shared_ptr<Breaker> Cluster::make_breaker_locked(const Node& n) const {
  std::string where = !n.where.empty() ? n.where : std::string(options_.tls ? "rediss://" : "redis://") + n.address.text();
  if (!n.name.empty()) where = "ring node '" + printable(n.name) + "' (" + where + ")";
  return std::make_shared<Breaker>(breaker_options_, std::move(where), breaker_fallback_);
}

bool Cluster::use_node_breakers(const ResilienceOptions& options, bool has_fallback) {
  std::lock_guard<std::mutex> lock(mu_);
  breaker_options_ = options;
  breaker_fallback_ = has_fallback;
  breakers_on_.store(true, std::memory_order_relaxed);
  for (auto& [key, n] : nodes_) {
    if (!n->breaker) n->breaker = make_breaker_locked(*n);
  }
  return true;
}

std::vector<NodeBreakerState> Cluster::node_breakers() const {
  std::vector<NodeBreakerState> out;
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [key, n] : nodes_) {
    if (n->breaker) out.push_back(NodeBreakerState{n->breaker->where(), n->breaker->state(), n->breaker->switches()});
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.where < b.where; });
  return out;
}

std::shared_ptr<Breaker> Cluster::breaker_of(const Address& address) const {
  if (!breakers_on_.load(std::memory_order_relaxed)) return nullptr;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = nodes_.find(address.text());
  return it == nodes_.end() ? nullptr : it->second->breaker;
}

void Cluster::probe(const std::shared_ptr<Node>& node) {
  // In the background: the call that found the pause over does not wait for it.
  const auto timeout = options_.command_timeout.count() > 0 ? options_.command_timeout : std::chrono::milliseconds(2000);
  std::vector<Request> ping;
  ping.emplace_back(Command{{"PING"}});
  node->target->submit_routed(
      std::move(ping),
      [b = node->breaker](std::vector<Reply>&& replies, std::exception_ptr error) {
        b->probe_done(replies, std::move(error));
      },
      nullptr, SteadyClock::now() + timeout, nullptr);
}

// ----------------------------------------------------------------------------- table

void Cluster::install(const std::vector<SlotRange>& ranges) {
  std::unique_lock<std::mutex> lock(mu_);
  if (closed_) return;
  std::vector<std::shared_ptr<Node>> masters;
  std::vector<std::int32_t> slots(kClusterSlots, -1);
  std::unordered_map<std::string, std::vector<Address>> replicas;
  for (const auto& r : ranges) {
    auto n = node_locked(r.master);
    auto it = std::find(masters.begin(), masters.end(), n);
    const auto idx = static_cast<std::int32_t>(it - masters.begin());
    if (it == masters.end()) masters.push_back(n);
    for (std::uint32_t s = r.first; s <= r.last; ++s) slots[s] = idx;
    auto& known = replicas[r.master.text()];
    for (const auto& a : r.replicas) {
      if (std::find(known.begin(), known.end(), a) == known.end()) known.push_back(a);
    }
  }
  replicas_ = std::move(replicas);
  for (auto it = failed_.begin(); it != failed_.end();) {  // a failed node that left the table is no concern
    it = replicas_.count(it->first) != 0 ? std::next(it) : failed_.erase(it);
  }
  bool changed = masters.size() != masters_.size();
  for (std::size_t s = 0; s < kClusterSlots && !changed; ++s) {
    const Node* was = slots_[s] < 0 ? nullptr : masters_[static_cast<std::size_t>(slots_[s])].get();
    const Node* is = slots[s] < 0 ? nullptr : masters[static_cast<std::size_t>(slots[s])].get();
    changed = was != is;
  }
  masters_ = std::move(masters);
  slots_ = std::move(slots);
  if (!changed || parked_.empty()) return;
  std::vector<std::weak_ptr<Batch>> parked;
  parked.reserve(parked_.size());
  for (const auto& [key, p] : parked_) parked.push_back(p.batch);
  lock.unlock();
  // On the timer thread, not on the node's I/O thread that delivered CLUSTER SLOTS.
  timer_.schedule(SteadyClock::now(), [self = shared_from_this(), parked = std::move(parked)]() mutable {
    self->wake_parked(std::move(parked));
  });
}

bool Cluster::unpark(const std::shared_ptr<Batch>& batch, std::uint64_t ticket) {
  std::lock_guard<std::mutex> block(batch->mu);
  if (ticket == 0 || batch->parked != ticket) return false;  // woken earlier, or waiting for a later backoff
  batch->parked = 0;
  std::lock_guard<std::mutex> lock(mu_);
  if (auto it = parked_.find(batch.get()); it != parked_.end()) {
    if (it->second.topology) --topology_parked_;
    parked_.erase(it);
  }
  return true;
}

void Cluster::wake_parked(std::vector<std::weak_ptr<Batch>> parked) {
  for (const auto& w : parked) {
    auto batch = w.lock();
    if (!batch) continue;
    std::uint64_t ticket = 0;
    {
      std::lock_guard<std::mutex> block(batch->mu);
      ticket = batch->parked;
      if (ticket != 0) batch->backoff = std::chrono::milliseconds(0);  // a new table: retries start short again
    }
    if (unpark(batch, ticket)) dispatch(batch);
  }
}

void Cluster::patch(std::uint32_t slot, const Address& to) {
  std::lock_guard<std::mutex> lock(mu_);
  if (closed_ || ring_) return;  // a ring's table is fixed: a standalone server never redirects
  auto n = node_locked(to);
  auto it = std::find(masters_.begin(), masters_.end(), n);
  const auto idx = static_cast<std::int32_t>(it - masters_.begin());
  if (it == masters_.end()) masters_.push_back(n);
  slots_[slot] = idx;
}

void Cluster::request_refresh() {
  if (ring_) return;  // nothing to learn: the table is computed from the names
  const TimePoint now = SteadyClock::now();
  TimePoint at{};
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) return;
    if (refreshing_) {
      refresh_wanted_ = true;
      return;
    }
    const TimePoint gap_end = last_refresh_ + kRefreshGap;
    if (last_refresh_ != TimePoint{} && now < gap_end) {
      if (refresh_scheduled_) return;
      refresh_scheduled_ = true;
      // A little jitter (5-10 ms): clients that met the same failure do not ask in step,
      // and a waiting batch learns of a promotion at most about one gap after it.
      at = gap_end + jittered(kRefreshGap / 10);
    } else {
      refreshing_ = true;
      last_refresh_ = now;
    }
  }
  if (at != TimePoint{}) {
    timer_.schedule(at, [w = weak_from_this()] {
      if (auto self = w.lock()) {
        {
          std::lock_guard<std::mutex> lock(self->mu_);
          self->refresh_scheduled_ = false;
        }
        self->request_refresh();
      }
    });
    return;
  }
  start_refresh();
}

void Cluster::start_refresh() {
  refreshes_.fetch_add(1, std::memory_order_relaxed);
  std::shared_ptr<Node> node;
  bool start_periodic = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    start_periodic = !periodic_started_;
    periodic_started_ = true;
    // A random known node: the masters, or the seeds while no table is known; among them
    // those with a connection open, when any (a master that just died has none).
    std::vector<std::shared_ptr<Node>> candidates = masters_;
    if (candidates.empty()) {
      for (const auto& s : seeds_) candidates.push_back(node_locked(s));
    }
    std::vector<std::shared_ptr<Node>> alive;
    for (const auto& n : candidates) {
      if (n->target->open_connections() > 0) alive.push_back(n);
    }
    if (!alive.empty()) candidates.swap(alive);
    // Calls wait for a failed master's slots: ask its replicas, one of which will be
    // promoted and knows it first (unless asking one failed last time).
    if (topology_parked_ > 0 && !failed_.empty()) {
      std::vector<std::shared_ptr<Node>> replicas;
      for (const auto& [key, address] : failed_) {
        auto it = replicas_.find(key);
        if (it == replicas_.end()) continue;
        for (const auto& a : it->second) {
          if (a.text() != refresh_failed_at_) replicas.push_back(node_locked(a));
        }
      }
      if (!replicas.empty()) candidates.swap(replicas);
    }
    node = candidates[std::uniform_int_distribution<std::size_t>(0, candidates.size() - 1)(rng())];
  }
  if (start_periodic) {
    timer_.schedule(SteadyClock::now() + kRefreshEvery, [w = weak_from_this()] {
      if (auto self = w.lock()) self->periodic();
    });
  }
  const auto timeout = options_.command_timeout.count() > 0 ? options_.command_timeout : std::chrono::milliseconds(2000);
  std::vector<Request> batch;
  batch.emplace_back(Command{{"CLUSTER", "SLOTS"}});
  auto self = shared_from_this();
  node->target->submit_routed(
      std::move(batch),
      [self, host = node->address.host, at = node->address.text()](std::vector<Reply>&& replies,
                                                                   std::exception_ptr error) {
        bool ok = false;
        std::string why;
        try {
          if (error) std::rethrow_exception(error);
          if (replies.size() != 1) throw ProtocolError("no reply to CLUSTER SLOTS");
          auto ranges = parse_cluster_slots(replies[0], host);
          if (ranges.empty()) throw ProtocolError("CLUSTER SLOTS lists no slot");
          self->install(ranges);
          ok = true;
        } catch (const std::exception& e) {
          why = e.what();  // not a cluster, loading, unreachable: another node is asked next time
        }
        {
          std::lock_guard<std::mutex> lock(self->mu_);
          if (!ok) self->last_refresh_error_ = why;
          self->refresh_failed_at_ = ok ? std::string() : at;
        }
        self->refresh_done(ok);
      },
      nullptr, SteadyClock::now() + timeout, nullptr);
}

void Cluster::refresh_done(bool ok) {
  bool again = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    refreshing_ = false;
    ++refresh_generation_;
    // A failed refresh is not retried on its own (a cluster that is gone would be asked
    // forever); the callers still waiting ask again on their next retry.
    // Batches waiting for a failed node's slots to move (or CLUSTERDOWN to end): ask again
    // after the gap until the table changes or they give up.
    again = refresh_wanted_ || topology_parked_ > 0;
    refresh_wanted_ = false;
    if (ok) ++refresh_successes_;
    refresh_cv_.notify_all();
  }
  if (again) request_refresh();  // within the gap: scheduled, not at once
}

bool Cluster::refresh_now(std::chrono::milliseconds timeout) {
  if (ring_) return true;
  const TimePoint until = SteadyClock::now() + timeout;
  std::unique_lock<std::mutex> lock(mu_);
  const std::uint64_t start = refresh_successes_;
  std::uint64_t seen = refresh_generation_;
  lock.unlock();
  request_refresh();
  lock.lock();
  while (!closed_) {
    if (refresh_successes_ > start) return true;
    if (refresh_generation_ > seen) {  // that one failed: ask another node (rate-limited)
      seen = refresh_generation_;
      lock.unlock();
      request_refresh();
      lock.lock();
      continue;
    }
    if (refresh_cv_.wait_until(lock, until) == std::cv_status::timeout) return !masters_.empty();
  }
  return false;
}

void Cluster::periodic() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) return;
  }
  request_refresh();
  timer_.schedule(SteadyClock::now() + kRefreshEvery, [w = weak_from_this()] {
    if (auto self = w.lock()) self->periodic();
  });
}

// ----------------------------------------------------------------------------- batches

void Cluster::submit(std::vector<Request> batch, BatchDone done, CancelFlag cancelled) {
  auto b = std::make_shared<Batch>();
  try {
    if (cancelled && cancelled->load()) throw Cancelled("cancelled before it was sent");
    b->units = route_units(batch);
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) throw StoreClosed("the cluster store is closed; open a new one with redcount.connect() (nothing was sent)");
  } catch (...) {
    if (done) done({}, std::current_exception());
    return;
  }
  if (batch.empty()) return done({}, nullptr);
  // A blocking command (Quota's WAIT) may hold its node's reply that much longer.
  b->deadline = options_.command_timeout.count() > 0
                    ? SteadyClock::now() + options_.command_timeout + blocking_time(batch)
                    : kNever;
  b->replies.resize(batch.size());
  b->have.assign(batch.size(), 0);
  b->state.assign(b->units.size(), Batch::State::Pending);
  b->replied.assign(b->units.size(), 0);
  b->ask.resize(b->units.size());
  b->moved.assign(b->units.size(), 0);
  b->requests = std::move(batch);
  b->done = std::move(done);
  b->cancelled = std::move(cancelled);
  dispatch(b);
}

std::vector<Reply> Cluster::execute(const std::vector<Request>& batch) {
  if (batch.empty()) return {};
  std::vector<Unit> units = route_units(batch);
  const TimePoint deadline = options_.command_timeout.count() > 0
                                 ? SteadyClock::now() + options_.command_timeout + blocking_time(batch)
                                 : kNever;
  std::shared_ptr<Node> one;
  {
    std::unique_lock<std::mutex> lock(mu_);
    if (closed_) throw StoreClosed("the cluster store is closed; open a new one with redcount.connect() (nothing was sent)");
    if (masters_.empty()) {
      // The first call (or no node reachable so far): learn the table on this thread.
      lock.unlock();
      const auto wait = options_.command_timeout.count() > 0 ? options_.command_timeout : std::chrono::milliseconds(2000);
      refresh_now(wait);
      lock.lock();
    }
    bool single = !masters_.empty();
    for (const Unit& u : units) {
      if (!single) break;
      std::shared_ptr<Node> n;
      if (u.slot == kAnySlot) {
        n = one ? one : masters_.front();
      } else if (slots_[static_cast<std::size_t>(u.slot)] >= 0) {
        n = masters_[static_cast<std::size_t>(slots_[static_cast<std::size_t>(u.slot)])];
      }
      if (!n || (one && n != one)) single = false;
      one = n;
    }
    if (!single) one.reset();
    // A node whose breaker is not closed goes through dispatch, which refuses or probes.
    if (one && one->breaker && one->breaker->state() != BreakerState::Closed) one.reset();
  }

  struct Waiter {
    std::mutex m;
    std::condition_variable cv;
    bool done = false;
    std::vector<Reply> replies;
    std::exception_ptr error;
  };
  // The fast path: the whole batch on one node, on the caller's thread (an idle
  // connection of that node when there is one). The router's bookkeeping is built only
  // when a reply needs it (a redirect) or the node failed.
  std::vector<Reply> replies;
  std::exception_ptr error;
  if (one) {
    try {
      replies = one->target->execute_routed(batch, deadline);
    } catch (...) {
      error = std::current_exception();
    }
    if (!error && std::none_of(replies.begin(), replies.end(), needs_router)) {
      if (one->breaker) one->breaker->on_success();
      return replies;
    }
  }
  auto w = std::make_shared<Waiter>();
  auto b = std::make_shared<Batch>();
  b->units = std::move(units);
  b->deadline = deadline;
  b->requests = batch;
  b->replies.resize(batch.size());
  b->have.assign(batch.size(), 0);
  b->state.assign(b->units.size(), Batch::State::Pending);
  b->replied.assign(b->units.size(), 0);
  b->ask.resize(b->units.size());
  b->moved.assign(b->units.size(), 0);
  b->done = [w](std::vector<Reply>&& r, std::exception_ptr e) {
    std::lock_guard<std::mutex> lock(w->m);
    w->replies = std::move(r);
    w->error = std::move(e);
    w->done = true;
    w->cv.notify_one();
  };
  if (one) {
    Child c;
    c.origin.resize(batch.size());
    for (std::size_t i = 0; i < batch.size(); ++i) c.origin[i] = static_cast<std::int32_t>(i);
    c.units.resize(b->units.size());
    for (std::size_t u = 0; u < b->units.size(); ++u) c.units[u] = static_cast<std::uint32_t>(u);
    b->children = 1;
    absorb(b, c, one->address, std::move(replies), nullptr, error);
  } else {
    dispatch(b);
  }
  std::unique_lock<std::mutex> lock(w->m);
  w->cv.wait(lock, [&] { return w->done; });
  if (w->error) std::rethrow_exception(w->error);
  return std::move(w->replies);
}

void Cluster::dispatch(const std::shared_ptr<Batch>& batch) {
  if (batch->cancelled && batch->cancelled->load()) {
    {
      std::lock_guard<std::mutex> lock(batch->mu);
      if (!batch->fatal) batch->fatal = std::make_exception_ptr(Cancelled("cancelled before it was sent"));
    }
    return complete(batch);
  }
  struct Group {
    std::shared_ptr<Node> node;
    std::vector<std::uint32_t> units;
  };
  std::vector<Group> groups;
  std::vector<std::uint32_t> unserved;
  std::vector<char> asking(batch->units.size(), 0);
  bool closed = false;
  {
    std::lock_guard<std::mutex> block(batch->mu);
    std::lock_guard<std::mutex> lock(mu_);
    closed = closed_;
    for (std::uint32_t u = 0; u < batch->units.size() && !closed; ++u) {
      if (batch->state[u] != Batch::State::Pending) continue;
      const Unit& unit = batch->units[u];
      std::shared_ptr<Node> n;
      if (batch->ask[u]) {
        n = node_locked(*batch->ask[u]);
        asking[u] = 1;
      } else if (unit.slot == kAnySlot) {
        n = !groups.empty() ? groups.front().node : !masters_.empty() ? masters_.front() : node_locked(seeds_.front());
      } else if (const auto i = slots_[static_cast<std::size_t>(unit.slot)]; i >= 0) {
        n = masters_[static_cast<std::size_t>(i)];
      }
      if (!n) {
        unserved.push_back(u);
        continue;
      }
      // Sent again: an earlier round's reply (a redirect) is no longer its answer.
      for (auto i = unit.begin; i < unit.end; ++i) batch->have[i] = 0;
      auto g = std::find_if(groups.begin(), groups.end(), [&](const Group& x) { return x.node == n; });
      if (g == groups.end()) {
        groups.push_back(Group{n, {}});
        g = groups.end() - 1;
      }
      g->units.push_back(u);
    }
    if (!closed) {
      if (!unserved.empty()) {
        batch->delay = true;
        batch->topology = true;
        batch->not_sent = "no node of the cluster serves hash slot " +
                          std::to_string(batch->units[unserved.front()].slot) +
                          (masters_.empty() ? " (the slot table is not known yet: no seed node answered CLUSTER SLOTS" +
                                                  (last_refresh_error_.empty() ? std::string()
                                                                               : "; last error: " + last_refresh_error_) +
                                                  ")"
                                            : " (CLUSTER SLOTS lists no master for it)");
      }
    }
  }
  // Nodes whose breaker is open: their units are not sent and end now (no retry: failing
  // fast is the point), while the other nodes' units go out.
  std::vector<std::shared_ptr<Node>> probes;
  if (!closed && breakers_on_.load(std::memory_order_relaxed)) {
    std::vector<Group> refused;
    for (auto it = groups.begin(); it != groups.end();) {
      const auto admit = it->node->breaker ? it->node->breaker->admit() : Breaker::Admit::Go;
      if (admit == Breaker::Admit::Go) {
        ++it;
        continue;
      }
      if (admit == Breaker::Admit::Probe) probes.push_back(it->node);
      refused.push_back(std::move(*it));
      it = groups.erase(it);
    }
    if (!refused.empty()) {
      std::lock_guard<std::mutex> block(batch->mu);
      for (const auto& g : refused) {
        for (auto u : g.units) batch->state[u] = Batch::State::NotSent;
        batch->not_sent = g.node->breaker->refusal_text();
        batch->not_sent_error = std::make_exception_ptr(Unavailable(batch->not_sent, false));
      }
    }
  }
  for (const auto& n : probes) probe(n);
  if (!closed) {
    std::lock_guard<std::mutex> block(batch->mu);
    batch->children = static_cast<int>(groups.size());
  }
  if (closed) {
    {
      std::lock_guard<std::mutex> lock(batch->mu);
      if (!batch->fatal) {
        batch->fatal = std::make_exception_ptr(StoreClosed("the cluster store was closed (nothing more was sent)"));
      }
    }
    return complete(batch);
  }
  if (!unserved.empty()) request_refresh();
  if (groups.empty()) return finish_round(batch);
  auto self = shared_from_this();
  for (auto& g : groups) {
    auto child = std::make_shared<Child>(build_child(batch->requests, batch->units, g.units, asking));
    auto answered = std::make_shared<std::vector<std::uint8_t>>();
    std::vector<Request> requests = std::move(child->requests);
    child->requests.clear();
    g.node->target->submit_routed(
        std::move(requests),
        [self, batch, child, answered, address = g.node->address](std::vector<Reply>&& r, std::exception_ptr e) {
          self->absorb(batch, *child, address, std::move(r), answered.get(), e);
        },
        batch->cancelled, batch->deadline, answered);
  }
}

void Cluster::absorb(const std::shared_ptr<Batch>& batch, const Child& child, const Address& node,
                     std::vector<Reply>&& replies, const std::vector<std::uint8_t>* answered,
                     std::exception_ptr error) {
  bool refresh = false;
  bool last = false;
  std::vector<std::pair<std::uint32_t, Address>> patches;
  std::shared_ptr<Breaker> breaker = breaker_of(node);
  std::string failure;  // a connection-level failure of the node, for its breaker
  bool node_failed = false;  // its connection was refused or lost
  {
    std::lock_guard<std::mutex> lock(batch->mu);
    Batch& b = *batch;
    bool maybe = false;
    if (error) {
      try {
        std::rethrow_exception(error);
      } catch (const StoreClosed& e) {
        breaker = nullptr;
        if (!b.fatal) b.fatal = error;
        maybe = e.maybe_applied();
      } catch (const Cancelled&) {
        if (!b.fatal) b.fatal = error;
        breaker = nullptr;
      } catch (const TimeoutError& e) {
        failure = e.what();
        maybe = e.maybe_applied();
        if (!maybe) b.not_sent = e.what(), b.not_sent_error = error;
        if (maybe && b.maybe.empty()) b.maybe = e.what(), b.maybe_error = error;
      } catch (const ConnectionError& e) {
        failure = e.what();
        maybe = e.maybe_applied();
        if (!maybe) b.not_sent = e.what(), b.not_sent_error = error;
        if (maybe && b.maybe.empty()) b.maybe = e.what(), b.maybe_error = error;
        refresh = true;  // a node refusing or dropping connections: failing over, maybe
        node_failed = true;
      } catch (...) {
        if (!b.fatal) b.fatal = error;  // authentication, a script that cannot load...
        breaker = nullptr;  // not about the node being reachable
      }
    }
    // Replies received (all of them without an error; those marked answered with one).
    for (std::size_t i = 0; i < child.origin.size() && i < replies.size(); ++i) {
      const auto o = child.origin[i];
      if (o < 0) continue;
      if (error && (!answered || i >= answered->size() || !(*answered)[i])) continue;
      b.replies[static_cast<std::size_t>(o)] = std::move(replies[i]);
      b.have[static_cast<std::size_t>(o)] = 1;
    }
    const TimePoint now = SteadyClock::now();
    for (auto u : child.units) {
      const Unit& unit = b.units[u];
      bool complete_unit = true;
      for (auto i = unit.begin; i < unit.end; ++i) complete_unit = complete_unit && b.have[i];
      if (!complete_unit) {
        if (b.fatal) {
          b.state[u] = maybe ? Batch::State::Maybe : Batch::State::NotSent;
        } else if (maybe) {
          b.state[u] = Batch::State::Maybe;
        } else {
          b.state[u] = Batch::State::Pending;  // never written: it cannot have run
          b.delay = true;
          b.topology = b.topology || refresh;
          b.ask[u].reset();
        }
        continue;
      }
      b.replied[u] = 1;
      std::optional<Redirect> redirect;
      bool again = false, down = false;
      for (auto i = unit.begin; i < unit.end && !redirect && !again; ++i) {
        const Reply& r = b.replies[i];
        if (!r.is_error()) continue;
        redirect = parse_redirect(r);
        if (word_is(r.str, "TRYAGAIN")) again = true;
        if (word_is(r.str, "CLUSTERDOWN")) again = down = true;
      }
      if (redirect) (redirect->ask ? ask_ : moved_).fetch_add(1, std::memory_order_relaxed);
      if (down) {
        clusterdown_.fetch_add(1, std::memory_order_relaxed);
      } else if (again) {
        tryagain_.fetch_add(1, std::memory_order_relaxed);
      }
      if (redirect && !redirect->ask) {
        patches.emplace_back(redirect->slot, redirect->to);
        refresh = true;
        b.ask[u].reset();
        b.state[u] = ++b.moved[u] > kMaxMoved || now >= b.deadline ? Batch::State::Done : Batch::State::Pending;
      } else if (redirect) {
        b.ask[u] = redirect->to;
        b.state[u] = now >= b.deadline ? Batch::State::Done : Batch::State::Pending;
      } else if (again) {
        // Routed again from the table after a backoff: a migration that finished
        // meanwhile answers MOVED or serves it.
        b.ask[u].reset();
        b.state[u] = Batch::State::Pending;
        b.delay = true;
        b.topology = b.topology || down;
        refresh = refresh || down;
      } else {
        b.state[u] = Batch::State::Done;
      }
    }
    last = --b.children == 0;
  }
  if (breaker) {
    if (!error) {
      breaker->on_success();
    } else if (!failure.empty()) {
      breaker->on_failure(failure);
    }
  }
  if (node_failed || !error) {
    std::lock_guard<std::mutex> lock(mu_);
    if (node_failed) {
      failed_.insert_or_assign(node.text(), node);
    } else if (!failed_.empty()) {
      failed_.erase(node.text());
    }
  }
  for (const auto& [slot, to] : patches) patch(slot, to);
  if (refresh) request_refresh();
  if (last) finish_round(batch);
}

ClusterStats Cluster::cluster_stats() const noexcept { return ring_ ? ClusterStats{} : stats(); }

ClusterStats Cluster::stats() const noexcept {
  constexpr auto relaxed = std::memory_order_relaxed;
  return ClusterStats{moved_.load(relaxed), ask_.load(relaxed), tryagain_.load(relaxed),
                      clusterdown_.load(relaxed), refreshes_.load(relaxed)};
}

void Cluster::finish_round(const std::shared_ptr<Batch>& batch) {
  TimePoint at{};
  bool now_again = false;
  std::uint64_t ticket = 0;
  {
    std::lock_guard<std::mutex> lock(batch->mu);
    Batch& b = *batch;
    const bool topology = b.topology;
    b.topology = false;
    const bool pending =
        !b.fatal && std::any_of(b.state.begin(), b.state.end(), [](auto s) { return s == Batch::State::Pending; });
    if (pending) {
      const TimePoint now = SteadyClock::now();
      if (b.delay) {
        b.backoff = b.backoff.count() == 0 ? kRetryMin : std::min(b.backoff * 2, kRetryMax);
        at = now + jittered(b.backoff);
      } else {
        at = now;
      }
      if (at >= b.deadline) {
        // No time left: a unit that holds a rejection gives it to the caller; one that
        // was never sent is reported as such.
        for (std::size_t u = 0; u < b.state.size(); ++u) {
          if (b.state[u] != Batch::State::Pending) continue;
          b.state[u] = b.replied[u] ? Batch::State::Done : Batch::State::NotSent;
        }
        at = TimePoint{};
      } else {
        b.delay = false;
        now_again = !(at > now);
      }
      if (at != TimePoint{} && !now_again) {
        // Parked until `at`, or until a refresh changes the table (wake_parked).
        std::lock_guard<std::mutex> table(mu_);
        ticket = ++park_tickets_;
        b.parked = ticket;
        parked_[batch.get()] = Parked{batch, topology};
        if (topology) ++topology_parked_;
      }
    }
  }
  if (at == TimePoint{}) return complete(batch);
  if (now_again) return dispatch(batch);
  timer_.schedule(at, [self = shared_from_this(), batch, ticket] {
    if (self->unpark(batch, ticket)) self->dispatch(batch);
  });
}

void Cluster::complete(const std::shared_ptr<Batch>& batch) {
  BatchDone done;
  std::vector<Reply> replies;
  std::exception_ptr error;
  {
    std::lock_guard<std::mutex> lock(batch->mu);
    Batch& b = *batch;
    done = std::move(b.done);
    b.done = nullptr;
    if (b.fatal) {
      error = b.fatal;
    } else {
      std::size_t maybe = 0, not_sent = 0;
      for (std::size_t u = 0; u < b.units.size(); ++u) {
        const Unit& unit = b.units[u];
        for (auto i = unit.begin; i < unit.end; ++i) {
          if (b.have[i]) continue;
          if (b.state[u] == Batch::State::Maybe) ++maybe;
          if (b.state[u] == Batch::State::NotSent || b.state[u] == Batch::State::Pending) ++not_sent;
        }
      }
      const bool none_answered =
          std::none_of(b.have.begin(), b.have.end(), [](char h) { return h != 0; }) &&
          std::none_of(b.state.begin(), b.state.end(), [](auto st) { return st == Batch::State::Done; });
      if (maybe == 0 && not_sent == 0) {
        replies = std::move(b.replies);
      } else if (none_answered && maybe > 0 && b.maybe_error) {
        error = b.maybe_error;  // as on a single server: nothing completed
      } else if (none_answered && maybe == 0 && b.not_sent_error) {
        error = b.not_sent_error;
      } else {
        auto outcomes = std::make_shared<std::vector<RequestOutcome>>(b.requests.size());
        for (std::size_t u = 0; u < b.units.size(); ++u) {
          const Unit& unit = b.units[u];
          for (auto i = unit.begin; i < unit.end; ++i) {
            RequestOutcome& o = (*outcomes)[i];
            if (b.have[i] || b.state[u] == Batch::State::Done) {
              o.kind = RequestOutcome::Kind::Reply;
              o.reply = std::move(b.replies[i]);
            } else {
              o.kind = b.state[u] == Batch::State::Maybe ? RequestOutcome::Kind::Maybe : RequestOutcome::Kind::NotSent;
            }
          }
        }
        const std::size_t total = b.requests.size();
        std::string message;
        if (maybe > 0) {
          message = b.maybe + " (" + std::to_string(maybe) + " of " + std::to_string(total) +
                    " requests of the batch may or may not have run, " + std::to_string(not_sent) +
                    " were not sent, the rest completed: see the outcomes)";
        } else {
          message = (b.not_sent.empty() ? std::string("could not reach the node serving the request")
                                        : b.not_sent) +
                    " (" + std::to_string(not_sent) + " of " + std::to_string(total) +
                    " requests of the batch were not sent" +
                    (not_sent < total ? ", the rest completed: see the outcomes)" : "; nothing of them ran)");
        }
        ConnectionError e(message, maybe > 0);
        e.set_outcomes(std::move(outcomes));
        error = std::make_exception_ptr(e);
      }
    }
  }
  if (!done) return;
  try {
    if (error) {
      done({}, error);
    } else {
      done(std::move(replies), nullptr);
    }
  } catch (...) {
    // A completion callback must not throw; nobody is left to tell.
  }
}

}  // namespace redcount::redis
