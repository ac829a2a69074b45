// One decision across several keys (LimiterStrategy::hit_all, test_all), for every
// strategy that has MultiRules.
//
// The keys are grouped by the store's shard (Store::shard_of: one group on a single-node
// store and on memory://, one per hash slot on a cluster). Each group is one request (one
// script call, or reads for a test), and every group goes in one batch: one round trip.
// One group is atomic by itself. With several groups (keys in different cluster slots)
// each group charges only if all its limits allow; when one group refuses, the groups that
// charged are given back their charge in a second batch (charge-then-release): the limits
// are never exceeded, but a concurrent call that lands between the two batches sees the
// charge and may be refused by units given back a moment later.
//
// Time is the limiter's, as for hit(): with clock="server" the scripts read TIME, and when
// every group's script fails while doing so, a probe asks whether the server refuses TIME
// inside scripts; if it does, the time source switches to the measured offset for good
// and the decision runs again (nothing was charged: every group failed).
#include <algorithm>
#include <map>
#include <set>
#include <tuple>

#include "limiters/limiter_internal.h"
#include "redcount/common/errors.h"
#include "redcount/common/util.h"

namespace redcount::detail {
namespace {

struct Entry {
  RateLimit limit;
  std::size_t item = 0;  // index in the caller's items
  std::string key;       // the business key
  std::string storage_key;
};

struct Group {
  std::vector<std::size_t> entries;  // indices into MultiDecision::entries_
  std::vector<RateLimit> limits;     // theirs, in that order
  std::size_t first = 0, count = 0;  // its replies in the batch
  std::shared_ptr<const ScriptArgs> sent;
  std::vector<Outcome> outcomes;
  Ints v;
  bool allowed = false;
};

class MultiDecision final : public Op<Decision> {
 public:
  MultiDecision(std::shared_ptr<Store> store, TimeSource time, std::shared_ptr<const MultiRules> rules,
                std::vector<Entry> entries, std::int64_t cost, std::string tag, bool hit)
      : store_(std::move(store)),
        time_(std::move(time)),
        rules_(std::move(rules)),
        entries_(std::move(entries)),
        cost_(cost),
        tag_(std::move(tag)),
        hit_(hit) {}

  std::vector<Request> prepare() override {
    if ((rules_->client_time() || time_.effective() != ClockMode::Server) && time_.offset_stale()) {
      step_ = Step::Sync;
      return time_.refresh_requests(sent_ms_);
    }
    return send();
  }

  std::vector<Request> finish(std::vector<Reply> replies) override {
    switch (step_) {
      case Step::Sync:
        time_.refresh_done(replies, sent_ms_);
        return send();
      case Step::Decide:
        if (server_time_ && all_failed(replies)) {
          // As ClockedScript: error replies say little about which command failed inside a
          // script, so ask whether TIME is the reason.
          failed_ = std::move(replies);
          step_ = Step::Probe;
          std::vector<Request> out;
          out.push_back(ScriptCall{&kTimeProbeScript, {}, {}});
          return out;
        }
        return decide(replies);
      case Step::Probe: {
        if (replies.size() != 1) throw ProtocolError("hit_all: expected one reply to the time probe");
        const Reply& r = replies.front();
        if (r.is_error() && !ReplyError(r.str).transient()) {
          time_.switch_to_offset();
          return prepare();
        }
        step_ = Step::Decide;
        return decide(failed_);  // the groups' own errors
      }
      case Step::Release:
        // A give-back that failed leaves the charge to expire with its window; the decision
        // (a refusal) stands either way.
        complete(std::move(decision_));
        return {};
    }
    return {};
  }

 private:
  enum class Step { Sync, Decide, Probe, Release };

  // True when every group's reply is a non-transient error reply (so none charged).
  bool all_failed(const std::vector<Reply>& replies) const {
    std::size_t expected = 0;
    for (const Group& g : groups_) expected += g.count;
    if (replies.size() != expected || groups_.empty()) return false;
    for (const Group& g : groups_) {
      bool failed = false;
      for (std::size_t i = g.first; i < g.first + g.count; ++i) {
        const Reply& r = replies[i];
        if (r.is_error() && !ReplyError(r.str).transient()) failed = true;
      }
      if (!failed) return false;
    }
    return true;
  }

  std::vector<Request> send() {
    step_ = Step::Decide;
    now_ms_ = time_.now_ms();
    std::optional<std::int64_t> now;
    // Server time: each script reads its node's TIME (fixed windows name keys after the
    // time, so they use the client's time corrected by the measured offset instead).
    if (rules_->client_time() || time_.effective() != ClockMode::Server) now = now_ms_ * rules_->time_scale();
    server_time_ = !now.has_value();
    std::map<std::uint32_t, std::size_t> by_shard;
    groups_.clear();
    for (std::size_t i = 0; i < entries_.size(); ++i) {
      Entry& e = entries_[i];
      e.storage_key = rules_->storage_key(e.limit, e.key, tag_, now_ms_);
      auto [it, fresh] = by_shard.emplace(store_->shard_of(e.storage_key), groups_.size());
      if (fresh) groups_.emplace_back();
      groups_[it->second].entries.push_back(i);
    }
    std::vector<Request> batch;
    for (Group& g : groups_) {
      std::vector<std::string> keys;
      g.limits.clear();
      g.limits.reserve(g.entries.size());
      keys.reserve(g.entries.size());
      for (std::size_t i : g.entries) {
        g.limits.push_back(entries_[i].limit);
        keys.push_back(entries_[i].storage_key);
      }
      auto requests = rules_->group(g.limits, std::move(keys), cost_, hit_, now, now_ms_, g.sent);
      g.first = batch.size();
      g.count = requests.size();
      for (auto& r : requests) batch.push_back(std::move(r));
    }
    return batch;
  }

  std::vector<Request> decide(std::vector<Reply>& replies) {
    std::size_t expected = 0;
    for (const Group& g : groups_) expected += g.count;
    if (replies.size() != expected) throw ProtocolError("hit_all: unexpected number of replies");
    bool allowed = true;
    for (Group& g : groups_) {
      std::vector<Reply> own(std::make_move_iterator(replies.begin() + static_cast<std::ptrdiff_t>(g.first)),
                             std::make_move_iterator(replies.begin() + static_cast<std::ptrdiff_t>(g.first + g.count)));
      g.allowed = rules_->read(g.limits, cost_, hit_, own, g.sent.get(), now_ms_, g.outcomes, g.v);
      // A group that allowed (and maybe charged) refuses nothing, whatever its state now.
      if (g.allowed) {
        for (Outcome& o : g.outcomes) {
          o.refuses = false;
          o.retry_after_ms = 0;
        }
      }
      allowed &= g.allowed;
    }
    // The outcomes in the caller's order, folded as one key's limits are.
    std::vector<Outcome> outcomes(entries_.size());
    for (const Group& g : groups_) {
      for (std::size_t j = 0; j < g.entries.size(); ++j) outcomes[g.entries[j]] = g.outcomes[j];
    }
    std::size_t binding = 0;
    decision_ = combine(outcomes, allowed, &binding);
    decision_.binding_limit = entries_[binding].limit.text();
    decision_.binding_key = entries_[binding].key;
    // Each item's own figures: the tightest of its limits.
    for (std::size_t i = 0; i < entries_.size(); ++i) {
      const std::size_t item = entries_[i].item;
      if (item >= decision_.per_item.size()) decision_.per_item.resize(item + 1, {0, -1});
      auto& [amount, remaining] = decision_.per_item[item];
      if (remaining < 0 || outcomes[i].remaining < remaining) {
        amount = outcomes[i].amount;
        remaining = outcomes[i].remaining;
      }
    }
    std::vector<Request> give_back;
    if (hit_ && !allowed) {
      for (const Group& g : groups_) {
        if (!g.allowed) continue;
        for (std::size_t j = 0; j < g.entries.size(); ++j) {
          const Entry& e = entries_[g.entries[j]];
          rules_->release(e.limit, e.storage_key, cost_, g.v, g.sent.get(), now_ms_, give_back);
        }
      }
    }
    if (give_back.empty()) {
      complete(std::move(decision_));
      return {};
    }
    step_ = Step::Release;
    return give_back;
  }

  std::shared_ptr<Store> store_;
  TimeSource time_;
  std::shared_ptr<const MultiRules> rules_;
  std::vector<Entry> entries_;
  std::int64_t cost_;
  std::string tag_;
  bool hit_;
  Step step_ = Step::Decide;
  std::int64_t sent_ms_ = 0, now_ms_ = 0;
  std::vector<Group> groups_;
  Decision decision_;
  bool server_time_ = false;   // the scripts of the batch in flight read TIME themselves
  std::vector<Reply> failed_;  // the batch's replies while the probe runs
};

// ScriptedRules as MultiRules: a group is one call of the strategy's script over the
// group's keys (the scripts take any number of keys, one per limit).
class ScriptedMulti final : public MultiRules {
 public:
  explicit ScriptedMulti(std::shared_ptr<const ScriptedRules> rules) : rules_(std::move(rules)) {}
  std::string_view name() const noexcept override { return rules_->name(); }
  void check(const std::vector<RateLimit>& limits, std::int64_t cost) const override {
    rules_->check(limits);
    validate_cost(limits, cost, rules_->cost_by_capacity());
    if (cost > rules_->max_cost()) require_member_cost(cost, rules_->name());
  }
  std::int64_t time_scale() const noexcept override { return rules_->time_scale(); }
  std::string storage_key(const RateLimit& limit, std::string_view key, std::string_view tag,
                          std::int64_t) const override {
    return rules_->storage_key(limit, key, tag);
  }
  std::vector<Request> group(const std::vector<RateLimit>& limits, std::vector<std::string> keys, std::int64_t cost,
                             bool hit, std::optional<std::int64_t> now, std::int64_t,
                             std::shared_ptr<const ScriptArgs>& sent) const override {
    ScriptCall c = rules_->call(limits, std::move(keys), cost, hit, now);
    sent = c.typed;
    std::vector<Request> out;
    out.emplace_back(std::move(c));
    return out;
  }
  bool read(const std::vector<RateLimit>& limits, std::int64_t cost, bool, std::vector<Reply>& replies,
            const ScriptArgs* sent, std::int64_t, std::vector<Outcome>& out, Ints& v) const override {
    if (replies.size() != 1) throw ProtocolError(std::string(rules_->script().name) + ": expected one reply");
    const Reply& reply = replies.front();
    const auto* timed = static_cast<const TimedArgs*>(sent);
    if (timed && timed->answered && reply.type == Reply::Type::Status && reply.str == kAnsweredInPlace) {
      v = timed->ints;  // the typed twin's answer
      if (v.size() != rules_->reply_size(limits)) {
        throw ProtocolError(std::string(rules_->script().name) + " returned an unexpected reply");
      }
    } else {
      v = integers(reply, rules_->reply_size(limits), rules_->script().name);
    }
    out = rules_->outcomes(limits, cost, v);
    return v[1] == 1;
  }
  void release(const RateLimit& limit, const std::string& key, std::int64_t cost, const Ints& v,
               const ScriptArgs* sent, std::int64_t, std::vector<Request>& out) const override {
    rules_->release(limit, key, cost, v, sent, out);
  }
  std::string_view adjust_kind() const noexcept override { return rules_->adjust_kind(); }
  std::array<std::int64_t, 4> adjust_args(const RateLimit& l, std::int64_t) const override {
    return rules_->adjust_args(l);
  }
  std::string record_key(std::string_view key, std::string_view what, std::string_view request_id,
                         std::string_view tag) const override {
    return rules_->record_key(key, what, request_id, tag);
  }

 private:
  std::shared_ptr<const ScriptedRules> rules_;
};

}  // namespace

std::shared_ptr<const MultiRules> scripted_multi(std::shared_ptr<const ScriptedRules> rules) {
  return std::make_shared<ScriptedMulti>(std::move(rules));
}

std::shared_ptr<Op<Decision>> make_multi_decision(std::shared_ptr<Store> store, const TimeSource& time,
                                                  std::shared_ptr<const MultiRules> rules,
                                                  const std::vector<KeyedLimits>& items, std::int64_t cost,
                                                  std::string_view tag, bool hit) {
  // Everything is checked here, before anything is sent: bad input stores nothing.
  if (items.empty()) throw InvalidArgument("hit_all() needs at least one (limit, key) pair");
  if (!tag.empty()) validate_name(tag, "tag");
  if (cost < 1) throw InvalidArgument("cost must be >= 1, got " + std::to_string(cost));
  std::vector<Entry> entries;
  std::set<std::pair<std::string_view, std::int64_t>> seen;  // (key, window): one state each
  for (std::size_t i = 0; i < items.size(); ++i) {
    const KeyedLimits& it = items[i];
    require_limits(it.limits);
    validate_key(it.key);
    rules->check(it.limits, cost);
    for (const RateLimit& l : it.limits) {
      if (!seen.emplace(it.key, l.window_ms).second) {
        throw InvalidArgument("'" + l.text() + "' for key '" + it.key +
                              "': that key already has a limit with the same window; a key keeps one state "
                              "per window whatever the amount, so give one limit per window (the stricter one)");
      }
      entries.push_back(Entry{l, i, it.key, {}});
    }
  }
  return std::make_shared<MultiDecision>(std::move(store), time, std::move(rules), std::move(entries), cost,
                                         std::string(tag), hit);
}

}  // namespace redcount::detail
