#include "sharded/sharded_core.h"

namespace redcount {
namespace {

using Core = ShardedCounter::Core;
using sharded_detail::layout_text;

// The script calls of a set of writes: grouped by the store's shard of each value key
// (a Cluster slot; one group on a single server), max_script_batch writes per call.
struct ScriptBatch {
  std::vector<Request> requests;
  std::vector<std::vector<std::size_t>> members;  // per call, the writes it carries
};

// The writes' keys are moved into the calls (a retry routes its writes again).
ScriptBatch build_calls(const Store& store, const ShardedOptions& o, std::vector<ShardedWrite>& writes) {
  std::map<std::uint32_t, std::vector<std::size_t>> groups;
  for (std::size_t i = 0; i < writes.size(); ++i) groups[store.shard_of(writes[i].value_key)].push_back(i);
  ScriptBatch out;
  const std::string ttl = std::to_string(o.idempotency_ttl_ms), maxlen = std::to_string(o.log_maxlen);
  for (const auto& [slot, idx] : groups) {
    for (std::size_t start = 0; start < idx.size(); start += o.max_script_batch) {
      const std::size_t end = std::min(idx.size(), start + o.max_script_batch);
      ScriptCall call{&kShardedIncrScript, {}, {}};
      // Two arguments per write unless one of them needs the extra-id count or a reason.
      const bool wide = std::any_of(idx.begin() + static_cast<std::ptrdiff_t>(start),
                                    idx.begin() + static_cast<std::ptrdiff_t>(end), [&](std::size_t i) {
                                      return !writes[i].reason.empty() || !writes[i].older_rid_keys.empty();
                                    });
      call.args.reserve(4 + (wide ? 4 : 2) * (end - start));
      call.args.push_back(std::to_string(end - start));
      call.args.push_back(ttl);
      call.args.push_back(maxlen);
      call.args.push_back(wide ? "4" : "2");
      call.keys.reserve(3 * (end - start));
      std::vector<std::size_t> group;
      for (std::size_t g = start; g < end; ++g) {
        ShardedWrite& w = writes[idx[g]];
        const std::size_t older = w.older_rid_keys.size();
        call.keys.push_back(std::move(w.value_key));
        call.keys.push_back(std::move(w.log_key));
        const bool has_id = !w.rid_key.empty();
        if (has_id) {
          call.keys.push_back(std::move(w.rid_key));
          for (auto& k : w.older_rid_keys) call.keys.push_back(std::move(k));
        }
        call.args.push_back(std::to_string(w.amount));
        call.args.push_back(w.request_id);
        if (wide) {
          call.args.push_back(std::to_string(has_id ? older : 0));
          call.args.push_back(w.reason);
        }
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
      : core_(std::move(core)), writes_(std::move(writes)), now_ms_(core_->store->now_ms()) {
    with_meter(this, Meter::Write, writes_.size());
  }

  std::vector<Request> prepare() override {
    core_->check_open();
    if (writes_.empty()) {
      done_with({});
      return {};
    }
    // A layout older than kLayoutRefreshMs is read again first: a writer that has not
    // looked for long must not write a generation retired longer ago than the id window.
    stale_ = core_->stale_names(writes_);
    if (!stale_.empty()) {
      sent_ = SteadyClock::now();
      return core_->layout_gets(stale_);
    }
    return calls();
  }

  std::vector<Request> finish(std::vector<Reply> replies) override {
    if (!stale_.empty()) {
      if (replies.size() != stale_.size()) throw ProtocolError("sharded layout: reply count mismatch");
      for (std::size_t i = 0; i < stale_.size(); ++i) core_->learn(stale_[i], layout_text(replies[i]), sent_);
      stale_.clear();
      return calls();
    }
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

  std::vector<Request> calls() {
    core_->route_all(writes_, now_ms_);
    batch_ = build_calls(*core_->store, core_->options, writes_);
    return std::move(batch_.requests);
  }

  std::shared_ptr<Core> core_;
  std::vector<ShardedWrite> writes_;
  std::int64_t now_ms_ = 0;  // the store's clock when the operation was made (routing)
  ScriptBatch batch_;
  std::vector<std::string> stale_;  // names whose layout is being read (the first step)
  SteadyClock::time_point sent_{};
};

// What the retry queue holds: a write with a request id, and when it was first tried.
struct QueuedWrite final : RetryQueue::Entry {
  QueuedWrite(ShardedWrite w, SteadyClock::time_point first) : write(std::move(w)), first_tried(first) {}
  ShardedWrite write;
  SteadyClock::time_point first_tried;
};

// One retry attempt: the writes routed afresh (a retry after a reshard goes to the current
// generation, and checks the id where the first attempt may have gone), with the layout
// read first when stale, as a first attempt is. A write first tried longer ago than its
// id lives may have landed and had its id expire since: a retry could then count it
// twice, so it is dropped (and counted).
class RetryOp final : public RetryQueue::Attempt {
 public:
  RetryOp(std::shared_ptr<Core> core, const std::vector<const RetryQueue::Entry*>& entries)
      : core_(std::move(core)), now_ms_(core_->store->now_ms()) {
    const auto now = SteadyClock::now();
    const auto id_life = std::chrono::milliseconds(core_->options.idempotency_ttl_ms);
    outcomes.reserve(entries.size());
    for (std::size_t i = 0; i < entries.size(); ++i) {
      const auto& q = *static_cast<const QueuedWrite*>(entries[i]);
      if (now - q.first_tried >= id_life) {
        outcomes.push_back(RetryQueue::Outcome::Dropped);
      } else {
        outcomes.push_back(RetryQueue::Outcome::Sent);
        writes_.push_back(q.write);
        index_.push_back(i);
      }
    }
  }

  std::vector<Request> prepare() override {
    stale_ = core_->stale_names(writes_);
    if (!stale_.empty()) {
      sent_ = SteadyClock::now();
      return core_->layout_gets(stale_);
    }
    return calls();
  }

  std::vector<Request> finish(std::vector<Reply> replies) override {
    if (!stale_.empty()) {
      if (replies.size() != stale_.size()) throw ProtocolError("sharded layout: reply count mismatch");
      for (std::size_t i = 0; i < stale_.size(); ++i) core_->learn(stale_[i], layout_text(replies[i]), sent_);
      stale_.clear();
      return calls();
    }
    std::vector<Reply> per = split_replies(replies, batch_, writes_.size());
    for (std::size_t k = 0; k < per.size(); ++k) {
      RetryQueue::Outcome& o = outcomes[index_[k]];
      if (!per[k].is_error()) {
        o = RetryQueue::Outcome::Delivered;  // applied now, or found applied by the ambiguous first attempt
      } else {
        last_error = per[k].str;
        o = ReplyError(per[k].str).transient() ? RetryQueue::Outcome::Again : RetryQueue::Outcome::Failed;
      }
    }
    return {};
  }

 private:
  std::vector<Request> calls() {
    core_->route_all(writes_, now_ms_);
    batch_ = build_calls(*core_->store, core_->options, writes_);
    return std::move(batch_.requests);
  }

  std::shared_ptr<Core> core_;
  std::int64_t now_ms_ = 0;  // the store's clock when the attempt was made (routing)
  std::vector<ShardedWrite> writes_;
  std::vector<std::size_t> index_;  // the entry index of each write sent
  ScriptBatch batch_;
  std::vector<std::string> stale_;
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
  if (o.max_script_batch < 1) o.max_script_batch = 1;
  // The queue's attempts see the Core weakly: the queue belongs to the Core.
  core_->retry = RetryQueue::create(
      core_->store, RetryQueueOptions{o.queue_capacity, o.retry_backoff_min, o.retry_backoff_max},
      [weak = std::weak_ptr<Core>(core_)](const std::vector<const RetryQueue::Entry*>& entries)
          -> std::shared_ptr<RetryQueue::Attempt> {
        std::shared_ptr<Core> core = weak.lock();
        if (!core) throw Error("the counter is gone");
        return std::make_shared<RetryOp>(std::move(core), entries);
      });
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
  if (shard < 0 || shard >= kMaxShards) {
    throw InvalidArgument("shard must be between 0 and " + std::to_string(kMaxShards - 1) + ", got " +
                          std::to_string(shard));
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











bool ShardedCounter::incr(std::int64_t amount, std::string_view request_id) {
  std::vector<ShardedWrite> w;
  w.push_back(core_->resolve(core_->options.name, amount, request_id));
  IncrOp<bool> op(core_, std::move(w));
  return run(*core_->store, op);
}

std::vector<bool> ShardedCounter::incr_many(const std::vector<ShardedIncrement>& items) {
  return run(*core_->store, *make_incr_many(items));
}


// ---- retry queue ------------------------------------------------------------------------

void ShardedCounter::Core::enqueue(std::vector<ShardedWrite> writes, const std::string& error) {
  const auto now = SteadyClock::now();
  std::vector<std::unique_ptr<RetryQueue::Entry>> entries;
  entries.reserve(writes.size());
  for (auto& w : writes) entries.push_back(std::make_unique<QueuedWrite>(std::move(w), now));
  retry->enqueue(std::move(entries), error);
}

std::size_t ShardedCounter::flush(std::optional<std::chrono::milliseconds> timeout) {
  return core_->retry->flush(timeout);
}
std::size_t ShardedCounter::pending() const { return core_->retry->pending(); }
RetryStats ShardedCounter::stats() const { return core_->retry->stats(); }
std::size_t ShardedCounter::close(std::optional<std::chrono::milliseconds> timeout) {
  return core_->retry->close(timeout);
}

}  // namespace redcount
