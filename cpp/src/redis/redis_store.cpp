#include "redcount/redis/redis_store.h"

#include <algorithm>
#include <array>
#include <new>
#include <string_view>

#include "redcount/common/slot.h"
#include "redcount/common/errors.h"
#include "redcount/redis/cluster.h"
#include "redcount/redis/engine.h"
#include "redcount/redis/master_follower.h"
#include "redcount/common/util.h"

namespace redcount {
namespace {

// Why a command cannot run on a connection that every caller of the store shares, or
// empty. `name` is lower case.
std::string refusal(std::string_view name, const std::vector<std::string>& args) {
  if (name == "select") {
    return "SELECT would switch the database of the connection every caller of this store shares; put the "
           "database in the URL (redis://host:port/N) or open another store";
  }
  if (name == "watch" || name == "unwatch") {
    return "WATCH needs a connection of its own, and this store shares its connections between all callers; "
           "use a script, or MULTI ... EXEC in one execute_many() batch";
  }
  if (name == "subscribe" || name == "psubscribe" || name == "ssubscribe" || name == "unsubscribe" ||
      name == "punsubscribe" || name == "sunsubscribe" || name == "monitor" || name == "sync" ||
      name == "psync" || name == "replconf") {
    return "it turns the connection into a stream that no longer answers commands, and this store shares its "
           "connections between all callers; use a dedicated Redis client for it";
  }
  if (name == "auth" || name == "hello" || name == "reset" || name == "quit" || name == "readonly" ||
      name == "readwrite") {
    return "it changes the state of the connection every caller of this store shares; credentials and the "
           "database belong in the URL";
  }
  if (name == "client" && args.size() >= 2) {
    const std::string sub = ascii_lower(args[1]);
    if (sub == "reply" || sub == "setname" || sub == "setinfo" || sub == "tracking" || sub == "caching" ||
        sub == "no-evict" || sub == "no-touch") {
      return "CLIENT " + ascii_lower(args[1]).substr(0, 32) +
             " changes the connection's state, and this store shares its connections between all callers";
    }
  }
  if (name == "blpop" || name == "brpop" || name == "brpoplpush" || name == "blmove" || name == "blmpop" ||
      name == "bzpopmin" || name == "bzpopmax" || name == "bzmpop" || name == "wait" || name == "waitaof") {
    return "a blocking command would stall every caller sharing this store's connection; use a dedicated Redis "
           "client for it";
  }
  if (name == "xread" || name == "xreadgroup") {
    for (const auto& a : args) {
      if (ascii_lower(a) == "block") {
        return "XREAD ... BLOCK would stall every caller sharing this store's connection; drop BLOCK or use a "
               "dedicated Redis client";
      }
    }
  }
  return {};
}

bool cheap_name(const std::string& s) {
  // Counters send these all the time: skip the full check for them.
  return s == "SET" || s == "INCRBY" || s == "PTTL" || s == "GET" || s == "PEXPIREAT" || s == "EVALSHA";
}

bool is_multi(const std::string& s) { return s == "MULTI" || s == "multi"; }
bool is_exec(const std::string& s) {
  return s == "EXEC" || s == "exec" || s == "DISCARD" || s == "discard";
}

// Throws InvalidArgument for a batch with a command the shared connection cannot carry.
void check_batch(const std::vector<Request>& batch) {
  bool in_multi = false;
  for (const auto& r : batch) {
    const auto* cmd = std::get_if<Command>(&r);
    if (cmd == nullptr) continue;
    if (cmd->args.empty()) throw InvalidArgument("empty command");
    if (cheap_name(cmd->args[0]) || cmd->blocks_for.count() > 0) continue;
    const bool multi = is_multi(cmd->args[0]), exec = is_exec(cmd->args[0]);
    const std::string name = multi || exec ? std::string() : ascii_lower(cmd->args[0]);
    if (multi || name == "multi") {
      if (in_multi) throw InvalidArgument("MULTI inside MULTI: a transaction cannot be nested");
      in_multi = true;
      continue;
    }
    if (exec || name == "exec" || name == "discard") {
      if (!in_multi) {
        throw InvalidArgument(
            "EXEC/DISCARD without MULTI in the same batch: a transaction must be sent whole (MULTI ... EXEC in one "
            "execute_many() call), because this store shares its connections between all callers");
      }
      in_multi = false;
      continue;
    }
    const std::string why = refusal(name, cmd->args);
    if (!why.empty()) {
      throw InvalidArgument("refused " + name.substr(0, 32) + ": " + why);
    }
  }
  if (in_multi) {
    throw InvalidArgument(
        "MULTI without EXEC or DISCARD in the same batch: a transaction must be sent whole (MULTI ... EXEC in one "
        "execute_many() call), because this store shares its connections between all callers");
  }
}

// "redis://[user@]host:port/db": one server, never its password.
std::string server_url(const StoreOptions& o) {
  return std::string(o.tls ? "rediss://" : "redis://") + (o.username.empty() ? std::string() : o.username + "@") +
         o.host + ":" + std::to_string(o.port) + "/" + std::to_string(o.db);
}

}  // namespace

RedisStore::RedisStore(StoreOptions options) : options_(std::move(options)) {
  if (options_.max_connections < 1) {
    throw InvalidArgument("max_connections must be >= 1, got " + std::to_string(options_.max_connections));
  }
  if (routed()) {
    cluster_ = std::make_shared<redis::Cluster>(options_);  // validates; connects at the first call
    cluster_current_.store(cluster_.get(), std::memory_order_release);
  } else if (options_.sentinel) {
    follower_ = std::make_shared<redis::MasterFollower>(options_);  // validates; asks the sentinels at the first call
    follower_current_.store(follower_.get(), std::memory_order_release);
  } else {
    engine_ = std::make_shared<redis::Engine>(options_);  // validates; starts nothing yet
    current_.store(engine_.get(), std::memory_order_release);
  }
  fork_hooks_ = ForkHooks::of(this);
}

RedisStore::RedisStore(StoreOptions options, std::shared_ptr<redis::Engine> engine)
    : options_(std::move(options)), engine_(std::move(engine)), owns_engine_(false) {
  options_.cluster = false;
  options_.seeds.clear();
  options_.ring.clear();
  options_.ring_names.clear();
  options_.sentinel = false;
  current_.store(engine_.get(), std::memory_order_release);
  fork_hooks_ = ForkHooks::of(this);
}

RedisStore::RedisStore(StoreOptions options, std::shared_ptr<redis::MasterFollower> follower)
    : options_(std::move(options)), owns_engine_(false), follower_(std::move(follower)) {
  options_.cluster = false;
  options_.seeds.clear();
  options_.ring.clear();
  options_.ring_names.clear();
  follower_current_.store(follower_.get(), std::memory_order_release);
  fork_hooks_ = ForkHooks::of(this);
}

RedisStore::~RedisStore() {
  fork_hooks_ = ForkHooks();
  if (engine_ && owns_engine_) engine_->close();
  if (cluster_) cluster_->close();
  if (follower_ && owns_engine_) follower_->close();
}

redis::MasterFollower& RedisStore::follower() {
  if (redis::MasterFollower* f = follower_current_.load(std::memory_order_acquire)) return *f;
  std::lock_guard<std::mutex> lock(mu_);
  if (!follower_) {  // first call in a forked child: a follower (and watcher thread) of its own
    follower_ = std::make_shared<redis::MasterFollower>(options_);
    follower_current_.store(follower_.get(), std::memory_order_release);
  }
  return *follower_;
}

std::string RedisStore::sentinel_master() const {
  redis::MasterFollower* f = follower_current_.load(std::memory_order_acquire);
  if (f == nullptr) return {};
  const auto at = f->master();
  return at ? at->text() : std::string();
}

std::uint64_t RedisStore::sentinel_switches() const {
  redis::MasterFollower* f = follower_current_.load(std::memory_order_acquire);
  return f ? f->switches() : 0;
}

std::array<std::uint64_t, 3> RedisStore::sentinel_holds() const {
  redis::MasterFollower* f = follower_current_.load(std::memory_order_acquire);
  if (!f) return {0, 0, 0};
  return {f->holds(), f->early_switches(), f->aborted_holds()};
}

redis::Cluster& RedisStore::cluster() {
  if (redis::Cluster* c = cluster_current_.load(std::memory_order_acquire)) return *c;
  std::lock_guard<std::mutex> lock(mu_);
  if (!cluster_) {  // first call in a forked child: a router of its own
    cluster_ = std::make_shared<redis::Cluster>(options_);
    if (node_breakers_) cluster_->use_node_breakers(*node_breakers_, node_breakers_fallback_);
    cluster_current_.store(cluster_.get(), std::memory_order_release);
  }
  return *cluster_;
}

std::uint32_t RedisStore::shard_of(std::string_view key) const noexcept {
  return routed() ? key_slot(key) : 0;
}

bool RedisStore::use_node_breakers(const ResilienceOptions& options, bool has_fallback) {
  if (!routed()) return false;
  std::lock_guard<std::mutex> lock(mu_);
  node_breakers_ = options;
  node_breakers_fallback_ = has_fallback;
  if (cluster_) cluster_->use_node_breakers(options, has_fallback);
  return true;
}

std::vector<NodeBreakerState> RedisStore::node_breakers() const {
  redis::Cluster* c = cluster_current_.load(std::memory_order_acquire);
  return c ? c->node_breakers() : std::vector<NodeBreakerState>{};
}

redis::ClusterStats RedisStore::cluster_stats() {
  if (!options_.cluster || closed_.load(std::memory_order_acquire)) return {};
  return cluster().stats();
}

std::vector<std::shared_ptr<Store>> RedisStore::nodes() {
  if (!routed()) return {};
  if (closed_.load(std::memory_order_acquire)) throw_closed();
  auto& c = cluster();
  auto masters = c.masters();
  if (c.is_ring()) {
    // One per member, in the order given, each with its own URL's settings.
    std::vector<std::shared_ptr<Store>> out;
    for (std::size_t i = 0; i < masters.size() && i < options_.ring.size(); ++i) {
      if (masters[i].follower) {
        out.push_back(std::make_shared<RedisStore>(options_.ring[i], std::move(masters[i].follower)));
      } else {
        out.push_back(std::make_shared<RedisStore>(options_.ring[i], std::move(masters[i].engine)));
      }
    }
    return out;
  }
  if (masters.empty()) {
    c.refresh_now(options_.command_timeout.count() > 0 ? options_.command_timeout : std::chrono::milliseconds(2000));
    masters = c.masters();
    if (masters.empty()) {
      throw ConnectionError("no node of the cluster answered CLUSTER SLOTS (seeds: " + describe() + ")");
    }
  }
  std::vector<std::shared_ptr<Store>> out;
  for (auto& m : masters) {
    StoreOptions o = options_;
    o.host = m.address.host;
    o.port = m.address.port;
    out.push_back(std::make_shared<RedisStore>(std::move(o), std::move(m.engine)));
  }
  return out;
}

redis::Engine& RedisStore::engine() {
  if (redis::Engine* e = current_.load(std::memory_order_acquire)) return *e;
  std::lock_guard<std::mutex> lock(mu_);
  if (!engine_) {  // first call in a forked child: a fresh engine of its own
    engine_ = std::make_shared<redis::Engine>(options_);
    current_.store(engine_.get(), std::memory_order_release);
  }
  return *engine_;
}

void RedisStore::fork_prepare() { mu_.lock(); }

void RedisStore::fork_parent() { mu_.unlock(); }

void RedisStore::fork_child() {
  // Only this thread exists now. The parent's engine is parked where nothing will ever
  // destroy it (its destructor would join a thread that is not here and close sockets
  // the parent still uses); the next call opens a new engine.
  new (inherited_) std::shared_ptr<redis::Engine>(std::move(engine_));
  current_.store(nullptr, std::memory_order_release);
  owns_engine_ = true;  // a node store's child opens an engine of its own
  if (cluster_) {
    // The same for a cluster's router and its engines: leaked on purpose, never touched.
    new std::shared_ptr<redis::Cluster>(std::move(cluster_));
    cluster_current_.store(nullptr, std::memory_order_release);
  }
  if (follower_) {
    // The same for a Sentinel follower: its watcher thread is not in the child.
    new std::shared_ptr<redis::MasterFollower>(std::move(follower_));
    follower_current_.store(nullptr, std::memory_order_release);
  }
  mu_.unlock();
}

void RedisStore::throw_closed() const {
  throw StoreClosed("the store for " + describe() + " is closed; open a new one with redcount.connect()");
}

std::vector<Reply> RedisStore::execute(const std::vector<Request>& batch) {
  if (closed_.load(std::memory_order_acquire)) throw_closed();
  check_batch(batch);
  if (routed()) return cluster().execute(batch);
  if (options_.sentinel) return follower().execute(batch);
  return engine().execute(batch);
}

std::vector<Reply> RedisStore::execute_owned(std::vector<Request>&& batch) {
  if (closed_.load(std::memory_order_acquire)) throw_closed();
  if (routed() || options_.sentinel) return execute(batch);
  check_batch(batch);
  return engine().execute(std::move(batch));
}

void RedisStore::submit(std::vector<Request> batch, BatchDone done, CancelFlag cancelled) {
  try {
    if (closed_.load(std::memory_order_acquire)) throw_closed();
    check_batch(batch);
  } catch (...) {
    return done({}, std::current_exception());
  }
  if (routed()) return cluster().submit(std::move(batch), std::move(done), std::move(cancelled));
  if (options_.sentinel) return follower().submit(std::move(batch), std::move(done), std::move(cancelled));
  engine().submit(std::move(batch), std::move(done), std::move(cancelled));
}

void RedisStore::close() {
  closed_.store(true, std::memory_order_release);
  std::shared_ptr<redis::Engine> e;
  std::shared_ptr<redis::Cluster> c;
  std::shared_ptr<redis::MasterFollower> f;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (owns_engine_) e = engine_;
    c = cluster_;
    if (owns_engine_) f = follower_;
  }
  if (e) e->close();
  if (c) c->close();
  if (f) f->close();
}

bool RedisStore::has_expire_options() const noexcept {
  if (routed()) {
    redis::Cluster* c = cluster_current_.load(std::memory_order_acquire);
    return c != nullptr && c->masters_at_least(7);
  }
  if (options_.sentinel) {
    redis::MasterFollower* f = follower_current_.load(std::memory_order_acquire);
    return f != nullptr && f->server_major() >= 7;
  }
  redis::Engine* e = current_.load(std::memory_order_acquire);
  return e != nullptr && e->server_major() >= 7;
}

bool RedisStore::contended() const noexcept {
  if (routed()) {
    redis::Cluster* c = cluster_current_.load(std::memory_order_acquire);
    return c != nullptr && c->contended();
  }
  if (options_.sentinel) {
    redis::MasterFollower* f = follower_current_.load(std::memory_order_acquire);
    return f != nullptr && f->contended();
  }
  redis::Engine* e = current_.load(std::memory_order_acquire);
  return e != nullptr && e->sync_contended();
}

int RedisStore::open_connections() const {
  if (routed()) {
    redis::Cluster* c = cluster_current_.load(std::memory_order_acquire);
    return c ? c->open_connections() : 0;
  }
  if (options_.sentinel) {
    redis::MasterFollower* f = follower_current_.load(std::memory_order_acquire);
    return f ? f->open_connections() : 0;
  }
  redis::Engine* e = current_.load(std::memory_order_acquire);
  return e ? e->open_connections() : 0;
}

std::string RedisStore::address() const {
  if (options_.kind == StoreOptions::Kind::Unix) return options_.unix_path;
  if (is_ring()) {
    std::string out;
    for (const auto& m : options_.ring) {
      if (!out.empty()) out += ',';
      out += redis::ring_member_address(m).text();
    }
    return out;
  }
  if (options_.sentinel) {
    const std::string m = sentinel_master();
    if (!m.empty()) return m;
  }
  if (options_.cluster || options_.sentinel) {
    const std::string d = describe();
    const auto from = d.find("://") + 3;
    const auto at = d.find('@', from);
    const auto start = at == std::string::npos ? from : at + 1;
    return d.substr(start, d.find('/', start) - start);
  }
  if (options_.host.find(':') != std::string::npos) return "[" + options_.host + "]:" + std::to_string(options_.port);
  return options_.host + ":" + std::to_string(options_.port);
}

std::string RedisStore::describe() const {
  if (options_.kind == StoreOptions::Kind::Unix) {
    return "unix://" + options_.unix_path + "?db=" + std::to_string(options_.db);
  }
  if (is_ring()) {
    // "ring:name=redis://host:port/db,..." (no space: it shows in reprs)
    std::string out = "ring:";
    for (std::size_t i = 0; i < options_.ring.size(); ++i) {
      const StoreOptions& m = options_.ring[i];
      if (i > 0) out += ',';
      out += i < options_.ring_names.size() ? printable(options_.ring_names[i]) : redis::ring_member_address(m).text();
      out += '=' + (m.sentinel ? redis::sentinel_url(m) : server_url(m));
    }
    return out;
  }
  if (options_.sentinel) return redis::sentinel_url(options_);
  if (options_.cluster) {
    std::string hosts;
    for (const auto& seed : options_.seeds) {
      if (!hosts.empty()) hosts += ',';
      hosts += (seed.host.find(':') != std::string::npos ? "[" + seed.host + "]" : seed.host) + ":" +
               std::to_string(seed.port);
    }
    return std::string(options_.tls ? "rediss+cluster://" : "redis+cluster://") +
           (options_.username.empty() ? std::string() : options_.username + "@") + hosts + "/" + std::to_string(options_.db);
  }
  return server_url(options_);
}

}  // namespace redcount
