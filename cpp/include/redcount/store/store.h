// The store interface every counter talks to.
//
// A counter builds a batch of requests (plain commands or script calls) and hands it
// to `Store::execute`, which runs it in one round trip on Redis (pipelined) or under
// one lock on the memory store. Counters never know which store they are on:
//
//   std::vector<Request> batch{ScriptCall{&scripts::fixed_window_incr, {key}, {"1", "2", "0"}}};
//   std::vector<Reply> replies = store.execute(batch);
//
// Error replies come back in-line (Reply::Type::Error) so a batch can report per-item
// failures; transport failures throw ConnectionError/TimeoutError.
//
// Implementations are thread-safe.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "redcount/common/clock.h"
#include "redcount/common/errors.h"
#include "redcount/store/breaker.h"
#include "redcount/store/reply.h"

namespace redcount {

class Keyspace;

// A script call's arguments in typed form. The memory store's twins may read them as
// they are (no text to format or parse); a network store renders them as ARGV text.
//
// A typed twin may answer in place: it leaves its result in the arguments object and
// replies Status "ANSWERED" (kAnsweredInPlace), sparing the caller an array reply it
// would only take apart again; answer() then gives the reply it stands for.
struct ScriptArgs {
  virtual ~ScriptArgs() = default;
  virtual std::vector<std::string> render() const = 0;
  virtual std::optional<Reply> answer() const { return std::nullopt; }
};
inline constexpr std::string_view kAnsweredInPlace = "ANSWERED";

// A Lua script with native twins for the memory store. All must have the same
// semantics; the Lua text is what Redis runs, `native` is what the memory store runs
// under its lock for a call with text ARGV, and `typed` (optional) for a call that carries
// `ScriptCall::typed`, which is then always the ScriptArgs type made for this script. The
// SHA1 is computed at build time from the embedded Lua text.
struct Script {
  using Native = Reply (*)(Keyspace& ks, const std::vector<std::string>& keys,
                           const std::vector<std::string>& args);
  using Typed = Reply (*)(Keyspace& ks, const std::vector<std::string>& keys, const ScriptArgs& args);
  std::string_view name;
  std::string_view source;
  std::string_view sha1;
  Native native;
  Typed typed = nullptr;
};

struct Command {
  std::vector<std::string> args;
  // Set only by redcount's own operations for a blocking command with a bounded timeout
  // (Quota's WAIT): how long the server may hold the reply at most; 0 = not blocking.
  // The Redis store sends a batch holding one on a connection kept for blocking commands
  // (never one of the shared, multiplexed connections, whose other callers would wait
  // behind it), with the whole batch there so that a WAIT follows its own write, and gives
  // the batch this much time on top of command_timeout. Users' blocking commands stay
  // refused.
  std::chrono::milliseconds blocks_for{0};
};

struct ScriptCall {
  const Script* script = nullptr;
  std::vector<std::string> keys;
  std::vector<std::string> args;             // ARGV as text; may be empty when `typed` is set
  std::shared_ptr<const ScriptArgs> typed{};  // optional typed form of the same ARGV

  // ARGV as Redis receives it: `args`, or `typed` rendered into `scratch`.
  const std::vector<std::string>& argv(std::vector<std::string>& scratch) const {
    if (args.empty() && typed) {
      scratch = typed->render();
      return scratch;
    }
    return args;
  }
};

// Every script redcount sends, in one registry: what a connection loads with SCRIPT LOAD
// in its handshake, and what the parity test walks.
const std::vector<const Script*>& all_scripts();

using Request = std::variant<Command, ScriptCall>;

// How long the blocking commands of a batch (Command::blocks_for) may hold its replies.
inline std::chrono::milliseconds blocking_time(const std::vector<Request>& batch) noexcept {
  std::chrono::milliseconds total{0};
  for (const auto& r : batch) {
    if (const auto* cmd = std::get_if<Command>(&r)) total += cmd->blocks_for;
  }
  return total;
}

// Operations a native script may perform on the memory store's keyspace, with the
// semantics of the Redis command of the same name. Only valid inside a script call.
class Keyspace {
 public:
  virtual ~Keyspace() = default;
  virtual std::int64_t now_ms() const = 0;
  virtual std::optional<std::string> get(const std::string& key) = 0;
  // Returns the new value; throws ReplyError exactly where Redis would.
  virtual std::int64_t incrby(const std::string& key, std::int64_t amount) = 0;
  // SET key value NX PXAT at_ms; true when it was set.
  virtual bool set_nx_pxat(const std::string& key, const std::string& value, std::int64_t at_ms) = 0;
  virtual std::int64_t pttl(const std::string& key) = 0;
  virtual bool pexpireat(const std::string& key, std::int64_t at_ms) = 0;
  virtual bool del(const std::string& key) = 0;
  virtual bool exists(const std::string& key) = 0;

  // Sorted sets, with the semantics of the Redis command of the same name. Score ranges
  // are inclusive at both ends; a set that becomes empty is deleted with its TTL, as in
  // Redis. Every method throws ReplyError("WRONGTYPE ...") on a key of another type, and
  // get()/incrby() do the same on a key that is not a string.
  using ScoredMember = std::pair<std::string, double>;
  // Adds or re-scores `member`; true when it was new (ZADD key score member).
  virtual bool zadd(const std::string& key, double score, const std::string& member) = 0;
  // ZADD of a member the caller knows is not in the set (a twin's own generated member):
  // a store may skip the membership check.
  virtual void zadd_unique(const std::string& key, double score, const std::string& member) {
    zadd(key, score, member);
  }
  virtual bool zrem(const std::string& key, const std::string& member) = 0;
  virtual std::int64_t zcard(const std::string& key) = 0;
  virtual std::optional<double> zscore(const std::string& key, const std::string& member) = 0;
  // ZREMRANGEBYSCORE key min max; returns how many were removed.
  virtual std::int64_t zremrangebyscore(const std::string& key, double min, double max) = 0;
  // ZRANGE key start stop WITHSCORES: by rank, ascending score then member; negative
  // indexes count from the end.
  virtual std::vector<ScoredMember> zrange(const std::string& key, std::int64_t start, std::int64_t stop) = 0;
  // ZRANGEBYSCORE key min max WITHSCORES [LIMIT 0 limit]; limit < 0 means all.
  virtual std::vector<ScoredMember> zrangebyscore(const std::string& key, double min, double max,
                                                  std::int64_t limit = -1) = 0;

  // Hashes (HGET / HSET key field value / HDEL / HGETALL).
  virtual std::optional<std::string> hget(const std::string& key, const std::string& field) = 0;
  virtual void hset(const std::string& key, const std::string& field, const std::string& value) = 0;
  // HINCRBY key field amount: the new value; throws ReplyError where Redis errs.
  virtual std::int64_t hincrby(const std::string& key, const std::string& field, std::int64_t amount) = 0;
  // HDEL key field; true when the field existed. An emptied hash is deleted.
  virtual bool hdel(const std::string& key, const std::string& field) = 0;
  // Calls visit(ctx, field, value) for each field, in no particular order, without
  // copying; visit must not change the keyspace.
  virtual void hvisit(const std::string& key, void* ctx,
                      void (*visit)(void* ctx, std::string_view field, std::string_view value)) = 0;
  // HGETALL key as (field, value) pairs, in no particular order.
  virtual std::vector<std::pair<std::string, std::string>> hgetall(const std::string& key) = 0;

  // How every script holds a key to its expiry: sets `at_ms` when the key has no expiry
  // (a foreign PERSIST or SET) or a later one (a foreign PEXPIRE), as Redis 7's
  // `PEXPIREAT key at_ms LT` does. True when it changed the expiry.
  bool hold_expiry(const std::string& key, std::int64_t at_ms) {
    const std::int64_t left = pttl(key);
    // now + left, not at_ms - now: at_ms comes from a script's arguments and may be any int64.
    if (left == -2 || (left >= 0 && now_ms() + left <= at_ms)) return false;
    return pexpireat(key, at_ms);
  }

  // A foreign value of another type in a key's place is garbage to the scripts: runs
  // `read`, and when it fails with WRONGTYPE deletes the key and runs it again.
  template <class F>
  auto or_reset(const std::string& key, F&& read) -> decltype(read()) {
    try {
      return read();
    } catch (const ReplyError& e) {
      if (std::string_view(e.what()).substr(0, 9) != "WRONGTYPE") throw;
    }
    del(key);
    return read();
  }

  // Streams: XADD key MAXLEN ~ maxlen * field value ... (maxlen >= 1); returns the new
  // entry's id ("<ms>-<seq>"). WRONGTYPE on a key of another type.
  virtual std::string xadd(const std::string& key, const std::vector<std::pair<std::string, std::string>>& fields,
                           std::int64_t maxlen) = 0;
};

// Called exactly once with a batch's replies (in request order) or a transport error.
using BatchDone = std::function<void(std::vector<Reply>&& replies, std::exception_ptr error)>;
// Set to true by a caller that gave up (a cancelled coroutine): a store drops the batch
// if it has not been written yet, and discards its replies if it has.
using CancelFlag = std::shared_ptr<std::atomic<bool>>;

class Store {
 public:
  virtual ~Store() = default;

  // Runs the whole batch: one round trip on Redis, one critical section in memory.
  // Replies are in request order; error replies are returned, not thrown.
  virtual std::vector<Reply> execute(const std::vector<Request>& batch) = 0;
  // execute() of a batch the caller no longer needs: a store that keeps the requests
  // while they run (the Redis store's job) takes them over instead of copying them.
  virtual std::vector<Reply> execute_owned(std::vector<Request>&& batch) { return execute(batch); }

  // Runs the batch without blocking the caller on the network: `done` is called on the
  // store's I/O thread, or on the calling thread before submit returns (the memory store,
  // or an error known at once). The default runs execute() inline.
  virtual void submit(std::vector<Request> batch, BatchDone done, CancelFlag cancelled = nullptr);

  Reply execute_one(Request request) {
    std::vector<Request> batch;
    batch.push_back(std::move(request));
    return std::move(execute(batch).front());
  }

  // Keys on the same shard may go to one script call together. Single-node stores keep
  // every key on shard 0; a Redis Cluster store answers with the key's hash slot, so
  // batching code groups by it and never needs to know about Cluster.
  virtual std::uint32_t shard_of(std::string_view /*key*/) const noexcept { return 0; }

  // One store per master of a Redis Cluster, each sending only to its node (with execute,
  // submit, ping and describe() giving its address): for what is about one node (KEYS,
  // SCAN, DBSIZE, INFO, FLUSHALL), which a cluster store refuses. Empty for a store that is
  // a single server (or memory): it is its own only node.
  virtual std::vector<std::shared_ptr<Store>> nodes() { return {}; }

  // A routed store (a Redis Cluster, a client-side ring) can keep one circuit breaker per
  // node (breaker.h), so that a dead node fails fast for its own slots while the others keep
  // serving: a ResilientStore in front of it turns them on here and keeps none of its own.
  // False for a store that is one server (the ResilientStore's breaker covers it).
  virtual bool use_node_breakers(const ResilienceOptions& /*options*/, bool /*has_fallback*/) { return false; }
  // The node breakers' states, one per node that has one (empty without them).
  virtual std::vector<NodeBreakerState> node_breakers() const { return {}; }

  // Milliseconds since the epoch as this store's clients should see them.
  virtual std::int64_t now_ms() const = 0;
  // True when execute()/submit() handle ScriptCall::typed themselves (a twin reads it, or
  // the store formats argv()). For other stores the drivers (run, run_async) render typed
  // arguments to text first.
  virtual bool accepts_typed_args() const noexcept { return false; }
  // True when now_ms() is the server's own clock (an in-process store): clients then
  // need no measured offset to the server's time.
  virtual bool server_clock_is_local() const noexcept { return false; }
  // True when the server takes PEXPIREAT's NX/XX/GT/LT options (Redis >= 7.0), so an
  // increment can be MULTI/INCRBY/PEXPIREAT LT/EXEC instead of a script.
  virtual bool has_expire_options() const noexcept { return false; }
  // True while other threads wait in execute() on this store, each on a connection of its
  // own (thread connections): their calls are separate round trips, not pipelined together,
  // and the client's CPU is what runs out. An operation with two equivalent forms may then
  // take the one that costs the client less (the fixed-window increment: one script call
  // rather than a four-command transaction).
  virtual bool contended() const noexcept { return false; }
  // "memory://" or "redis://host:port/db" (never the password).
  virtual std::string describe() const = 0;
  virtual bool is_memory() const noexcept = 0;
  // Releases connections and background threads; later calls raise ConnectionError.
  virtual void close() = 0;
};

// Parses `url` and opens the matching store. nullopt/empty url means memory://.
struct StoreOptions;
std::shared_ptr<Store> open_store(const StoreOptions& options);

}  // namespace redcount
