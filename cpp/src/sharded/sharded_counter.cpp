#include <algorithm>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <random>
#include <thread>
#include <type_traits>

#include "redcount/common/errors.h"
#include "redcount/common/keys.h"
#include "redcount/sharded/sharded_counter.h"
#include "redcount/common/util.h"
#include "redcount/common/window.h"

namespace redcount {
namespace {

using SteadyClock = std::chrono::steady_clock;

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
  std::vector<std::string> older_rid_keys;  // the id in older generations' shards (reshard)
};

// The layout key's text: "<version>|<first>,<count>,<retired_ms>;..." oldest generation first.
std::string format_layout(const ShardLayout& l) {
  std::string out = std::to_string(l.version) + "|";
  for (std::size_t i = 0; i < l.generations.size(); ++i) {
    const ShardGeneration& g = l.generations[i];
    if (i > 0) out += ";";
    out += std::to_string(g.first) + "," + std::to_string(g.count) + "," + std::to_string(g.retired_ms);
  }
  return out;
}

ShardLayout first_layout(std::int64_t shards) {
  ShardLayout l;
  l.generations.push_back(ShardGeneration{0, shards, 0});
  return l;
}

// The layout in `text` ('' = none written yet: the first generation of `shards`). A text
// reshard() did not write (a foreign SET) is an error naming the key, never a guess.
ShardLayout parse_layout(const std::string& text, std::int64_t shards, const std::string& key) {
  if (text.empty()) return first_layout(shards);
  auto bad = [&] {
    return Error("the layout key '" + printable(key) + "' holds '" + printable(text.substr(0, 200)) +
                 "', which reshard() did not write; restore it or delete it (then the counter has its "
                 "constructor's shard count)");
  };
  const auto bar = text.find('|');
  if (bar == std::string::npos) throw bad();
  auto version = parse_int64(text.substr(0, bar));
  if (!version) throw bad();
  ShardLayout l;
  l.version = *version;
  std::size_t pos = bar + 1;
  while (pos <= text.size()) {
    std::size_t end = text.find(';', pos);
    if (end == std::string::npos) end = text.size();
    const std::string part = text.substr(pos, end - pos);
    const auto c1 = part.find(','), c2 = part.rfind(',');
    if (c1 == std::string::npos || c1 == c2) throw bad();
    auto first = parse_int64(part.substr(0, c1));
    auto count = parse_int64(part.substr(c1 + 1, c2 - c1 - 1));
    auto retired = parse_int64(part.substr(c2 + 1));
    if (!first || !count || !retired) throw bad();
    l.generations.push_back(ShardGeneration{*first, *count, *retired});
    pos = end + 1;
  }
  std::int64_t next = 0;
  for (std::size_t i = 0; i < l.generations.size(); ++i) {
    const ShardGeneration& g = l.generations[i];
    const bool last = i + 1 == l.generations.size();
    if (g.first != next || g.count < 1 || g.count > kMaxShards || (last ? g.retired_ms != 0 : g.retired_ms <= 0)) {
      throw bad();
    }
    next += g.count;
  }
  if (l.version != static_cast<std::int64_t>(l.generations.size()) || next > kMaxShards) throw bad();
  return l;
}

// The layout key's reply as text ('' when absent).
std::string layout_text(const Reply& r) {
  r.check();
  if (r.is_nil()) return {};
  return r.str;
}

}  // namespace



struct ShardedCounter::Core {
  std::shared_ptr<Store> store;
  ShardedOptions options;

  // The layouts this object has seen, per counter name (incr_many and values() touch others).
  struct KnownLayout {
    ShardLayout layout;
    std::string text;
    SteadyClock::time_point read_at{};  // when the read that returned it was sent; {} = never read
  };
  mutable std::mutex layout_mu;
  std::map<std::string, KnownLayout, std::less<>> layouts;

  // The read cache.
  std::mutex cache_mu;
  std::optional<std::int64_t> cached;
  SteadyClock::time_point cached_at{};       // when the read that produced `cached` was sent
  SteadyClock::time_point refresh_started{};  // a refresh in flight, if recent

  std::shared_ptr<RetryQueue> retry;  // also what close() closes (with on_error="raise" it stays empty)

  bool queueing() const noexcept { return options.on_error == ShardedOptions::OnError::Queue; }

  KnownLayout known(std::string_view name) const {
    std::lock_guard<std::mutex> lock(layout_mu);
    auto it = layouts.find(name);
    if (it != layouts.end()) return it->second;
    return KnownLayout{first_layout(options.shards), {}, {}};
  }

  // Remembers the layout read at `sent` (the newest read wins; a bounded map: names come
  // from callers of incr_many and values()).
  void learn(std::string_view name, const std::string& text, SteadyClock::time_point sent) {
    ShardLayout l = parse_layout(text, options.shards, sharded_layout_key(options.prefix, name));
    std::lock_guard<std::mutex> lock(layout_mu);
    auto it = layouts.find(name);
    if (it == layouts.end()) {
      if (layouts.size() >= 10'000) layouts.clear();
      layouts.emplace(std::string(name), KnownLayout{std::move(l), text, sent});
    } else if (it->second.read_at <= sent) {
      it->second = KnownLayout{std::move(l), text, sent};
    }
  }

  static std::int64_t shard_in(const ShardGeneration& g, std::uint64_t hash) {
    return g.first + static_cast<std::int64_t>(hash % static_cast<std::uint64_t>(g.count));
  }

  std::int64_t shard_for(std::string_view request_id) const {
    const ShardGeneration g = known(options.name).layout.current();
    if (!request_id.empty()) return shard_in(g, fnv1a64(request_id));
    static thread_local std::minstd_rand rng{std::random_device{}()};
    return shard_in(g, rng());
  }

  // Gives `w` its shard and keys in `l`: the current generation's shard, and for a request
  // id the id's keys in the older generations retired less than idempotency_ttl + grace ago.
  void route(ShardedWrite& w, const ShardLayout& l, std::int64_t now_ms) const {
    static thread_local std::minstd_rand rng{std::random_device{}()};
    const std::uint64_t hash = w.request_id.empty() ? rng() : fnv1a64(w.request_id);
    w.shard = shard_in(l.current(), hash);
    w.value_key = sharded_value_key(options.prefix, w.name, w.shard);
    w.log_key.reserve(w.value_key.size() + 4);
    w.log_key.assign(w.value_key).append(":log");
    w.rid_key.clear();
    w.older_rid_keys.clear();
    if (w.request_id.empty()) return;
    const std::string suffix = std::string("rid:").append(w.request_id);
    w.rid_key.reserve(w.value_key.size() + 1 + suffix.size());
    w.rid_key.assign(w.value_key).append(":").append(suffix);
    for (std::size_t i = 0; i + 1 < l.generations.size(); ++i) {
      const ShardGeneration& g = l.generations[i];
      if (now_ms < g.retired_ms + options.idempotency_ttl_ms + kLayoutGraceMs) {
        w.older_rid_keys.push_back(sharded_key(options.prefix, w.name, shard_in(g, hash), suffix));
      }
    }
  }

  // Routes every write under one lock, reading the layouts in place (no copies: this runs
  // per incr_many item at the counters' full rate).
  void route_all(std::vector<ShardedWrite>& writes) const {
    const std::int64_t now_ms = store->now_ms();
    const ShardLayout first = first_layout(options.shards);
    std::lock_guard<std::mutex> lock(layout_mu);
    for (auto& w : writes) {
      auto it = layouts.find(w.name);
      route(w, it == layouts.end() ? first : it->second.layout, now_ms);
    }
  }

  // The names among `writes` whose layout is older than kLayoutRefreshMs (or never read).
  std::vector<std::string> stale_names(const std::vector<ShardedWrite>& writes) const {
    const auto now = SteadyClock::now();
    std::vector<std::string> out;
    std::lock_guard<std::mutex> lock(layout_mu);
    const std::string* previous = nullptr;
    for (const auto& w : writes) {
      if (previous != nullptr && *previous == w.name) continue;  // a run of one counter's writes
      previous = &w.name;
      auto it = layouts.find(w.name);
      if (it != layouts.end() && now - it->second.read_at < std::chrono::milliseconds(kLayoutRefreshMs)) continue;
      if (std::find(out.begin(), out.end(), w.name) == out.end()) out.push_back(w.name);
    }
    return out;
  }

  std::vector<Request> layout_gets(const std::vector<std::string>& names) const {
    std::vector<Request> batch;
    for (const auto& n : names) batch.emplace_back(Command{{"GET", sharded_layout_key(options.prefix, n)}});
    return batch;
  }

  // Validates one increment; route() gives it its keys when it is sent.
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
    w.amount = amount;
    w.request_id = std::string(request_id);
    return w;
  }

  std::vector<std::string> shard_keys(std::string_view name, const ShardLayout& l) const {
    std::vector<std::string> out;
    out.reserve(static_cast<std::size_t>(l.total()));
    for (std::int64_t i = 0; i < l.total(); ++i) out.push_back(sharded_value_key(options.prefix, name, i));
    return out;
  }

  void check_open() const {
    if (retry->closed()) throw Error("this counter is closed; create a new ShardedCounter");
  }
  void enqueue(std::vector<ShardedWrite> writes, const std::string& error);
};

namespace {

using Core = ShardedCounter::Core;

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
      : core_(std::move(core)), writes_(std::move(writes)) {
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
    core_->route_all(writes_);
    batch_ = build_calls(*core_->store, core_->options, writes_);
    return std::move(batch_.requests);
  }

  std::shared_ptr<Core> core_;
  std::vector<ShardedWrite> writes_;
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
      : core_(std::move(core)) {
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
    core_->route_all(writes_);
    batch_ = build_calls(*core_->store, core_->options, writes_);
    return std::move(batch_.requests);
  }

  std::shared_ptr<Core> core_;
  std::vector<ShardedWrite> writes_;
  std::vector<std::size_t> index_;  // the entry index of each write sent
  ScriptBatch batch_;
  std::vector<std::string> stale_;
  SteadyClock::time_point sent_{};
};

// The shard values of some counters, with each counter's layout read in the same batch
// (first, so a generation added after it was read only holds writes later than the read
// began): when a layout differs from the one whose shards were read, the batch is sent
// again with the new shards (a follow-up step), so every generation is always summed.
class ShardReads {
 public:
  ShardReads(std::shared_ptr<Core> core, std::vector<std::string> names)
      : core_(std::move(core)), names_(std::move(names)) {}

  std::vector<Request> batch() {
    if (++rounds_ > 8) {
      throw Error("the shard layout of '" + printable(names_.front()) +
                  "' kept changing while it was read (8 reshards during one read?)");
    }
    believed_.clear();
    std::vector<Request> out;
    for (const auto& n : names_) {
      believed_.push_back(core_->known(n));
      out.emplace_back(Command{{"GET", sharded_layout_key(core_->options.prefix, n)}});
      for (auto& k : core_->shard_keys(n, believed_.back().layout)) out.emplace_back(Command{{"GET", std::move(k)}});
    }
    sent_ = SteadyClock::now();
    return out;
  }

  // True with `out` (per name, its shards' values in index order) when every layout was the
  // believed one; false after learning the changed ones: send batch() again.
  bool take(const std::vector<Reply>& replies, std::vector<std::vector<std::int64_t>>& out) {
    out.clear();
    bool same = true;
    std::size_t at = 0;
    for (std::size_t i = 0; i < names_.size(); ++i) {
      const std::size_t n = static_cast<std::size_t>(believed_[i].layout.total());
      if (at + 1 + n > replies.size()) throw ProtocolError("sharded read: reply count mismatch");
      const std::string text = layout_text(replies[at]);
      if (text != believed_[i].text) {
        same = false;
        core_->learn(names_[i], text, sent_);
      } else if (same) {
        std::vector<std::int64_t> v;
        v.reserve(n);
        for (std::size_t j = 0; j < n; ++j) v.push_back(shard_reply(replies[at + 1 + j]));
        out.push_back(std::move(v));
      }
      at += 1 + n;
    }
    if (same) {
      // A confirmed layout is as good as a fresh read of it for the writers.
      for (std::size_t i = 0; i < names_.size(); ++i) core_->learn(names_[i], believed_[i].text, sent_);
    }
    return same;
  }

  SteadyClock::time_point sent() const { return sent_; }

 private:
  std::shared_ptr<Core> core_;
  std::vector<std::string> names_;
  std::vector<Core::KnownLayout> believed_;
  SteadyClock::time_point sent_{};
  int rounds_ = 0;
};

// value(), shard_values(), values(): the shard values of `names`, reduced by `reduce`.
template <class T>
class ShardReadOp final : public Op<T> {
 public:
  using Reduce = std::function<T(std::vector<std::vector<std::int64_t>>&&)>;
  ShardReadOp(std::shared_ptr<Core> core, std::vector<std::string> names, Reduce reduce)
      : reads_(std::move(core), std::move(names)), reduce_(std::move(reduce)) {}

  std::vector<Request> prepare() override { return reads_.batch(); }

  std::vector<Request> finish(std::vector<Reply> replies) override {
    std::vector<std::vector<std::int64_t>> v;
    if (!reads_.take(replies, v)) return reads_.batch();
    this->complete(reduce_(std::move(v)));
    return {};
  }

 private:
  ShardReads reads_;
  Reduce reduce_;
};

// read(): from the cache, or a fresh sum that refreshes it.
class ReadOp final : public Op<Reading> {
 public:
  ReadOp(std::shared_ptr<Core> core, std::int64_t max_staleness_ms)
      : core_(core), max_(std::chrono::milliseconds(max_staleness_ms)), reads_(core, {core->options.name}) {
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
    return reads_.batch();
  }

  std::vector<Request> finish(std::vector<Reply> replies) override {
    std::int64_t total;
    try {
      std::vector<std::vector<std::int64_t>> v;
      if (!reads_.take(replies, v)) return reads_.batch();
      total = checked_sum(v.front());
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
  ShardReads reads_;
  SteadyClock::time_point sent_{};
};

// layout(): the layout key, read and learned.
class LayoutOp final : public Op<ShardLayout> {
 public:
  explicit LayoutOp(std::shared_ptr<Core> core) : core_(std::move(core)) {}
  std::vector<Request> prepare() override {
    sent_ = SteadyClock::now();
    return core_->layout_gets({core_->options.name});
  }
  std::vector<Request> finish(std::vector<Reply> replies) override {
    if (replies.size() != 1) throw ProtocolError("sharded layout: reply count mismatch");
    const std::string text = layout_text(replies[0]);
    core_->learn(core_->options.name, text, sent_);
    complete(parse_layout(text, core_->options.shards, sharded_layout_key(core_->options.prefix, core_->options.name)));
    return {};
  }

 private:
  std::shared_ptr<Core> core_;
  SteadyClock::time_point sent_{};
};

// reshard(): read the layout, then compare-and-set the next one (sharded_reshard.lua), so
// a concurrent reshard makes this one fail instead of both writing.
class ReshardOp final : public Op<ShardLayout> {
 public:
  ReshardOp(std::shared_ptr<Core> core, std::int64_t new_shards) : core_(std::move(core)), new_(new_shards) {}

  std::vector<Request> prepare() override {
    sent_ = SteadyClock::now();
    return core_->layout_gets({core_->options.name});
  }

  std::vector<Request> finish(std::vector<Reply> replies) override {
    const std::string key = sharded_layout_key(core_->options.prefix, core_->options.name);
    if (replies.size() != 1) throw ProtocolError("sharded reshard: reply count mismatch");
    if (!read_) {
      read_ = true;
      expected_ = layout_text(replies[0]);
      ShardLayout l = parse_layout(expected_, core_->options.shards, key);
      core_->learn(core_->options.name, expected_, sent_);
      if (l.current().count == new_) {
        throw InvalidArgument("the counter '" + printable(core_->options.name) + "' already has " +
                              std::to_string(new_) + " shards; nothing to reshard");
      }
      if (l.total() + new_ > kMaxShards) {
        throw InvalidArgument("resharding to " + std::to_string(new_) + " shards would make " +
                              std::to_string(l.total() + new_) + " shards over all generations (every read "
                              "reads them all), more than the cap of " + std::to_string(kMaxShards));
      }
      l.generations.back().retired_ms = core_->store->now_ms();
      l.generations.push_back(ShardGeneration{l.total(), new_, 0});
      l.version = static_cast<std::int64_t>(l.generations.size());
      next_ = std::move(l);
      std::vector<Request> batch;
      batch.emplace_back(ScriptCall{&kShardedReshardScript, {key}, {expected_, format_layout(next_)}});
      sent_ = SteadyClock::now();
      return batch;
    }
    const Reply& r = replies[0];
    r.check();
    if (r.type != Reply::Type::Array || r.elements.size() != 2) throw ProtocolError("sharded_reshard: unexpected reply");
    const std::string text = r.elements[1].str;
    core_->learn(core_->options.name, text, sent_);
    if (r.elements[0].as_integer() != 1) {
      const ShardLayout now = parse_layout(text, core_->options.shards, key);
      throw Error("reshard of '" + printable(core_->options.name) + "' to " + std::to_string(new_) +
                  " shards lost to a concurrent reshard: the layout is now version " + std::to_string(now.version) +
                  " with " + std::to_string(now.current().count) +
                  " shards taking the writes; nothing was changed (reshard again if still wanted)");
    }
    complete(std::move(next_));
    return {};
  }

 private:
  std::shared_ptr<Core> core_;
  std::int64_t new_;
  bool read_ = false;
  std::string expected_;
  ShardLayout next_;
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

std::shared_ptr<Op<std::vector<std::int64_t>>> ShardedCounter::make_shard_values() {
  return std::make_shared<ShardReadOp<std::vector<std::int64_t>>>(
      core_, std::vector<std::string>{core_->options.name},
      [](std::vector<std::vector<std::int64_t>>&& v) { return std::move(v.front()); });
}

std::shared_ptr<Op<std::int64_t>> ShardedCounter::make_value() {
  return with_meter(std::make_shared<ShardReadOp<std::int64_t>>(
                        core_, std::vector<std::string>{core_->options.name},
                        [](std::vector<std::vector<std::int64_t>>&& v) { return checked_sum(v.front()); }),
                    Meter::Read);
}

std::shared_ptr<Op<std::vector<std::int64_t>>> ShardedCounter::make_values(const std::vector<std::string>& names) {
  for (const auto& n : names) validate_name(n, "name");
  if (names.empty()) {
    return make_batch_op<std::vector<std::int64_t>>({}, [](std::vector<Reply>&&) { return std::vector<std::int64_t>{}; });
  }
  return std::make_shared<ShardReadOp<std::vector<std::int64_t>>>(
      core_, names, [](std::vector<std::vector<std::int64_t>>&& v) {
        std::vector<std::int64_t> out;
        out.reserve(v.size());
        for (const auto& shards : v) out.push_back(checked_sum(shards));
        return out;
      });
}

std::shared_ptr<Op<ShardLayout>> ShardedCounter::make_reshard(std::int64_t new_shards) {
  if (new_shards < 1 || new_shards > kMaxShards) {
    throw InvalidArgument("new_shards must be between 1 and " + std::to_string(kMaxShards) + ", got " +
                          std::to_string(new_shards));
  }
  return std::make_shared<ReshardOp>(core_, new_shards);
}

ShardLayout ShardedCounter::reshard(std::int64_t new_shards) { return run(*core_->store, *make_reshard(new_shards)); }

std::shared_ptr<Op<ShardLayout>> ShardedCounter::make_layout() { return std::make_shared<LayoutOp>(core_); }

ShardLayout ShardedCounter::layout() { return run(*core_->store, *make_layout()); }

ShardLayout ShardedCounter::cached_layout() const { return core_->known(core_->options.name).layout; }

std::string ShardedCounter::layout_key() const {
  return sharded_layout_key(core_->options.prefix, core_->options.name);
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
