#include "redcount/fixed_window.h"

#include <algorithm>
#include <map>

#include "redcount/errors.h"
#include "redcount/lua_scripts.h"
#include "redcount/util.h"

namespace redcount {
namespace {

using SteadyClock = std::chrono::steady_clock;

// The memory store's twin of fixed_window_incr.lua; keep the two in step.
Reply native_fixed_window_incr(Keyspace& ks, const std::vector<std::string>& keys,
                               const std::vector<std::string>& args) {
  auto bad = [] { return Reply::of_error("ERR fixed_window_incr: malformed arguments"); };
  if (args.size() < 2) return bad();
  auto n = parse_int64(args[0]);
  auto deadline = parse_int64(args[1]);
  if (!n || !deadline || *n < 0 || static_cast<std::size_t>(*n) > keys.size()) return bad();
  const std::size_t count = static_cast<std::size_t>(*n);
  if (args.size() != 2 + count + (keys.size() - count)) return bad();
  std::vector<const std::string*> rid(count, nullptr);
  for (std::size_t j = 0; j < keys.size() - count; ++j) {
    auto item = parse_int64(args[2 + count + j]);
    if (!item || *item < 1 || static_cast<std::size_t>(*item) > count) return bad();
    rid[static_cast<std::size_t>(*item) - 1] = &keys[count + j];
  }
  std::vector<Reply> out;
  out.reserve(count);
  for (std::size_t i = 0; i < count; ++i) {
    const std::string& key = keys[i];
    auto amount = parse_int64(args[2 + i]);
    if (!amount) return bad();
    if (rid[i] && !ks.set_nx_pxat(*rid[i], "1", *deadline)) {
      if (ks.pttl(key) == -1) ks.pexpireat(key, *deadline);
      auto v = ks.get(key);
      out.push_back(v ? Reply::of_string(*v) : Reply::of_integer(0));
      continue;
    }
    try {
      const std::int64_t v = ks.incrby(key, *amount);
      if (v == *amount || ks.pttl(key) == -1) ks.pexpireat(key, *deadline);
      out.push_back(Reply::of_integer(v));
    } catch (const ReplyError& e) {
      if (rid[i]) ks.del(*rid[i]);
      out.push_back(Reply::of_error(e.what()));
    }
  }
  return Reply::of_array(std::move(out));
}

}  // namespace

const Script kFixedWindowIncrScript{"fixed_window_incr", lua::fixed_window_incr_source,
                                    lua::fixed_window_incr_sha1, &native_fixed_window_incr};

std::int64_t count_from_reply(const Reply& r) {
  r.check();
  if (r.is_nil()) return 0;
  return r.as_integer();
}

FixedWindowCounter::FixedWindowCounter(std::shared_ptr<Store> store, FixedWindowOptions options)
    : store_(std::move(store)), options_(std::move(options)) {
  if (!store_) throw InvalidArgument("store must not be None");
  validate_name(options_.prefix, "prefix");
  validate_name(options_.name, "name");
  spec_ = WindowSpec{options_.window_ms, options_.grace_ms, options_.stagger};
  validate(spec_);
  if (options_.queue_capacity < 1) throw InvalidArgument("queue_capacity must be >= 1");
  if (options_.retry_backoff_min.count() < 1 || options_.retry_backoff_max < options_.retry_backoff_min) {
    throw InvalidArgument("retry backoff must satisfy 1 ms <= min <= max");
  }
  if (options_.max_script_batch < 1) options_.max_script_batch = 1;
}

FixedWindowCounter::~FixedWindowCounter() { close(std::chrono::milliseconds(0)); }

WindowPos FixedWindowCounter::window(std::string_view key) const {
  return locate(spec_, key, store_->now_ms());
}

std::string FixedWindowCounter::storage_key(std::string_view key) const {
  validate_key(key);
  const WindowPos pos = window(key);
  return window_key(options_.prefix, options_.name, key, spec_.window_ms, pos.index);
}

WindowedIncrement FixedWindowCounter::resolve(std::string_view key, std::int64_t amount,
                                              std::string_view request_id, std::int64_t now) const {
  validate_key(key);
  if (amount < 1) {
    throw InvalidArgument("amount must be a positive integer, got " + std::to_string(amount));
  }
  if (!request_id.empty()) {
    validate_request_id(request_id);
    if (options_.mode == FixedWindowOptions::Mode::Commands) {
      throw InvalidArgument(
          "request_id needs mode='script': without a script the id check and the increment "
          "cannot be made atomic");
    }
  }
  const WindowPos pos = locate(spec_, key, now);
  WindowedIncrement inc;
  inc.user_key = std::string(key);
  inc.storage_key = window_key(options_.prefix, options_.name, key, spec_.window_ms, pos.index);
  if (!request_id.empty()) inc.request_id_key = request_id_key(inc.storage_key, request_id);
  inc.amount = amount;
  inc.expire_at_ms = pos.expire_at_ms;
  return inc;
}

std::vector<Reply> FixedWindowCounter::send(const std::vector<WindowedIncrement>& items) {
  if (options_.mode == FixedWindowOptions::Mode::Commands) return send_commands(items);
  // One script call per max_script_batch items that share a deadline (all of a batch do,
  // unless stagger spreads them) and a shard (see Store::shard_of). The calls go in one pipeline, so the server runs the
  // first while later ones are still being sent.
  std::map<std::pair<std::int64_t, std::uint32_t>, std::vector<std::size_t>> by_deadline;
  for (std::size_t i = 0; i < items.size(); ++i) {
    by_deadline[{items[i].expire_at_ms, store_->shard_of(items[i].storage_key)}].push_back(i);
  }
  std::vector<Request> batch;
  std::vector<std::vector<std::size_t>> members;  // item indexes per call
  for (const auto& [group_key, indexes] : by_deadline) {
    const std::int64_t deadline = group_key.first;
    for (std::size_t start = 0; start < indexes.size(); start += options_.max_script_batch) {
      const std::size_t end = std::min(indexes.size(), start + options_.max_script_batch);
      std::vector<std::size_t> group(indexes.begin() + static_cast<std::ptrdiff_t>(start),
                                     indexes.begin() + static_cast<std::ptrdiff_t>(end));
      ScriptCall call{&kFixedWindowIncrScript, {}, {}};
      call.keys.reserve(group.size());
      call.args.reserve(2 + group.size());
      call.args.push_back(std::to_string(group.size()));
      call.args.push_back(std::to_string(deadline));
      for (std::size_t g : group) {
        call.keys.push_back(items[g].storage_key);
        call.args.push_back(std::to_string(items[g].amount));
      }
      for (std::size_t g = 0; g < group.size(); ++g) {
        if (items[group[g]].request_id_key.empty()) continue;
        call.keys.push_back(items[group[g]].request_id_key);
        call.args.push_back(std::to_string(g + 1));
      }
      batch.emplace_back(std::move(call));
      members.push_back(std::move(group));
    }
  }
  std::vector<Reply> replies = store_->execute(batch);
  std::vector<Reply> out(items.size());
  for (std::size_t c = 0; c < replies.size(); ++c) {
    Reply& r = replies[c];
    const auto& group = members[c];
    if (r.type == Reply::Type::Array && r.elements.size() == group.size()) {
      for (std::size_t g = 0; g < group.size(); ++g) out[group[g]] = std::move(r.elements[g]);
    } else if (r.is_error()) {
      for (std::size_t g : group) out[g] = r;  // the whole call failed
    } else {
      throw ProtocolError("fixed_window_incr returned an unexpected reply");
    }
  }
  return out;
}

std::vector<Reply> FixedWindowCounter::send_commands(const std::vector<WindowedIncrement>& items) {
  // Round trip 1, per item: SET key 0 NX PXAT deadline; INCRBY key amount; PTTL key.
  // (amount 0 marks a pending TTL repair: PTTL only.)
  std::vector<Request> batch;
  batch.reserve(items.size() * 3);
  for (const auto& inc : items) {
    const std::string at = std::to_string(inc.expire_at_ms);
    if (inc.amount > 0) {
      batch.emplace_back(Command{{"SET", inc.storage_key, "0", "NX", "PXAT", at}});
      batch.emplace_back(Command{{"INCRBY", inc.storage_key, std::to_string(inc.amount)}});
    }
    batch.emplace_back(Command{{"PTTL", inc.storage_key}});
  }
  std::vector<Reply> replies = store_->execute(batch);
  std::vector<Reply> out;
  std::vector<std::size_t> fix;
  std::size_t r = 0;
  for (std::size_t i = 0; i < items.size(); ++i) {
    const auto& inc = items[i];
    if (inc.amount == 0) {
      const Reply& pttl = replies[r++];
      out.push_back(Reply::of_integer(0));
      if (!pttl.is_error() && pttl.type == Reply::Type::Integer && pttl.integer == -1) fix.push_back(i);
      continue;
    }
    const Reply& set = replies[r];
    const Reply& incr = replies[r + 1];
    const Reply& pttl = replies[r + 2];
    r += 3;
    if (set.is_error()) {
      out.push_back(set);
      continue;
    }
    out.push_back(incr);
    if (incr.is_error()) continue;
    // The key expired between SET and INCRBY (so INCRBY created it bare), or its TTL was
    // lost: either way PTTL reads -1. INCRBY == amount with no SET means the same race.
    const bool bare = pttl.type == Reply::Type::Integer && pttl.integer == -1;
    const bool first_without_set = incr.type == Reply::Type::Integer && incr.integer == inc.amount && set.is_nil();
    if (bare || first_without_set) fix.push_back(i);
  }
  if (fix.empty()) return out;
  // Round trip 2, only when a deadline is missing: PEXPIREAT key deadline.
  std::vector<Request> repair;
  for (std::size_t i : fix) {
    repair.emplace_back(Command{{"PEXPIREAT", items[i].storage_key, std::to_string(items[i].expire_at_ms)}});
  }
  try {
    for (const Reply& rr : store_->execute(repair)) rr.check();
  } catch (const Error& e) {
    // The increments landed; only their deadline is missing. Never count them again:
    // queue a TTL repair (amount 0) instead, or report the error.
    if (options_.on_error == FixedWindowOptions::OnError::Queue && is_transient(e)) {
      std::vector<WindowedIncrement> repairs;
      for (std::size_t i : fix) {
        WindowedIncrement w = items[i];
        w.amount = 0;
        w.request_id_key.clear();
        repairs.push_back(std::move(w));
      }
      try {
        enqueue(std::move(repairs), e.what());
      } catch (const RetryQueueFull&) {
        // Counted in stats().overflowed; the next increment of these keys repairs them.
        // The increments themselves landed, so this call must not report a failure.
      }
    } else {
      throw;
    }
  }
  return out;
}

std::int64_t FixedWindowCounter::incr(std::string_view key, std::int64_t amount, std::string_view request_id) {
  std::vector<WindowedIncrement> items;
  items.push_back(resolve(key, amount, request_id, store_->now_ms()));
  return apply(std::move(items)).front();
}

std::vector<std::int64_t> FixedWindowCounter::incr_many(
    const std::vector<std::pair<std::string, std::int64_t>>& in) {
  const std::int64_t now = store_->now_ms();
  std::vector<WindowedIncrement> items;
  items.reserve(in.size());
  for (const auto& [key, amount] : in) items.push_back(resolve(key, amount, {}, now));  // all validated first
  return apply(std::move(items));
}

std::vector<std::int64_t> FixedWindowCounter::apply(std::vector<WindowedIncrement> items) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) throw Error("this counter is closed; create a new FixedWindowCounter");
  }
  std::vector<std::int64_t> counts(items.size(), 0);  // 0 = queued, count not known yet
  if (items.empty()) return counts;
  const bool queue = options_.on_error == FixedWindowOptions::OnError::Queue;
  std::vector<Reply> replies;
  try {
    replies = send(items);
  } catch (const Error& e) {
    if (queue && is_transient(e)) {
      enqueue(std::move(items), e.what());
      return counts;
    }
    throw;
  }
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
    if (failures.size() < 500) failures += " key '" + items[i].user_key + "': " + err.what() + ";";
  }
  if (!later.empty()) enqueue(std::move(later), later_error);
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
  return counts;
}

std::int64_t FixedWindowCounter::get(std::string_view key) {
  return get_many({std::string(key)}).front();
}

std::vector<std::int64_t> FixedWindowCounter::get_many(const std::vector<std::string>& keys) {
  const std::int64_t now = store_->now_ms();
  std::vector<Request> batch;
  for (const auto& key : keys) {
    validate_key(key);
    const WindowPos pos = locate(spec_, key, now);
    batch.emplace_back(Command{{"GET", window_key(options_.prefix, options_.name, key, spec_.window_ms, pos.index)}});
  }
  std::vector<std::int64_t> out;
  for (const Reply& r : store_->execute(batch)) out.push_back(count_from_reply(r));
  return out;
}

std::int64_t FixedWindowCounter::pttl(std::string_view key) {
  return store_->execute_one(Command{{"PTTL", storage_key(key)}}).as_integer();
}

// ---- retry queue -------------------------------------------------------------------

void FixedWindowCounter::enqueue(std::vector<WindowedIncrement> items, const std::string& error) {
  std::lock_guard<std::mutex> lock(mu_);
  stats_.last_error = error;
  if (closed_ || stopping_) throw Error("this counter is closed; the increment was not applied: " + error);
  if (queue_.size() + in_flight_ + items.size() > options_.queue_capacity) {
    stats_.overflowed += items.size();
    throw RetryQueueFull("retry queue is full (capacity " + std::to_string(options_.queue_capacity) +
                         "): " + std::to_string(items.size()) +
                         " increment(s) were not applied; the store keeps failing with: " + error);
  }
  const auto now = SteadyClock::now();
  for (auto& inc : items) {
    if (inc.amount > 0) ++stats_.queued;
    queue_.push_back(Queued{std::move(inc), now + jittered(options_.retry_backoff_min), options_.retry_backoff_min});
  }
  if (!retry_thread_.joinable()) retry_thread_ = std::thread([this] { retry_loop(); });
  cv_.notify_all();
}

void FixedWindowCounter::retry_loop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stopping_) {
    if (queue_.empty()) {
      cv_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
      continue;
    }
    auto earliest = std::min_element(queue_.begin(), queue_.end(),
                                     [](const Queued& a, const Queued& b) { return a.due < b.due; })->due;
    if (!flush_now_ && SteadyClock::now() < earliest) {
      cv_.wait_until(lock, earliest, [this] { return stopping_ || flush_now_; });
      continue;
    }
    const bool everything = flush_now_;
    flush_now_ = false;
    lock.unlock();
    retry_due_once(everything);
    lock.lock();
  }
}

void FixedWindowCounter::retry_due_once(bool everything) {
  std::vector<Queued> batch;
  {
    std::lock_guard<std::mutex> lock(mu_);
    const auto now = SteadyClock::now();
    for (auto it = queue_.begin(); it != queue_.end() && batch.size() < 4096;) {
      if (everything || it->due <= now) {
        batch.push_back(std::move(*it));
        it = queue_.erase(it);
      } else {
        ++it;
      }
    }
    in_flight_ += batch.size();
  }
  if (batch.empty()) return;

  const std::int64_t store_now = store_->now_ms();
  std::vector<Queued> live;
  std::uint64_t dropped = 0;
  for (auto& q : batch) {
    // A deadline in the past means the window (plus grace) is over: counting it now
    // would land in a key that no longer exists or inflate nothing. Drop and count it.
    if (q.inc.expire_at_ms <= store_now) {
      dropped += q.inc.amount > 0 ? 1 : 0;
    } else {
      live.push_back(std::move(q));
    }
  }
  std::vector<Queued> again;
  std::uint64_t delivered = 0, failed = 0, retried = 0;
  std::string last_error;
  if (!live.empty()) {
    std::vector<WindowedIncrement> items;
    for (const auto& q : live) items.push_back(q.inc);
    for (const auto& q : live) retried += q.inc.amount > 0 ? 1 : 0;
    try {
      std::vector<Reply> replies = send(items);
      for (std::size_t i = 0; i < live.size(); ++i) {
        if (!replies[i].is_error()) {
          delivered += live[i].inc.amount > 0 ? 1 : 0;
        } else if (ReplyError(replies[i].str).transient()) {
          last_error = replies[i].str;
          again.push_back(std::move(live[i]));
        } else {
          ++failed;
          last_error = replies[i].str;
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
  std::lock_guard<std::mutex> lock(mu_);
  const auto now = SteadyClock::now();
  for (auto& q : again) {
    q.backoff = std::min(q.backoff * 2, options_.retry_backoff_max);
    q.due = now + jittered(q.backoff);
    queue_.push_back(std::move(q));
  }
  in_flight_ -= batch.size();
  stats_.dropped += dropped;
  stats_.delivered += delivered;
  stats_.failed += failed;
  stats_.retried += retried;
  if (!last_error.empty()) stats_.last_error = last_error;
  drained_.notify_all();
}

std::size_t FixedWindowCounter::flush(std::optional<std::chrono::milliseconds> timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  if (queue_.empty() && in_flight_ == 0) return 0;
  flush_now_ = true;
  cv_.notify_all();
  auto done = [this] { return queue_.empty() && in_flight_ == 0; };
  if (timeout) {
    drained_.wait_for(lock, *timeout, done);
  } else {
    drained_.wait(lock, done);
  }
  return queue_.size() + in_flight_;
}

std::size_t FixedWindowCounter::pending() const {
  std::lock_guard<std::mutex> lock(mu_);
  return queue_.size() + in_flight_;
}

RetryStats FixedWindowCounter::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  RetryStats s = stats_;
  s.pending = queue_.size() + in_flight_;
  return s;
}

std::size_t FixedWindowCounter::close(std::optional<std::chrono::milliseconds> timeout) {
  std::size_t left = flush(timeout);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) return left;
    stopping_ = true;
    closed_ = true;
  }
  cv_.notify_all();
  if (retry_thread_.joinable()) retry_thread_.join();
  std::lock_guard<std::mutex> lock(mu_);
  // Whatever is still queued will never be sent: count it as failed, never silently.
  for (const auto& q : queue_) stats_.failed += q.inc.amount > 0 ? 1 : 0;
  left = queue_.size();
  queue_.clear();
  return left;
}

}  // namespace redcount
