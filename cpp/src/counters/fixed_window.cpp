#include "redcount/counters/fixed_window.h"

#include <algorithm>
#include <map>
#include <span>
#include <type_traits>

#include "redcount/common/errors.h"
#include "redcount/common/util.h"
#include "counters/fixed_window_send.h"

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


namespace {

using fixed_window_detail::Core;
using fixed_window_detail::SendOp;


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
  inc.storage_key = window_key(options.prefix, options.name, key, pos.span_ms, pos.index);
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
  core_->spec = WindowSpec{o.window_ms, o.grace_ms, o.stagger, o.calendar, o.calendar_unit};
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
  return window_key(core_->options.prefix, core_->options.name, key, pos.span_ms, pos.index);
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
    batch.emplace_back(Command{{"GET", window_key(o.prefix, o.name, key, pos.span_ms, pos.index)}});
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
