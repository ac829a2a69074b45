#include <algorithm>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <random>
#include <thread>
#include <type_traits>

#include "redcount/errors.h"
#include "redcount/keys.h"
#include "redcount/lua_scripts.h"
#include "redcount/sharded.h"
#include "redcount/util.h"
#include "redcount/window.h"
#include "../retry_queue.h"

namespace redcount {
namespace {

using SteadyClock = std::chrono::steady_clock;

// The memory store's twin of sharded_incr.lua; keep the two in step.
Reply native_sharded_incr(Keyspace& ks, const std::vector<std::string>& keys, const std::vector<std::string>& args) {
  auto bad = [] { return Reply::of_error("ERR sharded_incr: malformed arguments"); };
  if (args.size() < 3) return bad();
  auto n = parse_int64(args[0]);
  auto ttl = parse_int64(args[1]);
  auto maxlen = parse_int64(args[2]);
  if (!n || !ttl || !maxlen || *n < 0 || *ttl < 1 || *maxlen < 0) return bad();
  const auto count = static_cast<std::size_t>(*n);
  if (args.size() != 3 + 5 * count) return bad();
  std::vector<Reply> out;
  out.reserve(count);
  std::size_t k = 0;
  for (std::size_t i = 0; i < count; ++i) {
    const std::size_t a = 3 + 5 * i;
    const std::string& amount_text = args[a];
    const std::string& rid = args[a + 3];
    const std::string& reason = args[a + 4];
    if (k + 2 + (rid.empty() ? 0 : 1) > keys.size()) return bad();
    const std::string& value = keys[k];
    const std::string& log = keys[k + 1];
    const std::string* ridkey = rid.empty() ? nullptr : &keys[k + 2];
    k += ridkey ? 3 : 2;
    if (ridkey && !ks.set_nx_pxat(*ridkey, "1", ks.now_ms() + *ttl)) {
      out.push_back(Reply::of_integer(0));
      continue;
    }
    auto amount = parse_int64(amount_text);
    if (!amount) {
      if (ridkey) ks.del(*ridkey);
      out.push_back(Reply::of_error("ERR value is not an integer or out of range"));
      continue;
    }
    try {
      ks.incrby(value, *amount);
    } catch (const ReplyError& e) {
      if (ridkey) ks.del(*ridkey);
      out.push_back(Reply::of_error(e.what()));
      continue;
    }
    try {
      std::vector<std::pair<std::string, std::string>> fields{
          {"counter", args[a + 1]}, {"shard", args[a + 2]}, {"delta", amount_text}, {"request_id", rid}};
      if (!reason.empty()) fields.emplace_back("reason", reason);
      ks.xadd(log, fields, *maxlen);
    } catch (const ReplyError& e) {
      ks.incrby(value, -*amount);  // the log refused it: the value must not keep it either
      if (ridkey) ks.del(*ridkey);
      out.push_back(Reply::of_error(e.what()));
      continue;
    }
    out.push_back(Reply::of_integer(1));
  }
  return Reply::of_array(std::move(out));
}

std::int64_t shard_reply(const Reply& r) {
  r.check();
  if (r.is_nil()) return 0;
  return r.as_integer();
}

std::int64_t checked_sum(const std::vector<std::int64_t>& v) {
  std::int64_t total = 0;
  for (std::int64_t x : v) {
    if (__builtin_add_overflow(total, x, &total)) {
      throw Error("the shards' sum does not fit in a signed 64-bit integer");
    }
  }
  return total;
}

// One increment resolved to its shard and keys.
struct ShardedWrite {
  std::string name;
  std::int64_t shard = 0;
  std::int64_t amount = 0;
  std::string request_id;
  std::string reason;  // non-empty for an audited adjustment
  std::string value_key, log_key, rid_key;
};

}  // namespace

const Script kShardedIncrScript{"sharded_incr", lua::sharded_incr_source, lua::sharded_incr_sha1,
                                &native_sharded_incr};

struct ShardedCounter::Core {
  struct Queued {
    ShardedWrite write;
    SteadyClock::time_point due;
    SteadyClock::time_point first_tried;
    std::chrono::milliseconds backoff;
  };

  std::shared_ptr<Store> store;
  ShardedOptions options;

  // The read cache.
  std::mutex cache_mu;
  std::optional<std::int64_t> cached;
  SteadyClock::time_point cached_at{};       // when the read that produced `cached` was sent
  SteadyClock::time_point refresh_started{};  // a refresh in flight, if recent

  // The retry queue.
  mutable std::mutex mu;
  std::condition_variable cv, drained;
  std::deque<Queued> queue;
  std::size_t in_flight = 0;
  RetryStats stats;
  bool stopping = false, closed = false, flush_now = false;
  std::thread retry_thread;

  ~Core() {
    if (retry_thread.joinable()) {
      {
        std::lock_guard<std::mutex> lock(mu);
        stopping = true;
      }
      cv.notify_all();
      if (retry_thread.get_id() == std::this_thread::get_id()) {
        retry_thread.detach();
      } else {
        retry_thread.join();
      }
    }
  }

  bool queueing() const noexcept { return options.on_error == ShardedOptions::OnError::Queue; }

  std::int64_t shard_for(std::string_view request_id) const {
    if (!request_id.empty()) {
      return static_cast<std::int64_t>(fnv1a64(request_id) % static_cast<std::uint64_t>(options.shards));
    }
    static thread_local std::minstd_rand rng{std::random_device{}()};
    return static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(options.shards));
  }

  ShardedWrite resolve(std::string_view name, std::int64_t amount, std::string_view request_id) const {
    if (amount == 0) throw InvalidArgument("amount must not be 0 (use a positive or negative integer)");
    if (amount > kMaxShardedAmount || amount < -kMaxShardedAmount) {
      throw InvalidArgument("amount must be within +-(2**53 - 1), got " + std::to_string(amount));
    }
    if (!request_id.empty()) {
      validate_request_id(request_id);
      if (options.route == ShardedOptions::Route::Random) {
        throw InvalidArgument(
            "request_id needs route='request-id': with route='random' a retry could land on a shard "
            "that has not seen the id, and count twice");
      }
    }
    ShardedWrite w;
    w.name = std::string(name);
    w.shard = shard_for(request_id);
    w.amount = amount;
    w.request_id = std::string(request_id);
    w.value_key = sharded_value_key(options.prefix, name, w.shard);
    w.log_key = sharded_key(options.prefix, name, w.shard, "log");
    if (!request_id.empty()) w.rid_key = sharded_key(options.prefix, name, w.shard, std::string("rid:").append(request_id));
    return w;
  }

  std::vector<std::string> shard_keys(std::string_view name) const {
    std::vector<std::string> out;
    out.reserve(static_cast<std::size_t>(options.shards));
    for (std::int64_t i = 0; i < options.shards; ++i) out.push_back(sharded_value_key(options.prefix, name, i));
    return out;
  }

  void check_open() const {
    std::lock_guard<std::mutex> lock(mu);
    if (closed) throw Error("this counter is closed; create a new ShardedCounter");
  }
  void enqueue(std::vector<ShardedWrite> writes, const std::string& error);
  void retry_loop();
  void retry_due_once(bool everything);
  std::size_t flush(std::optional<std::chrono::milliseconds> timeout);
};

namespace {

using Core = ShardedCounter::Core;

// The script calls of a set of writes: grouped by the store's shard of each value key
// (a Cluster slot; one group on a single server), max_script_batch writes per call.
struct ScriptBatch {
  std::vector<Request> requests;
  std::vector<std::vector<std::size_t>> members;  // per call, the writes it carries
};

ScriptBatch build_calls(const Store& store, const ShardedOptions& o, const std::vector<ShardedWrite>& writes) {
  std::map<std::uint32_t, std::vector<std::size_t>> groups;
  for (std::size_t i = 0; i < writes.size(); ++i) groups[store.shard_of(writes[i].value_key)].push_back(i);
  ScriptBatch out;
  const std::string ttl = std::to_string(o.idempotency_ttl_ms), maxlen = std::to_string(o.log_maxlen);
  for (const auto& [slot, idx] : groups) {
    for (std::size_t start = 0; start < idx.size(); start += o.max_script_batch) {
      const std::size_t end = std::min(idx.size(), start + o.max_script_batch);
      ScriptCall call{&kShardedIncrScript, {}, {}};
      call.args.reserve(3 + 5 * (end - start));
      call.args.push_back(std::to_string(end - start));
      call.args.push_back(ttl);
      call.args.push_back(maxlen);
      std::vector<std::size_t> group;
      for (std::size_t g = start; g < end; ++g) {
        const ShardedWrite& w = writes[idx[g]];
        call.keys.push_back(w.value_key);
        call.keys.push_back(w.log_key);
        if (!w.rid_key.empty()) call.keys.push_back(w.rid_key);
        call.args.push_back(std::to_string(w.amount));
        call.args.push_back(w.name);
        call.args.push_back(std::to_string(w.shard));
        call.args.push_back(w.request_id);
        call.args.push_back(w.reason);
        group.push_back(idx[g]);
      }
      out.requests.emplace_back(std::move(call));
      out.members.push_back(std::move(group));
    }
  }
  return out;
}

// The per-write replies of a batch's script replies (a whole call's error goes to each of its writes).
std::vector<Reply> split_replies(std::vector<Reply>& replies, const ScriptBatch& b, std::size_t n) {
  if (replies.size() != b.members.size()) throw ProtocolError("sharded_incr: reply count mismatch");
  std::vector<Reply> out(n);
  for (std::size_t c = 0; c < replies.size(); ++c) {
    Reply& r = replies[c];
    const auto& group = b.members[c];
    if (r.type == Reply::Type::Array && r.elements.size() == group.size()) {
      for (std::size_t g = 0; g < group.size(); ++g) out[group[g]] = std::move(r.elements[g]);
    } else if (r.is_error()) {
      for (std::size_t g : group) out[g] = r;
    } else {
      throw ProtocolError("sharded_incr returned an unexpected reply");
    }
  }
  return out;
}

// Writes as the caller sees them: true/false per write, queued writes (OnError::Queue,
// request id, transient failure) reported as true.
template <class T>
class IncrOp final : public Op<T> {
 public:
  IncrOp(std::shared_ptr<Core> core, std::vector<ShardedWrite> writes)
      : core_(std::move(core)), writes_(std::move(writes)) {
    with_meter(this, Meter::Write, writes_.size());
  }

  std::vector<Request> prepare() override {
    core_->check_open();
    if (writes_.empty()) {
      done_with({});
      return {};
    }
    batch_ = build_calls(*core_->store, core_->options, writes_);
    return std::move(batch_.requests);
  }

  std::vector<Request> finish(std::vector<Reply> replies) override {
    std::vector<Reply> per = split_replies(replies, batch_, writes_.size());
    std::vector<bool> applied(writes_.size(), true);
    std::vector<ShardedWrite> later;
    std::string later_error, failures;
    std::size_t failed = 0, first_failed = 0, answered = 0, hits = 0;  // answered/hits: metrics
    for (std::size_t i = 0; i < per.size(); ++i) {
      if (!per[i].is_error()) {
        applied[i] = per[i].as_integer() == 1;
        if (!writes_[i].request_id.empty()) ++answered, hits += applied[i] ? 0 : 1;
        continue;
      }
      ReplyError err(per[i].str);
      if (core_->queueing() && err.transient() && !writes_[i].request_id.empty()) {
        later.push_back(writes_[i]);
        later_error = err.what();
        continue;
      }
      if (failed++ == 0) first_failed = i;
      if (failures.size() < 500) failures += " '" + printable(writes_[i].name) + "': " + err.what() + ";";
    }
    detail::count_idempotent(answered, hits);
    if (!later.empty()) core_->enqueue(std::move(later), later_error);
    if (failed == writes_.size() && (writes_.size() == 1 || ReplyError(per[first_failed].str).transient())) {
      per[first_failed].check();
    }
    if (failed > 0) {
      throw ReplyError("ERR incr_many: " + std::to_string(failed) + " of " + std::to_string(writes_.size()) +
                       " increments failed and were not applied (the others were):" + failures);
    }
    done_with(std::move(applied));
    return {};
  }

  std::vector<Request> fail(std::exception_ptr error) override {
    try {
      std::rethrow_exception(error);
    } catch (const Error& e) {
      // Only writes that all carry request ids may be retried: the first attempt may have
      // landed, and only the id tells a retry so.
      const bool all_ids = std::all_of(writes_.begin(), writes_.end(),
                                       [](const ShardedWrite& w) { return !w.request_id.empty(); });
      if (!(core_->queueing() && all_ids && is_transient(e))) throw;
      core_->enqueue(writes_, e.what());
      done_with(std::vector<bool>(writes_.size(), true));
    }
    return {};
  }

 private:
  void done_with(std::vector<bool> applied) {
    if constexpr (std::is_same_v<T, bool>) {
      this->complete(applied.front());
    } else {
      this->complete(std::move(applied));
    }
  }

  std::shared_ptr<Core> core_;
  std::vector<ShardedWrite> writes_;
  ScriptBatch batch_;
};

std::vector<Request> gets(const std::vector<std::string>& keys) {
  std::vector<Request> batch;
  batch.reserve(keys.size());
  for (const auto& k : keys) batch.emplace_back(Command{{"GET", k}});
  return batch;
}

std::vector<std::int64_t> shard_replies(const std::vector<Reply>& replies) {
  std::vector<std::int64_t> out;
  out.reserve(replies.size());
  for (const Reply& r : replies) out.push_back(shard_reply(r));
  return out;
}

// read(): from the cache, or a fresh sum that refreshes it.
class ReadOp final : public Op<Reading> {
 public:
  ReadOp(std::shared_ptr<Core> core, std::int64_t max_staleness_ms)
      : core_(std::move(core)), max_(std::chrono::milliseconds(max_staleness_ms)) {
    with_meter(this, Meter::Read);
  }

  std::vector<Request> prepare() override {
    const auto now = SteadyClock::now();
    {
      std::lock_guard<std::mutex> lock(core_->cache_mu);
      if (core_->cached) {
        const auto age = now - core_->cached_at;
        // A refresh younger than this is still running: take the cached value meanwhile
        // (older ones are taken as lost, e.g. a cancelled coroutine).
        const bool refreshing = now - core_->refresh_started < std::max<SteadyClock::duration>(max_, std::chrono::seconds(1));
        if (age <= max_ || refreshing) {
          complete(Reading{*core_->cached, ms(age)});
          return {};
        }
      }
      core_->refresh_started = now;
    }
    sent_ = now;
    return gets(core_->shard_keys(core_->options.name));
  }

  std::vector<Request> finish(std::vector<Reply> replies) override {
    std::int64_t total;
    try {
      total = checked_sum(shard_replies(replies));
    } catch (...) {
      forget_refresh();
      throw;
    }
    {
      std::lock_guard<std::mutex> lock(core_->cache_mu);
      if (!core_->cached || core_->cached_at <= sent_) {
        core_->cached = total;
        core_->cached_at = sent_;
      }
      core_->refresh_started = {};
    }
    complete(Reading{total, ms(SteadyClock::now() - sent_)});
    return {};
  }

  std::vector<Request> fail(std::exception_ptr error) override {
    forget_refresh();
    std::rethrow_exception(error);
  }

 private:
  static std::int64_t ms(SteadyClock::duration d) {
    return std::chrono::duration_cast<std::chrono::milliseconds>(d).count();
  }
  void forget_refresh() {
    std::lock_guard<std::mutex> lock(core_->cache_mu);
    core_->refresh_started = {};
  }

  std::shared_ptr<Core> core_;
  SteadyClock::duration max_;
  SteadyClock::time_point sent_{};
};

}  // namespace

ShardedCounter::ShardedCounter(std::shared_ptr<Store> store, ShardedOptions options) : core_(std::make_shared<Core>()) {
  if (!store) throw InvalidArgument("store must not be None");
  core_->store = std::move(store);
  core_->options = std::move(options);
  ShardedOptions& o = core_->options;
  validate_name(o.prefix, "prefix");
  validate_name(o.name, "name");
  if (o.shards < 1 || o.shards > kMaxShards) {
    throw InvalidArgument("shards must be between 1 and " + std::to_string(kMaxShards) + ", got " +
                          std::to_string(o.shards));
  }
  if (o.idempotency_ttl_ms < 1 || o.idempotency_ttl_ms > kMaxIdempotencyTtlMs) {
    throw InvalidArgument("idempotency_ttl must be between 0.001 seconds and 366 days, got " +
                          std::to_string(o.idempotency_ttl_ms) + " ms");
  }
  if (o.log_maxlen < 1 || o.log_maxlen > 100'000'000) {
    throw InvalidArgument("log_maxlen must be between 1 and 100000000, got " + std::to_string(o.log_maxlen));
  }
  if (o.queue_capacity < 1) throw InvalidArgument("queue_capacity must be >= 1");
  if (o.retry_backoff_min.count() < 1 || o.retry_backoff_max < o.retry_backoff_min) {
    throw InvalidArgument("retry backoff must satisfy 1 ms <= min <= max");
  }
  if (o.max_script_batch < 1) o.max_script_batch = 1;
}

ShardedCounter::~ShardedCounter() { close(std::chrono::milliseconds(0)); }

const ShardedOptions& ShardedCounter::options() const noexcept { return core_->options; }
const std::shared_ptr<Store>& ShardedCounter::store() const noexcept { return core_->store; }

std::int64_t ShardedCounter::shard_of(std::string_view request_id) const {
  if (request_id.empty()) throw InvalidArgument("request_id must not be empty");
  validate_request_id(request_id);
  return core_->shard_for(request_id);
}

std::string ShardedCounter::key_of(std::int64_t shard, std::string_view suffix) const {
  if (shard < 0 || shard >= core_->options.shards) {
    throw InvalidArgument("shard must be between 0 and " + std::to_string(core_->options.shards - 1));
  }
  if (suffix.empty()) return sharded_value_key(core_->options.prefix, core_->options.name, shard);
  return sharded_key(core_->options.prefix, core_->options.name, shard, suffix);
}

std::shared_ptr<Op<bool>> ShardedCounter::make_incr(std::int64_t amount, std::string_view request_id) {
  std::vector<ShardedWrite> w;
  w.push_back(core_->resolve(core_->options.name, amount, request_id));
  return std::make_shared<IncrOp<bool>>(core_, std::move(w));
}

std::shared_ptr<Op<bool>> ShardedCounter::make_adjust(std::int64_t amount, std::string_view reason,
                                                      std::string_view request_id) {
  if (reason.empty()) throw InvalidArgument("reason must not be empty: an adjustment says why it was made");
  if (reason.size() > kMaxAdjustReason) {
    throw InvalidArgument("reason must be at most " + std::to_string(kMaxAdjustReason) + " bytes, got " +
                          std::to_string(reason.size()));
  }
  std::vector<ShardedWrite> w;
  w.push_back(core_->resolve(core_->options.name, amount, request_id));
  w.back().reason = std::string(reason);
  return std::make_shared<IncrOp<bool>>(core_, std::move(w));
}

bool ShardedCounter::adjust(std::int64_t amount, std::string_view reason, std::string_view request_id) {
  return run(*core_->store, *make_adjust(amount, reason, request_id));
}

std::shared_ptr<Op<std::vector<bool>>> ShardedCounter::make_incr_many(const std::vector<ShardedIncrement>& items) {
  std::vector<ShardedWrite> w;
  w.reserve(items.size());
  for (const auto& it : items) {
    validate_name(it.name, "name");
    w.push_back(core_->resolve(it.name, it.amount, it.request_id));
  }
  return std::make_shared<IncrOp<std::vector<bool>>>(core_, std::move(w));
}

std::shared_ptr<Op<std::vector<std::int64_t>>> ShardedCounter::make_shard_values() {
  return make_batch_op<std::vector<std::int64_t>>(gets(core_->shard_keys(core_->options.name)),
                                                  [](std::vector<Reply>&& r) { return shard_replies(r); });
}

std::shared_ptr<Op<std::int64_t>> ShardedCounter::make_value() {
  return with_meter(make_batch_op<std::int64_t>(gets(core_->shard_keys(core_->options.name)),
                                     [](std::vector<Reply>&& r) { return checked_sum(shard_replies(r)); }), Meter::Read);
}

std::shared_ptr<Op<std::vector<std::int64_t>>> ShardedCounter::make_values(const std::vector<std::string>& names) {
  std::vector<std::string> keys;
  keys.reserve(names.size() * static_cast<std::size_t>(core_->options.shards));
  for (const auto& n : names) {
    validate_name(n, "name");
    for (auto& k : core_->shard_keys(n)) keys.push_back(std::move(k));
  }
  const auto shards = static_cast<std::size_t>(core_->options.shards);
  return make_batch_op<std::vector<std::int64_t>>(gets(keys), [shards](std::vector<Reply>&& r) {
    const std::vector<std::int64_t> all = shard_replies(r);
    std::vector<std::int64_t> out;
    for (std::size_t i = 0; i < all.size(); i += shards) {
      out.push_back(checked_sum(std::vector<std::int64_t>(all.begin() + static_cast<std::ptrdiff_t>(i),
                                                          all.begin() + static_cast<std::ptrdiff_t>(i + shards))));
    }
    return out;
  });
}

std::shared_ptr<Op<Reading>> ShardedCounter::make_read(std::int64_t max_staleness_ms) {
  if (max_staleness_ms < 0) throw InvalidArgument("max_staleness must be >= 0 seconds");
  return std::make_shared<ReadOp>(core_, max_staleness_ms);
}

bool ShardedCounter::incr(std::int64_t amount, std::string_view request_id) {
  std::vector<ShardedWrite> w;
  w.push_back(core_->resolve(core_->options.name, amount, request_id));
  IncrOp<bool> op(core_, std::move(w));
  return run(*core_->store, op);
}

std::vector<bool> ShardedCounter::incr_many(const std::vector<ShardedIncrement>& items) {
  return run(*core_->store, *make_incr_many(items));
}

std::int64_t ShardedCounter::value() { return run(*core_->store, *make_value()); }
std::vector<std::int64_t> ShardedCounter::shard_values() { return run(*core_->store, *make_shard_values()); }
std::vector<std::int64_t> ShardedCounter::values(const std::vector<std::string>& names) {
  return run(*core_->store, *make_values(names));
}
Reading ShardedCounter::read(std::int64_t max_staleness_ms) { return run(*core_->store, *make_read(max_staleness_ms)); }

// ---- retry queue ------------------------------------------------------------------------

void ShardedCounter::Core::enqueue(std::vector<ShardedWrite> writes, const std::string& error) {
  std::lock_guard<std::mutex> lock(mu);
  stats.last_error = error;
  if (closed || stopping) throw Error("this counter is closed; the increment was not applied: " + error);
  if (queue.size() + in_flight + writes.size() > options.queue_capacity) {
    stats.overflowed += writes.size();
    throw RetryQueueFull("retry queue is full (capacity " + std::to_string(options.queue_capacity) +
                         "): " + std::to_string(writes.size()) +
                         " increment(s) were not queued; the store keeps failing with: " + error);
  }
  const auto now = SteadyClock::now();
  for (auto& w : writes) {
    ++stats.queued;
    queue.push_back(Queued{std::move(w), now + jittered(options.retry_backoff_min), now, options.retry_backoff_min});
  }
  if (!retry_thread.joinable()) retry_thread = std::thread([this] { retry_loop(); });
  cv.notify_all();
}

void ShardedCounter::Core::retry_loop() { detail::run_retry_loop(*this); }

void ShardedCounter::Core::retry_due_once(bool everything) {
  std::vector<Queued> batch;
  {
    std::lock_guard<std::mutex> lock(mu);
    batch = detail::take_due(queue, everything, SteadyClock::now());
    in_flight += batch.size();
  }
  if (batch.empty()) return;
  // A write first tried longer ago than its id lives may have landed and had its id
  // expire since: a retry could then count it twice, so it is dropped (and counted).
  const auto now = SteadyClock::now();
  const auto id_life = std::chrono::milliseconds(options.idempotency_ttl_ms);
  std::vector<Queued> live;
  std::uint64_t dropped = 0;
  for (auto& q : batch) {
    if (now - q.first_tried >= id_life) {
      ++dropped;
    } else {
      live.push_back(std::move(q));
    }
  }
  std::vector<Queued> again;
  std::uint64_t delivered = 0, failed = 0;
  std::string last_error;
  if (!live.empty()) {
    std::vector<ShardedWrite> writes;
    for (const auto& q : live) writes.push_back(q.write);
    try {
      const ScriptBatch b = build_calls(*store, options, writes);
      std::vector<Reply> replies = store->execute(b.requests);
      std::vector<Reply> per = split_replies(replies, b, writes.size());
      for (std::size_t i = 0; i < live.size(); ++i) {
        if (!per[i].is_error()) {
          ++delivered;  // applied now, or found already applied by the ambiguous first attempt
        } else if (ReplyError(per[i].str).transient()) {
          last_error = per[i].str;
          again.push_back(std::move(live[i]));
        } else {
          ++failed;
          last_error = per[i].str;
        }
      }
    } catch (const Error& e) {
      last_error = e.what();
      if (is_transient(e)) {
        again = std::move(live);
      } else {
        failed += live.size();
      }
    }
  }
  std::lock_guard<std::mutex> lock(mu);
  const auto later = SteadyClock::now();
  for (auto& q : again) {
    q.backoff = std::min(q.backoff * 2, options.retry_backoff_max);
    q.due = later + jittered(q.backoff);
    queue.push_back(std::move(q));
  }
  in_flight -= batch.size();
  stats.retried += batch.size() - dropped;
  stats.dropped += dropped;
  stats.delivered += delivered;
  stats.failed += failed;
  if (!last_error.empty()) stats.last_error = last_error;
  drained.notify_all();
}

std::size_t ShardedCounter::Core::flush(std::optional<std::chrono::milliseconds> timeout) {
  std::unique_lock<std::mutex> lock(mu);
  if (queue.empty() && in_flight == 0) return 0;
  flush_now = true;
  cv.notify_all();
  auto done = [this] { return queue.empty() && in_flight == 0; };
  if (timeout) {
    drained.wait_for(lock, *timeout, done);
  } else {
    drained.wait(lock, done);
  }
  return queue.size() + in_flight;
}

std::size_t ShardedCounter::flush(std::optional<std::chrono::milliseconds> timeout) { return core_->flush(timeout); }

std::size_t ShardedCounter::pending() const {
  std::lock_guard<std::mutex> lock(core_->mu);
  return core_->queue.size() + core_->in_flight;
}

RetryStats ShardedCounter::stats() const {
  std::lock_guard<std::mutex> lock(core_->mu);
  RetryStats s = core_->stats;
  s.pending = core_->queue.size() + core_->in_flight;
  return s;
}

std::size_t ShardedCounter::close(std::optional<std::chrono::milliseconds> timeout) {
  Core& c = *core_;
  std::size_t left = c.flush(timeout);
  {
    std::lock_guard<std::mutex> lock(c.mu);
    if (c.closed) return left;
    c.stopping = true;
    c.closed = true;
  }
  c.cv.notify_all();
  if (c.retry_thread.joinable()) c.retry_thread.join();
  std::lock_guard<std::mutex> lock(c.mu);
  // Never sent: counted as failed, never silently.
  c.stats.failed += c.queue.size();
  left = c.queue.size();
  c.queue.clear();
  return left;
}

}  // namespace redcount
