#include "redcount/counters/fixed_window.h"

#include <algorithm>
#include <map>
#include <span>
#include <type_traits>

#include "redcount/common/errors.h"
#include "redcount/common/util.h"
#include "limiters/limiter_internal.h"

namespace redcount {
namespace {

}  // namespace


std::int64_t count_from_reply(const Reply& r) {
  r.check();
  if (r.is_nil()) return 0;
  if (r.type == Reply::Type::String && !parse_int64(r.str)) {
    // A valid reply: the key holds a foreign value, which is no count. The same error
    // (and class) as an increment of it.
    throw ReplyError("ERR value is not an integer or out of range (the counter's key holds a foreign value)");
  }
  return r.as_integer();
}

struct FixedWindowCounter::Core {
  std::shared_ptr<Store> store;
  FixedWindowOptions options;
  WindowSpec spec;
  std::shared_ptr<RetryQueue> retry;  // also what close() closes (with on_error="raise" it stays empty)

  bool queueing() const noexcept { return options.on_error == FixedWindowOptions::OnError::Queue; }
  void check_open() const {
    if (retry->closed()) throw Error("this counter is closed; create a new FixedWindowCounter");
  }
  // Whether a batch without request ids may go as MULTI/INCRBY/PEXPIREAT LT/EXEC rather
  // than as script calls: read when the operation is made, so its steps read no store state.
  bool transaction_ok() const { return store->has_expire_options() && !store->contended(); }
  WindowedIncrement resolve(std::string_view key, std::int64_t amount, std::string_view request_id,
                            std::int64_t now) const;
  void enqueue(std::vector<WindowedIncrement> items, const std::string& error);
};

namespace {

using Core = FixedWindowCounter::Core;

// Sends increments and answers one reply per item (a count, or the item's error reply).
// Script mode: one script call per max_script_batch items sharing a deadline and a shard.
// Commands mode: SET NX PXAT + INCRBY + PTTL per item, then a PEXPIREAT follow-up batch
// for the items whose deadline is missing; if that repair fails transiently under
// OnError::Queue, TTL repairs (amount 0) go to the retry queue, since the increments
// themselves landed and must never be counted again.
class SendOp final : public Op<std::vector<Reply>> {
 public:
  SendOp(Core& core, std::vector<WindowedIncrement> items, bool transaction_ok)
      : core_(core), items_(std::move(items)), transaction_ok_(transaction_ok) {}

  const std::vector<WindowedIncrement>& items() const noexcept { return items_; }

  std::vector<Request> prepare() override {
    if (core_.options.mode == FixedWindowOptions::Mode::Commands) return commands();
    const bool ids = std::any_of(items_.begin(), items_.end(),
                                 [](const WindowedIncrement& w) { return !w.request_id_key.empty(); });
    // The transaction costs the server less and the client more (about 8,700 more client
    // instructions per increment: four commands and five replies against one of each).
    // Alone, or pipelined with other calls (coroutines, threads sharing a socket), the
    // server's time counts most; threads each on a socket of their own spend the client's
    // CPU first (measured: 8 threads 54-59k/s with the transaction, 57-65k/s with the
    // script, as before the engine). Both forms count and hold TTLs alike.
    return !ids && transaction_ok_ ? transaction() : scripts();
  }

  std::vector<Request> finish(std::vector<Reply> replies) override {
    switch (step_) {
      case Step::Scripts: complete(scripts_done(replies)); return {};
      case Step::Transaction: return transaction_done(replies);
      case Step::Commands: return commands_done(replies);
      case Step::Repair:
        try {
          for (const Reply& rr : replies) rr.check();
        } catch (const Error& e) {
          repair_failed(e);
        }
        complete(std::move(out_));
        return {};
    }
    return {};
  }

  std::vector<Request> fail(std::exception_ptr error) override {
    if (step_ != Step::Repair) std::rethrow_exception(error);
    try {
      std::rethrow_exception(error);
    } catch (const Error& e) {
      repair_failed(e);
    }
    complete(std::move(out_));
    return {};
  }

 private:
  enum class Step { Scripts, Transaction, Commands, Repair };

  std::vector<Request> scripts() {
    step_ = Step::Scripts;
    std::vector<Request> batch;
    if (items_.size() == 1) {  // incr(): one call, nothing to group
      const std::size_t only = 0;
      batch.push_back(script_call(&only, 1, items_[0].expire_at_ms));
      return batch;
    }
    // The calls go in one pipeline, so the server runs the first while later ones are
    // still being sent.
    std::map<std::pair<std::int64_t, std::uint32_t>, std::vector<std::size_t>> by_deadline;
    for (std::size_t i = 0; i < items_.size(); ++i) {
      by_deadline[{items_[i].expire_at_ms, core_.store->shard_of(items_[i].storage_key)}].push_back(i);
    }
    const std::size_t per_call = core_.options.max_script_batch;
    for (const auto& [group_key, indexes] : by_deadline) {
      const std::int64_t deadline = group_key.first;
      for (std::size_t start = 0; start < indexes.size(); start += per_call) {
        const std::size_t end = std::min(indexes.size(), start + per_call);
        batch.push_back(script_call(indexes.data() + start, end - start, deadline));
      }
    }
    return batch;
  }

  // One fixed_window_incr call for the items at `idx[0..n)`, recorded as the next group
  // of members_. Its arguments are typed (a memory store reads them as they are; Redis gets
  // them rendered as the script's ARGV).
  ScriptCall script_call(const std::size_t* idx, std::size_t n, std::int64_t deadline) {
    auto args = std::make_shared<IncrArgs>();
    args->deadline = deadline;
    ScriptCall call{&kFixedWindowIncrScript, {}, {}};
    std::size_t ids = 0;
    for (std::size_t g = 0; g < n; ++g) ids += items_[idx[g]].request_id_key.empty() ? 0 : 1;
    call.keys.reserve(n + ids);
    for (std::size_t g = 0; g < n; ++g) {
      call.keys.push_back(items_[idx[g]].storage_key);
      args->amounts.push_back(items_[idx[g]].amount);
      members_.push_back(idx[g]);
    }
    for (std::size_t g = 0; g < n && ids > 0; ++g) {
      if (items_[idx[g]].request_id_key.empty()) continue;
      call.keys.push_back(items_[idx[g]].request_id_key);
      args->rid_items.push_back(static_cast<std::int64_t>(g + 1));
    }
    group_end_.push_back(members_.size());
    sent_.push_back(args);
    call.typed = std::move(args);
    return call;
  }

  // The item indexes of call `c`.
  std::span<const std::size_t> group(std::size_t c) const {
    const std::size_t begin = c == 0 ? 0 : group_end_[c - 1];
    return {members_.data() + begin, group_end_[c] - begin};
  }

  std::vector<Reply> scripts_done(std::vector<Reply>& replies) {
    if (replies.size() != group_end_.size()) throw ProtocolError("fixed_window_incr: reply count mismatch");
    // A typed twin's answer, or the script's array reply: the per-item replies of call c.
    auto items_of = [&](std::size_t c) -> Reply* {
      Reply& r = replies[c];
      if (r.type == Reply::Type::Status && r.str == kAnsweredInPlace && sent_[c]->answered) {
        return sent_[c]->replies.size() == group(c).size() ? sent_[c]->replies.data() : nullptr;
      }
      if (r.type == Reply::Type::Array && r.elements.size() == group(c).size()) return r.elements.data();
      return nullptr;
    };
    if (items_.size() == 1 && replies.size() == 1) {  // incr(): the replies vector serves as the result
      if (Reply* item = items_of(0)) {
        Reply only = std::move(*item);
        replies[0] = std::move(only);
      } else if (!replies[0].is_error()) {
        throw ProtocolError("fixed_window_incr returned an unexpected reply");
      }
      return std::move(replies);
    }
    std::vector<Reply> out(items_.size());
    for (std::size_t c = 0; c < replies.size(); ++c) {
      const auto members = group(c);
      if (Reply* item = items_of(c)) {
        for (std::size_t g = 0; g < members.size(); ++g) out[members[g]] = std::move(item[g]);
      } else if (replies[c].is_error()) {
        for (std::size_t g : members) out[g] = replies[c];  // the whole call failed
      } else {
        throw ProtocolError("fixed_window_incr returned an unexpected reply");
      }
    }
    return out;
  }

  // Redis >= 7.0 without request ids: MULTI, then per item INCRBY key amount and
  // PEXPIREAT key deadline LT, then EXEC. LT sets the deadline when the key has none (its
  // first increment, or a TTL lost to PERSIST or a foreign SET) and lowers a foreign one
  // that is later, so this keeps every guarantee of the script at about a third of the
  // server's time (measured: 1.7 against 4.6 us per increment, pipelined).
  std::vector<Request> transaction() {
    step_ = Step::Transaction;
    std::vector<Request> batch;
    if (items_.size() == 1) {  // incr(): one group, nothing to sort by shard
      const std::size_t only = 0;
      batch.reserve(4);
      transaction_group(batch, &only, 1);
      return batch;
    }
    std::map<std::uint32_t, std::vector<std::size_t>> by_shard;
    for (std::size_t i = 0; i < items_.size(); ++i) by_shard[core_.store->shard_of(items_[i].storage_key)].push_back(i);
    batch.reserve(items_.size() * 2 + by_shard.size() * 2);
    const std::size_t per_call = core_.options.max_script_batch;
    for (const auto& [shard, indexes] : by_shard) {
      for (std::size_t start = 0; start < indexes.size(); start += per_call) {
        const std::size_t end = std::min(indexes.size(), start + per_call);
        transaction_group(batch, indexes.data() + start, end - start);
      }
    }
    return batch;
  }

  // MULTI, INCRBY and PEXPIREAT LT per item of `idx[0..n)`, EXEC; recorded in members_.
  void transaction_group(std::vector<Request>& batch, const std::size_t* idx, std::size_t n) {
    batch.emplace_back(Command{{"MULTI"}});
    for (std::size_t g = 0; g < n; ++g) {
      const WindowedIncrement& w = items_[idx[g]];
      batch.emplace_back(Command{{"INCRBY", w.storage_key, std::to_string(w.amount)}});
      batch.emplace_back(Command{{"PEXPIREAT", w.storage_key, std::to_string(w.expire_at_ms), "LT"}});
      members_.push_back(idx[g]);
    }
    batch.emplace_back(Command{{"EXEC"}});
    group_end_.push_back(members_.size());
  }

  std::vector<Request> transaction_done(std::vector<Reply>& replies) {
    std::size_t expected = 0;
    for (std::size_t c = 0; c < group_end_.size(); ++c) expected += 2 + 2 * group(c).size();
    if (replies.size() != expected) throw ProtocolError("fixed-window transaction: reply count mismatch");
    out_.assign(items_.size(), Reply{});
    std::size_t r = 0;
    for (std::size_t c = 0; c < group_end_.size(); ++c) {
      const auto members = group(c);
      const std::size_t first = r;
      r += 1 + 2 * members.size();  // +OK, then +QUEUED per command
      Reply& exec = replies[r++];
      if (exec.type != Reply::Type::Array || exec.elements.size() != 2 * members.size()) {
        // EXECABORT (a command refused while queueing) or a failure of the whole call:
        // nothing of it ran. The refusal itself (LOADING, READONLY...) says more than
        // EXECABORT, and whether it is worth retrying.
        Reply whole = exec.is_error() ? exec : Reply::of_error("ERR EXEC returned an unexpected reply");
        for (std::size_t q = first; q + 1 < r; ++q) {
          if (replies[q].is_error()) {
            whole = replies[q];
            break;
          }
        }
        for (std::size_t i : members) out_[i] = whole;
        continue;
      }
      for (std::size_t g = 0; g < members.size(); ++g) {
        Reply& incr = exec.elements[2 * g];
        const Reply& expire = exec.elements[2 * g + 1];
        if (!incr.is_error() && expire.is_error()) fix_.push_back(members[g]);  // LT refused: plain repair
        out_[members[g]] = std::move(incr);
      }
    }
    if (fix_.empty()) {
      complete(std::move(out_));
      return {};
    }
    step_ = Step::Repair;
    std::vector<Request> repair;
    for (std::size_t i : fix_) {
      repair.emplace_back(Command{{"PEXPIREAT", items_[i].storage_key, std::to_string(items_[i].expire_at_ms)}});
    }
    return repair;
  }

  std::vector<Request> commands() {
    step_ = Step::Commands;
    // TIME first, so a PTTL can be compared with the deadline on the server's clock (a
    // key given a later expiry by a foreign write is repaired like one without any); then
    // per item: SET key 0 NX PXAT deadline; INCRBY key amount; PTTL key.
    // (amount 0 marks a pending TTL repair: PTTL only.)
    std::vector<Request> batch;
    batch.reserve(1 + items_.size() * 3);
    batch.emplace_back(Command{{"TIME"}});
    for (const auto& inc : items_) {
      if (inc.amount > 0) {
        batch.emplace_back(Command{{"SET", inc.storage_key, "0", "NX", "PXAT", std::to_string(inc.expire_at_ms)}});
        batch.emplace_back(Command{{"INCRBY", inc.storage_key, std::to_string(inc.amount)}});
      }
      batch.emplace_back(Command{{"PTTL", inc.storage_key}});
    }
    return batch;
  }

  std::vector<Request> commands_done(const std::vector<Reply>& replies) {
    std::size_t expected = 1;
    for (const auto& inc : items_) expected += inc.amount > 0 ? 3 : 1;
    if (replies.size() != expected) throw ProtocolError("fixed-window commands: reply count mismatch");
    // The server's time in ms, when it answered TIME (a proxy may refuse it: then only a
    // missing TTL can be seen).
    std::optional<std::int64_t> server_now;
    if (const Reply& t = replies[0]; t.type == Reply::Type::Array && t.elements.size() == 2) {
      auto s = parse_int64(t.elements[0].str);
      auto us = parse_int64(t.elements[1].str);
      if (s && us && *s >= 0 && *s < (std::int64_t{1} << 40)) server_now = *s * 1000 + *us / 1000;
    }
    // No TTL, or one past the deadline (PTTL runs after TIME, so a deadline set by us
    // never looks too late).
    auto unbounded = [&](const Reply& pttl, std::int64_t deadline) {
      if (pttl.type != Reply::Type::Integer) return false;
      return pttl.integer == -1 || (server_now && pttl.integer > deadline - *server_now);
    };
    std::size_t r = 1;
    for (std::size_t i = 0; i < items_.size(); ++i) {
      const auto& inc = items_[i];
      if (inc.amount == 0) {
        const Reply& pttl = replies[r++];
        out_.push_back(Reply::of_integer(0));
        if (unbounded(pttl, inc.expire_at_ms)) fix_.push_back(i);
        continue;
      }
      const Reply& set = replies[r];
      const Reply& incr = replies[r + 1];
      const Reply& pttl = replies[r + 2];
      r += 3;
      if (set.is_error()) {
        out_.push_back(set);
        continue;
      }
      out_.push_back(incr);
      if (incr.is_error()) {
        // A foreign value: the error stands, and the key still ends with its window.
        if (unbounded(pttl, inc.expire_at_ms)) fix_.push_back(i);
        continue;
      }
      // The key expired between SET and INCRBY (so INCRBY created it bare), or its TTL was
      // lost: either way PTTL reads -1. INCRBY == amount with no SET means the same race.
      const bool bare = unbounded(pttl, inc.expire_at_ms);
      const bool first_without_set =
          incr.type == Reply::Type::Integer && incr.integer == inc.amount && set.is_nil();
      if (bare || first_without_set) fix_.push_back(i);
    }
    if (fix_.empty()) {
      complete(std::move(out_));
      return {};
    }
    // The follow-up, only when a deadline is missing: PEXPIREAT key deadline.
    step_ = Step::Repair;
    std::vector<Request> repair;
    for (std::size_t i : fix_) {
      repair.emplace_back(Command{{"PEXPIREAT", items_[i].storage_key, std::to_string(items_[i].expire_at_ms)}});
    }
    return repair;
  }

  // Called inside a catch block: queues TTL repairs, or rethrows.
  void repair_failed(const Error& e) {
    if (!(core_.queueing() && is_transient(e))) throw;
    std::vector<WindowedIncrement> repairs;
    for (std::size_t i : fix_) {
      WindowedIncrement w = items_[i];
      w.amount = 0;
      w.request_id_key.clear();
      repairs.push_back(std::move(w));
    }
    try {
      core_.enqueue(std::move(repairs), e.what());
    } catch (const RetryQueueFull&) {
      // Counted in stats().overflowed; the next increment of these keys repairs them.
      // The increments themselves landed, so this call must not report a failure.
    }
  }

  Core& core_;
  std::vector<WindowedIncrement> items_;
  bool transaction_ok_ = false;
  Step step_ = Step::Scripts;
  // Item indexes in call order (script calls, or MULTI groups); call c's are
  // members_[group_end_[c - 1], group_end_[c]). One inline slot each: incr() allocates none.
  detail::SmallVec<std::size_t, 1> members_;
  detail::SmallVec<std::size_t, 1> group_end_;
  detail::SmallVec<std::shared_ptr<const IncrArgs>, 1> sent_;  // per script call
  std::vector<Reply> out_;                          // commands mode: per-item replies
  std::vector<std::size_t> fix_;                    // commands mode: items to repair
};

// Increments as the caller sees them: sends, then per item a count, a queued increment
// (0) on a transient error with OnError::Queue, or an error. T is std::int64_t for incr,
// std::vector<std::int64_t> for incr_many.
template <class T>
class IncrOp final : public Op<T> {
 public:
  IncrOp(std::shared_ptr<Core> core, std::vector<WindowedIncrement> items)
      : core_(std::move(core)), send_(*core_, std::move(items), core_->transaction_ok()) {
    this->meter = Meter::Write;
    this->meter_items = static_cast<std::uint32_t>(send_.items().size());
  }

  std::vector<Request> prepare() override {
    core_->check_open();
    if (send_.items().empty()) {
      done_with({});
      return {};
    }
    return send_.prepare();
  }

  std::vector<Request> finish(std::vector<Reply> replies) override {
    std::vector<Request> next;
    try {
      next = send_.finish(std::move(replies));
    } catch (const Error& e) {
      return send_failed(e);
    }
    return next.empty() ? apply() : next;
  }

  std::vector<Request> fail(std::exception_ptr error) override {
    std::vector<Request> next;
    try {
      next = send_.fail(error);
    } catch (const Error& e) {
      return send_failed(e);
    }
    return next.empty() ? apply() : next;
  }

 private:
  void done_with(std::vector<std::int64_t> counts) {
    if constexpr (std::is_same_v<T, std::int64_t>) {
      this->complete(counts.front());
    } else {
      this->complete(std::move(counts));
    }
  }

  // Called inside a catch block: the whole send failed.
  std::vector<Request> send_failed(const Error& e) {
    if (!(core_->queueing() && is_transient(e))) throw;
    core_->enqueue(send_.items(), e.what());
    done_with(std::vector<std::int64_t>(send_.items().size(), 0));
    return {};
  }

  std::vector<Request> apply() {
    const auto& items = send_.items();
    std::vector<Reply> replies = send_.take();
    if (items.size() == 1 && !replies[0].is_error()) {  // incr() that landed: no bookkeeping
      if constexpr (std::is_same_v<T, std::int64_t>) {
        this->complete(count_from_reply(replies[0]));
      } else {
        this->complete(std::vector<std::int64_t>{count_from_reply(replies[0])});
      }
      return {};
    }
    std::vector<std::int64_t> counts(items.size(), 0);  // 0 = queued, count not known yet
    const bool queue = core_->queueing();
    std::vector<WindowedIncrement> later;
    std::string later_error, failures;
    std::size_t failed = 0, first_failed = 0;
    for (std::size_t i = 0; i < items.size(); ++i) {
      if (!replies[i].is_error()) {
        counts[i] = count_from_reply(replies[i]);
        continue;
      }
      ReplyError err(replies[i].str);
      if (queue && err.transient()) {
        later.push_back(items[i]);
        later_error = err.what();
        continue;
      }
      if (failed++ == 0) first_failed = i;
      if (failures.size() < 500) failures += " key '" + printable(items[i].user_key) + "': " + err.what() + ";";
    }
    if (!later.empty()) core_->enqueue(std::move(later), later_error);
    // A single incr, or a batch that failed whole on a transient error (READONLY, LOADING...):
    // raise the item's own error with its own type, so callers can tell what to do.
    if (failed == items.size() &&
        (items.size() == 1 || ReplyError(replies[first_failed].str).transient())) {
      replies[first_failed].check();
    }
    if (failed > 0) {
      throw ReplyError("ERR incr_many: " + std::to_string(failed) + " of " + std::to_string(items.size()) +
                       " increments failed and were not applied (the others were):" + failures);
    }
    done_with(std::move(counts));
    return {};
  }

  std::shared_ptr<Core> core_;
  SendOp send_;
};

// What the retry queue holds: an increment resolved to its window (amount 0: a TTL repair).
struct QueuedIncrement final : RetryQueue::Entry {
  explicit QueuedIncrement(WindowedIncrement w) : inc(std::move(w)) { counted = inc.amount > 0; }
  WindowedIncrement inc;
};

// One retry attempt: the entries whose window (plus grace) has not ended, sent as a first
// attempt is; the others are dropped, since counting them now would land in a key that no
// longer exists.
class RetryOp final : public RetryQueue::Attempt {
 public:
  RetryOp(std::shared_ptr<Core> core, const std::vector<const RetryQueue::Entry*>& entries, std::int64_t now_ms)
      : core_(std::move(core)), send_(*core_, live(entries, now_ms), core_->transaction_ok()) {}

  std::vector<Request> prepare() override { return send_.prepare(); }
  std::vector<Request> finish(std::vector<Reply> replies) override {
    std::vector<Request> next = send_.finish(std::move(replies));
    return next.empty() ? settle() : next;
  }
  std::vector<Request> fail(std::exception_ptr error) override {
    std::vector<Request> next = send_.fail(error);
    return next.empty() ? settle() : next;
  }

 private:
  std::vector<Request> settle() {
    std::vector<Reply> replies = send_.take();
    for (std::size_t k = 0; k < sent_.size(); ++k) {
      const Reply& r = replies.at(k);
      RetryQueue::Outcome& o = outcomes[sent_[k]];
      if (!r.is_error()) {
        o = RetryQueue::Outcome::Delivered;
      } else {
        last_error = r.str;
        o = ReplyError(r.str).transient() ? RetryQueue::Outcome::Again : RetryQueue::Outcome::Failed;
      }
    }
    return {};
  }

  // Sets each entry's outcome (Sent or Dropped) and returns the increments to send.
  std::vector<WindowedIncrement> live(const std::vector<const RetryQueue::Entry*>& entries, std::int64_t now_ms) {
    std::vector<WindowedIncrement> out;
    outcomes.reserve(entries.size());
    for (std::size_t i = 0; i < entries.size(); ++i) {
      const WindowedIncrement& w = static_cast<const QueuedIncrement*>(entries[i])->inc;
      if (w.expire_at_ms <= now_ms) {
        outcomes.push_back(RetryQueue::Outcome::Dropped);
      } else {
        outcomes.push_back(RetryQueue::Outcome::Sent);
        out.push_back(w);
        sent_.push_back(i);
      }
    }
    return out;
  }

  std::shared_ptr<Core> core_;
  std::vector<std::size_t> sent_;  // the entry index of each increment sent (before send_: live() fills it)
  SendOp send_;
};

}  // namespace

WindowedIncrement FixedWindowCounter::Core::resolve(std::string_view key, std::int64_t amount,
                                                    std::string_view request_id, std::int64_t now) const {
  validate_key(key);
  if (amount < 1) {
    throw InvalidArgument("amount must be a positive integer, got " + std::to_string(amount));
  }
  if (!request_id.empty()) {
    validate_request_id(request_id);
    if (options.mode == FixedWindowOptions::Mode::Commands) {
      throw InvalidArgument(
          "request_id needs mode='script': without a script the id check and the increment "
          "cannot be made atomic");
    }
  }
  const WindowPos pos = locate(spec, key, now);
  WindowedIncrement inc;
  inc.user_key = std::string(key);
  inc.storage_key = window_key(options.prefix, options.name, key, spec.window_ms, pos.index);
  if (!request_id.empty()) inc.request_id_key = request_id_key(inc.storage_key, request_id);
  inc.amount = amount;
  inc.expire_at_ms = pos.expire_at_ms;
  return inc;
}

FixedWindowCounter::FixedWindowCounter(std::shared_ptr<Store> store, FixedWindowOptions options)
    : core_(std::make_shared<Core>()) {
  if (!store) throw InvalidArgument("store must not be None");
  core_->store = std::move(store);
  core_->options = std::move(options);
  FixedWindowOptions& o = core_->options;
  validate_name(o.prefix, "prefix");
  validate_name(o.name, "name");
  core_->spec = WindowSpec{o.window_ms, o.grace_ms, o.stagger};
  validate(core_->spec);
  if (o.max_script_batch < 1) o.max_script_batch = 1;
  // The queue's attempts see the Core weakly: the queue belongs to the Core.
  core_->retry = RetryQueue::create(
      core_->store, RetryQueueOptions{o.queue_capacity, o.retry_backoff_min, o.retry_backoff_max},
      [weak = std::weak_ptr<Core>(core_)](const std::vector<const RetryQueue::Entry*>& entries)
          -> std::shared_ptr<RetryQueue::Attempt> {
        std::shared_ptr<Core> core = weak.lock();
        if (!core) throw Error("the counter is gone");
        return std::make_shared<RetryOp>(core, entries, core->store->now_ms());
      });
}

FixedWindowCounter::~FixedWindowCounter() { close(std::chrono::milliseconds(0)); }

const FixedWindowOptions& FixedWindowCounter::options() const noexcept { return core_->options; }
const std::shared_ptr<Store>& FixedWindowCounter::store() const noexcept { return core_->store; }

WindowPos FixedWindowCounter::window(std::string_view key) const {
  return locate(core_->spec, key, core_->store->now_ms());
}

std::string FixedWindowCounter::storage_key(std::string_view key) const {
  validate_key(key);
  const WindowPos pos = window(key);
  return window_key(core_->options.prefix, core_->options.name, key, core_->spec.window_ms, pos.index);
}

std::shared_ptr<Op<std::int64_t>> FixedWindowCounter::make_incr(std::string_view key, std::int64_t amount,
                                                                std::string_view request_id) {
  std::vector<WindowedIncrement> items;
  items.push_back(core_->resolve(key, amount, request_id, core_->store->now_ms()));
  return std::make_shared<IncrOp<std::int64_t>>(core_, std::move(items));
}

std::shared_ptr<Op<std::vector<std::int64_t>>> FixedWindowCounter::make_incr_many(
    const std::vector<std::pair<std::string, std::int64_t>>& in) {
  const std::int64_t now = core_->store->now_ms();
  std::vector<WindowedIncrement> items;
  items.reserve(in.size());
  for (const auto& [key, amount] : in) items.push_back(core_->resolve(key, amount, {}, now));  // all validated first
  return std::make_shared<IncrOp<std::vector<std::int64_t>>>(core_, std::move(items));
}

std::shared_ptr<Op<std::vector<std::int64_t>>> FixedWindowCounter::make_get_many(const std::vector<std::string>& keys) {
  const std::int64_t now = core_->store->now_ms();
  const auto& o = core_->options;
  std::vector<Request> batch;
  batch.reserve(keys.size());
  for (const auto& key : keys) {
    validate_key(key);
    const WindowPos pos = locate(core_->spec, key, now);
    batch.emplace_back(Command{{"GET", window_key(o.prefix, o.name, key, core_->spec.window_ms, pos.index)}});
  }
  const std::size_t n = batch.size();
  return with_meter(make_batch_op<std::vector<std::int64_t>>(std::move(batch), [](std::vector<Reply>&& replies) {
    std::vector<std::int64_t> out;
    out.reserve(replies.size());
    for (const Reply& r : replies) out.push_back(count_from_reply(r));
    return out;
  }), Meter::Read, n);
}

std::shared_ptr<Op<std::int64_t>> FixedWindowCounter::make_get(std::string_view key) {
  validate_key(key);
  std::vector<Request> batch;
  batch.emplace_back(Command{{"GET", storage_key(key)}});
  return with_meter(make_batch_op<std::int64_t>(std::move(batch), [](std::vector<Reply>&& replies) {
    if (replies.size() != 1) throw ProtocolError("GET: expected one reply");
    return count_from_reply(replies.front());
  }), Meter::Read);
}

std::shared_ptr<Op<std::int64_t>> FixedWindowCounter::make_pttl(std::string_view key) {
  std::vector<Request> batch;
  batch.emplace_back(Command{{"PTTL", storage_key(key)}});
  return make_batch_op<std::int64_t>(std::move(batch), [](std::vector<Reply>&& replies) {
    if (replies.size() != 1) throw ProtocolError("PTTL: expected one reply");
    return replies.front().as_integer();
  });
}

std::int64_t FixedWindowCounter::incr(std::string_view key, std::int64_t amount, std::string_view request_id) {
  // make_incr's operation, on this stack frame: the hot path pays no allocation for it.
  std::vector<WindowedIncrement> items;
  items.push_back(core_->resolve(key, amount, request_id, core_->store->now_ms()));
  IncrOp<std::int64_t> op(core_, std::move(items));
  return run(*core_->store, op);
}

std::vector<std::int64_t> FixedWindowCounter::incr_many(const std::vector<std::pair<std::string, std::int64_t>>& items) {
  return run(*core_->store, *make_incr_many(items));
}

std::int64_t FixedWindowCounter::get(std::string_view key) { return run(*core_->store, *make_get(key)); }

std::vector<std::int64_t> FixedWindowCounter::get_many(const std::vector<std::string>& keys) {
  return run(*core_->store, *make_get_many(keys));
}

std::int64_t FixedWindowCounter::pttl(std::string_view key) { return run(*core_->store, *make_pttl(key)); }

// ---- retry queue -------------------------------------------------------------------

void FixedWindowCounter::Core::enqueue(std::vector<WindowedIncrement> items, const std::string& error) {
  std::vector<std::unique_ptr<RetryQueue::Entry>> entries;
  entries.reserve(items.size());
  for (auto& w : items) entries.push_back(std::make_unique<QueuedIncrement>(std::move(w)));
  retry->enqueue(std::move(entries), error);
}

std::size_t FixedWindowCounter::flush(std::optional<std::chrono::milliseconds> timeout) {
  return core_->retry->flush(timeout);
}
std::size_t FixedWindowCounter::pending() const { return core_->retry->pending(); }
RetryStats FixedWindowCounter::stats() const { return core_->retry->stats(); }
std::size_t FixedWindowCounter::close(std::optional<std::chrono::milliseconds> timeout) {
  return core_->retry->close(timeout);
}

}  // namespace redcount
