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

// How many times one write may meet a claim of a newer layout (sharded_incr.lua's -1) and
// go round again: each time it reads the layout first, so a second meeting needs a second
// reshard in between.
constexpr int kMaxClaimRounds = 4;

// The rounds of one set of writes, for IncrOp and RetryOp:
//   1. the layouts read first when stale (older than kLayoutRefreshMs, or never read),
//      except those read in the background instead (Core::take_read_behind);
//   2. the claim step (sharded_claim.lua), only when some write with a request id has an
//      older generation's shard in another store shard than its own (Redis Cluster or a
//      ring, for idempotency_ttl + kLayoutGraceMs after a reshard): one call per slot, all
//      in one batch; an id found applied there makes its write a duplicate, not sent;
//   3. the script calls (sharded_incr.lua). Writes answered -1 (their shard is a retired
//      one that a writer on a newer layout claimed the id in) go round again from step 1,
//      with their layout read afresh.
// The claim and the write are two round trips, not one atomic step: exactly once holds
// because each step leaves what the other checks (see sharded_claim.lua), so a crash
// between them only leaves a claim, which the retry of the id claims again.
class WriteRounds {
 public:
  WriteRounds(std::shared_ptr<Core> core, std::vector<ShardedWrite> writes, std::int64_t now_ms)
      : core_(std::move(core)), writes_(std::move(writes)), now_ms_(now_ms), replies_(writes_.size()) {
    active_.reserve(writes_.size());
    for (std::size_t i = 0; i < writes_.size(); ++i) active_.push_back(i);
  }

  const std::vector<ShardedWrite>& writes() const noexcept { return writes_; }
  // Per write, once step() returned no requests: 1 applied, 0 a duplicate, or an error reply.
  std::vector<Reply>& replies() noexcept { return replies_; }

  std::vector<Request> start() { return begin(false); }

  // The next round's requests for `replies` to this round's; none when every write has its reply.
  std::vector<Request> step(std::vector<Reply> replies) {
    switch (phase_) {
      case Phase::Layout: {
        if (replies.size() != names_.size()) throw ProtocolError("sharded layout: reply count mismatch");
        for (std::size_t i = 0; i < names_.size(); ++i) core_->learn(names_[i], layout_text(replies[i]), sent_);
        names_.clear();
        return route_and_claim();
      }
      case Phase::Claim: return after_claims(replies);
      case Phase::Write: return after_writes(replies);
    }
    return {};
  }

 private:
  enum class Phase { Layout, Claim, Write };

  // A pass over the active writes: their layouts read first when stale (or `force`d).
  std::vector<Request> begin(bool force) {
    routed_.clear();
    for (std::size_t i : active_) routed_.push_back(writes_[i]);
    if (force) {
      names_.clear();
      for (const auto& w : routed_) {
        if (std::find(names_.begin(), names_.end(), w.name) == names_.end()) names_.push_back(w.name);
      }
    } else {
      names_ = core_->stale_names(routed_);
      if (!names_.empty()) {
        std::vector<std::string> behind = core_->take_read_behind(names_);
        if (!behind.empty()) Core::read_behind(core_, std::move(behind));
      }
    }
    if (!names_.empty()) {
      phase_ = Phase::Layout;
      sent_ = SteadyClock::now();
      return core_->layout_gets(names_);
    }
    return route_and_claim();
  }

  std::vector<Request> route_and_claim() {
    core_->route_all(routed_, now_ms_);
    const Store& store = *core_->store;
    std::map<std::uint32_t, std::size_t> call_of;  // store shard -> index into claims
    std::vector<Request> claims;
    claim_members_.clear();
    const std::string ttl = std::to_string(core_->options.idempotency_ttl_ms);
    for (std::size_t r = 0; r < routed_.size(); ++r) {
      for (auto& key : routed_[r].claim_keys) {
        const std::uint32_t shard = store.shard_of(key);
        auto [it, added] = call_of.try_emplace(shard, claims.size());
        if (added) {
          claims.emplace_back(ScriptCall{&kShardedClaimScript, {}, {ttl}});
          claim_members_.emplace_back();
        }
        std::get<ScriptCall>(claims[it->second]).keys.push_back(std::move(key));
        claim_members_[it->second].push_back(r);
      }
      routed_[r].claim_keys.clear();
    }
    if (!claims.empty()) {
      phase_ = Phase::Claim;
      return claims;
    }
    std::vector<std::size_t> all(routed_.size());
    for (std::size_t r = 0; r < all.size(); ++r) all[r] = r;
    return write_calls(std::move(all));
  }

  std::vector<Request> after_claims(std::vector<Reply>& replies) {
    if (replies.size() != claim_members_.size()) throw ProtocolError("sharded_claim: reply count mismatch");
    std::vector<char> applied(routed_.size(), 0);
    std::vector<const Reply*> failed(routed_.size(), nullptr);
    for (std::size_t c = 0; c < replies.size(); ++c) {
      const Reply& rep = replies[c];
      const auto& members = claim_members_[c];
      if (rep.type == Reply::Type::Array && rep.elements.size() == members.size()) {
        for (std::size_t k = 0; k < members.size(); ++k) {
          if (rep.elements[k].is_error()) {
            failed[members[k]] = &rep.elements[k];
          } else if (rep.elements[k].as_integer() == 1) {
            applied[members[k]] = 1;
          }
        }
      } else if (rep.is_error()) {
        for (std::size_t r : members) failed[r] = &rep;
      } else {
        throw ProtocolError("sharded_claim returned an unexpected reply");
      }
    }
    std::vector<std::size_t> send;
    for (std::size_t r = 0; r < routed_.size(); ++r) {
      if (applied[r]) {
        replies_[active_[r]] = Reply::of_integer(0);  // applied in an older generation: a duplicate
      } else if (failed[r] != nullptr) {
        replies_[active_[r]] = *failed[r];  // not written: nothing of it is stored
      } else {
        send.push_back(r);
      }
    }
    return write_calls(std::move(send));
  }

  // The script calls of the routed writes at `which` (indices into routed_).
  std::vector<Request> write_calls(std::vector<std::size_t> which) {
    phase_ = Phase::Write;
    in_call_ = std::move(which);
    std::vector<ShardedWrite> sending;
    sending.reserve(in_call_.size());
    for (std::size_t r : in_call_) sending.push_back(std::move(routed_[r]));
    batch_ = build_calls(*core_->store, core_->options, sending);
    return std::move(batch_.requests);
  }

  std::vector<Request> after_writes(std::vector<Reply>& replies) {
    std::vector<Reply> per = split_replies(replies, batch_, in_call_.size());
    std::vector<std::size_t> again;
    for (std::size_t k = 0; k < per.size(); ++k) {
      const std::size_t i = active_[in_call_[k]];
      if (per[k].type == Reply::Type::Integer && per[k].integer == -1) {
        again.push_back(i);
      } else {
        replies_[i] = std::move(per[k]);
      }
    }
    if (again.empty()) return {};
    if (++rounds_ >= kMaxClaimRounds) {
      for (std::size_t i : again) {
        replies_[i] = Reply::of_error(
            "ERR sharded write: the request id's shard was claimed by writers on a newer layout " +
            std::to_string(kMaxClaimRounds) + " times in a row (the layout keeps changing); not applied");
      }
      return {};
    }
    active_ = std::move(again);
    return begin(true);
  }

  std::shared_ptr<Core> core_;
  std::vector<ShardedWrite> writes_;
  std::int64_t now_ms_ = 0;  // the store's clock when the operation was made (routing)
  std::vector<Reply> replies_;
  Phase phase_ = Phase::Layout;
  int rounds_ = 0;
  std::vector<std::size_t> active_;                      // this pass's writes (indices into writes_)
  std::vector<ShardedWrite> routed_;                     // their copies, routed for this pass
  std::vector<std::string> names_;                       // the layouts being read
  SteadyClock::time_point sent_{};                       // when they were asked for
  std::vector<std::vector<std::size_t>> claim_members_;  // per claim call, per key: its write (routed_ index)
  std::vector<std::size_t> in_call_;                     // the routed_ indices of the writes sent
  ScriptBatch batch_;
};

// Writes as the caller sees them: true/false per write, queued writes (OnError::Queue,
// request id, transient failure) reported as true.
template <class T>
class IncrOp final : public Op<T> {
 public:
  IncrOp(std::shared_ptr<Core> core, std::vector<ShardedWrite> writes)
      : core_(core), rounds_(core, std::move(writes), core->store->now_ms()) {
    with_meter(this, Meter::Write, rounds_.writes().size());
  }

  std::vector<Request> prepare() override {
    core_->check_open();
    if (rounds_.writes().empty()) {
      done_with({});
      return {};
    }
    return rounds_.start();
  }

  std::vector<Request> finish(std::vector<Reply> replies) override {
    std::vector<Request> next = rounds_.step(std::move(replies));
    if (!next.empty()) return next;
    const std::vector<ShardedWrite>& writes = rounds_.writes();
    std::vector<Reply>& per = rounds_.replies();
    std::vector<bool> applied(writes.size(), true);
    std::vector<ShardedWrite> later;
    std::string later_error, failures;
    std::size_t failed = 0, first_failed = 0, answered = 0, hits = 0;  // answered/hits: metrics
    for (std::size_t i = 0; i < per.size(); ++i) {
      if (!per[i].is_error()) {
        applied[i] = per[i].as_integer() == 1;
        if (!writes[i].request_id.empty()) ++answered, hits += applied[i] ? 0 : 1;
        continue;
      }
      ReplyError err(per[i].str);
      if (core_->queueing() && err.transient() && !writes[i].request_id.empty()) {
        later.push_back(writes[i]);
        later_error = err.what();
        continue;
      }
      if (failed++ == 0) first_failed = i;
      if (failures.size() < 500) failures += " '" + printable(writes[i].name) + "': " + err.what() + ";";
    }
    detail::count_idempotent(answered, hits);
    if (!later.empty()) core_->enqueue(std::move(later), later_error);
    if (failed == writes.size() && (writes.size() == 1 || ReplyError(per[first_failed].str).transient())) {
      per[first_failed].check();
    }
    if (failed > 0) {
      throw ReplyError("ERR incr_many: " + std::to_string(failed) + " of " + std::to_string(writes.size()) +
                       " increments failed and were not applied (the others were):" + failures);
    }
    done_with(std::move(applied));
    return {};
  }

  std::vector<Request> fail(std::exception_ptr error) override {
    const std::vector<ShardedWrite>& writes = rounds_.writes();
    try {
      std::rethrow_exception(error);
    } catch (const Error& e) {
      // Only writes that all carry request ids may be retried: the first attempt may have
      // landed (or only its claim step), and only the id tells a retry so.
      const bool all_ids = std::all_of(writes.begin(), writes.end(),
                                       [](const ShardedWrite& w) { return !w.request_id.empty(); });
      if (!(core_->queueing() && all_ids && is_transient(e))) throw;
      core_->enqueue(writes, e.what());
      done_with(std::vector<bool>(writes.size(), true));
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
  WriteRounds rounds_;
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
      : rounds_(core, fresh(*core, entries), core->store->now_ms()) {}

  std::vector<Request> prepare() override { return rounds_.start(); }

  std::vector<Request> finish(std::vector<Reply> replies) override {
    std::vector<Request> next = rounds_.step(std::move(replies));
    if (!next.empty()) return next;
    std::vector<Reply>& per = rounds_.replies();
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
  // The entries still within their id's lifetime (the others are dropped).
  std::vector<ShardedWrite> fresh(const Core& core, const std::vector<const RetryQueue::Entry*>& entries) {
    const auto now = SteadyClock::now();
    const auto id_life = std::chrono::milliseconds(core.options.idempotency_ttl_ms);
    std::vector<ShardedWrite> writes;
    outcomes.reserve(entries.size());
    for (std::size_t i = 0; i < entries.size(); ++i) {
      const auto& q = *static_cast<const QueuedWrite*>(entries[i]);
      if (now - q.first_tried >= id_life) {
        outcomes.push_back(RetryQueue::Outcome::Dropped);
      } else {
        outcomes.push_back(RetryQueue::Outcome::Sent);
        writes.push_back(q.write);
        index_.push_back(i);
      }
    }
    return writes;
  }

  std::vector<std::size_t> index_;  // the entry index of each write sent (declared before rounds_)
  WriteRounds rounds_;
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
