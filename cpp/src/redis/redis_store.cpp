#include "redcount/redis/redis_store.h"

#include <algorithm>
#include <array>
#include <new>
#include <string_view>

#include "redcount/common/errors.h"
#include "redcount/common/util.h"
#include "redcount/redis/topology/open_target.h"
#include "redcount/redis/io/target.h"

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

}  // namespace

RedisStore::RedisStore(StoreOptions options) : options_(std::move(options)) {
  if (options_.max_connections < 1) {
    throw InvalidArgument("max_connections must be >= 1, got " + std::to_string(options_.max_connections));
  }
  target_ = redis::open_target(options_);  // validates; connects at the first call
  describe_ = target_->describe();
  address_ = target_->address();
  current_.store(target_.get(), std::memory_order_release);
  fork_hooks_ = ForkHooks::of(this);
}

RedisStore::RedisStore(StoreOptions options, std::shared_ptr<redis::Target> target)
    : options_(std::move(options)), target_(std::move(target)), owns_target_(false) {
  // A forked child opens a target of its own from these: the member alone.
  options_.cluster = false;
  options_.seeds.clear();
  options_.ring.clear();
  options_.ring_names.clear();
  describe_ = target_->describe();
  address_ = target_->address();
  current_.store(target_.get(), std::memory_order_release);
  fork_hooks_ = ForkHooks::of(this);
}

RedisStore::~RedisStore() {
  fork_hooks_ = ForkHooks();
  if (target_ && owns_target_) target_->close();
}

redis::Target& RedisStore::target() {
  if (redis::Target* t = current_.load(std::memory_order_acquire)) return *t;
  std::lock_guard<std::mutex> lock(mu_);
  if (!target_) {  // first call in a forked child: a target (engines, threads) of its own
    target_ = redis::open_target(options_);
    if (node_breakers_) target_->use_node_breakers(*node_breakers_, node_breakers_fallback_);
    current_.store(target_.get(), std::memory_order_release);
  }
  return *target_;
}

std::string RedisStore::sentinel_master() const {
  redis::Target* t = current_.load(std::memory_order_acquire);
  return t ? t->follower_stats().master : std::string();
}

std::uint64_t RedisStore::sentinel_switches() const {
  redis::Target* t = current_.load(std::memory_order_acquire);
  return t ? t->follower_stats().switches : 0;
}

std::array<std::uint64_t, 3> RedisStore::sentinel_holds() const {
  redis::Target* t = current_.load(std::memory_order_acquire);
  if (!t) return {0, 0, 0};
  const auto s = t->follower_stats();
  return {s.holds, s.early_switches, s.aborted_holds};
}

std::uint32_t RedisStore::shard_of(std::string_view key) const noexcept {
  if (redis::Target* t = current_.load(std::memory_order_acquire)) return t->shard_of(key);
  // In a forked child before its first call: open its target now (nothing connects yet).
  try {
    return const_cast<RedisStore*>(this)->target().shard_of(key);
  } catch (...) {
    return 0;
  }
}

bool RedisStore::use_node_breakers(const ResilienceOptions& options, bool has_fallback) {
  redis::Target& t = target();
  std::lock_guard<std::mutex> lock(mu_);
  if (!t.use_node_breakers(options, has_fallback)) return false;
  node_breakers_ = options;  // for a target opened again in a forked child
  node_breakers_fallback_ = has_fallback;
  return true;
}

std::vector<NodeBreakerState> RedisStore::node_breakers() const {
  redis::Target* t = current_.load(std::memory_order_acquire);
  return t ? t->node_breakers() : std::vector<NodeBreakerState>{};
}

redis::ClusterStats RedisStore::cluster_stats() {
  if (closed_.load(std::memory_order_acquire)) return {};
  return target().cluster_stats();
}

std::vector<std::shared_ptr<Store>> RedisStore::nodes() {
  if (closed_.load(std::memory_order_acquire)) throw_closed();
  std::vector<std::shared_ptr<Store>> out;
  for (auto& m : target().members()) out.push_back(std::make_shared<RedisStore>(std::move(m.options), std::move(m.target)));
  return out;
}

void RedisStore::fork_prepare() { mu_.lock(); }

void RedisStore::fork_parent() { mu_.unlock(); }

void RedisStore::fork_child() {
  // Only this thread exists now. The parent's target is parked where nothing will ever
  // destroy it (its destructor would join threads that are not here and close sockets the
  // parent still uses); the next call opens a new one.
  new (inherited_) std::shared_ptr<redis::Target>(std::move(target_));
  current_.store(nullptr, std::memory_order_release);
  owns_target_ = true;  // a node store's child opens a target of its own
  mu_.unlock();
}

void RedisStore::throw_closed() const {
  throw StoreClosed("the store for " + describe() + " is closed; open a new one with redcount.connect()");
}

std::vector<Reply> RedisStore::execute(const std::vector<Request>& batch) {
  if (closed_.load(std::memory_order_acquire)) throw_closed();
  check_batch(batch);
  return target().execute(batch);
}

std::vector<Reply> RedisStore::execute_owned(std::vector<Request>&& batch) {
  if (closed_.load(std::memory_order_acquire)) throw_closed();
  check_batch(batch);
  return target().execute_owned(std::move(batch));
}

void RedisStore::submit(std::vector<Request> batch, BatchDone done, CancelFlag cancelled) {
  try {
    if (closed_.load(std::memory_order_acquire)) throw_closed();
    check_batch(batch);
  } catch (...) {
    return done({}, std::current_exception());
  }
  target().submit(std::move(batch), std::move(done), std::move(cancelled));
}

void RedisStore::close() {
  closed_.store(true, std::memory_order_release);
  std::shared_ptr<redis::Target> t;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (owns_target_) t = target_;
  }
  if (t) t->close();
}

bool RedisStore::has_expire_options() const noexcept {
  redis::Target* t = current_.load(std::memory_order_acquire);
  return t != nullptr && t->server_major() >= 7;
}

bool RedisStore::contended() const noexcept {
  redis::Target* t = current_.load(std::memory_order_acquire);
  return t != nullptr && t->contended();
}

int RedisStore::open_connections() const {
  redis::Target* t = current_.load(std::memory_order_acquire);
  return t ? t->open_connections() : 0;
}

std::string RedisStore::address() const {
  redis::Target* t = current_.load(std::memory_order_acquire);
  return t ? t->address() : address_;
}

std::string RedisStore::describe() const { return describe_; }

}  // namespace redcount
