// The fixed-window limiter: one counter per limit and window, named after the window
// (client-side time), incremented by fixed_window_hit.lua only while every limit allows.
// With a calendar, the windows are its periods (calendar.h) and a key carries the
// period's length and start instead of the window length and index.
#include "redcount/limiters/limiter.h"

#include <algorithm>
#include <limits>
#include <random>

#include "limiters/limiter_internal.h"
#include "redcount/limiters/leased.h"
#include "redcount/common/errors.h"
#include "redcount/common/util.h"
#include "redcount/common/window.h"

namespace redcount {
namespace {

using detail::exceeds;
using detail::remaining_of;

// Where one limit's window is now: its position and its key.
struct Place {
  WindowPos pos;
  std::string key;
};

// What every fixed-window operation shares: the limits and key it was made for, and the
// places they resolve to at the time the operation runs (client-side time: the window's
// key is named after it).
struct FixedWindowWork {
  std::shared_ptr<const std::string> prefix;
  std::shared_ptr<const Calendar> calendar;  // null: clock-aligned windows
  // Owned copies (the make_ factories), or the caller's arguments (a synchronous call
  // that runs the operation on its own stack frame).
  std::vector<RateLimit> own_limits;
  std::string own_key;
  const std::vector<RateLimit>* borrowed_limits = nullptr;
  std::string_view borrowed_key;
  std::string tag;  // empty: the key's untagged state
  std::int64_t now = 0;

  const std::vector<RateLimit>& lims() const { return borrowed_limits ? *borrowed_limits : own_limits; }
  std::string_view key() const { return borrowed_limits ? borrowed_key : std::string_view(own_key); }
  std::vector<Place> places;

  void locate_all(std::int64_t at) {
    now = at;
    places.clear();
    places.reserve(lims().size());
    for (const auto& l : lims()) {
      WindowPos pos = calendar ? calendar_pos(l) : locate(WindowSpec{l.window_ms, kLimiterGraceMs, false}, key(), now);
      places.push_back(Place{pos, fixed_window_limiter_key(*prefix, key(), pos.span_ms, pos.index, tag)});
    }
  }

  // A calendar period: the limit's unit was checked when the operation was made.
  WindowPos calendar_pos(const RateLimit& l) const {
    const Period p = calendar->period(calendar_unit(l.unit).value_or(CalendarUnit::Day), now, l.multiple);
    return WindowPos{p.start_ms, p.start_ms, p.end_ms, p.end_ms + kLimiterGraceMs, p.end_ms - p.start_ms};
  }

  std::vector<Request> gets() const {
    std::vector<Request> batch;
    for (const auto& p : places) batch.emplace_back(Command{{"GET", p.key}});
    return batch;
  }

  static std::vector<std::int64_t> read_counts(const std::vector<Reply>& replies) {
    std::vector<std::int64_t> counts;
    for (const Reply& r : replies) {
      // A foreign value (another type, or no number) is garbage that the next hit deletes:
      // it counts nothing.
      if (r.is_error() && r.str.starts_with("WRONGTYPE")) {
        counts.push_back(0);
        continue;
      }
      auto s = r.as_string();
      auto v = s ? parse_int64(*s) : std::nullopt;
      counts.push_back(v.value_or(0));
    }
    return counts;
  }

  // denied_cost: 0 when allowed, else the cost that was refused.
  Decision decide(const std::int64_t* counts, bool allowed, std::int64_t denied_cost) const {
    Decision d;
    d.allowed = allowed;
    d.remaining = std::numeric_limits<std::int64_t>::max();
    std::size_t binding = 0;
    for (std::size_t i = 0; i < lims().size(); ++i) {
      const std::int64_t rem = remaining_of(lims()[i].amount, counts[i]);
      if (rem < d.remaining || (rem == d.remaining && places[i].pos.end_ms > places[binding].pos.end_ms)) {
        d.remaining = rem;
        binding = i;
      }
    }
    if (!allowed) {
      // Denied: the binding limit is the refusing one that frees up last.
      for (std::size_t i = 0; i < lims().size(); ++i) {
        if (!exceeds(counts[i], denied_cost, lims()[i].amount)) continue;
        const std::int64_t wait = places[i].pos.end_ms - now;
        if (wait > d.retry_after_ms) {
          d.retry_after_ms = wait;
          binding = i;
        }
      }
    }
    d.limit = lims()[binding].amount;
    d.reset_after_ms = places[binding].pos.end_ms - now;
    return d;
  }
};

struct FixedWindowHit : FixedWindowWork {
  std::int64_t cost = 1;
  std::shared_ptr<const HitArgs> sent{};  // the typed arguments of the last call
  std::vector<Request> batch(std::int64_t at) {
    locate_all(at);
    auto args = std::make_shared<HitArgs>();
    args->cost = cost;
    ScriptCall call{&kFixedWindowHitScript, {}, {}};
    call.keys.reserve(lims().size());
    for (std::size_t i = 0; i < lims().size(); ++i) {
      call.keys.push_back(std::move(places[i].key));  // places' keys are not read again (decide reads pos)
      args->limits.push_back({lims()[i].amount, places[i].pos.expire_at_ms});
    }
    sent = args;
    call.typed = std::move(args);
    std::vector<Request> out;
    out.emplace_back(std::move(call));
    return out;
  }
  Decision finish(std::vector<Reply>&& replies) const {
    if (replies.size() != 1) throw ProtocolError("fixed_window_hit: expected one reply");
    const Reply& r = replies.front();
    if (r.type == Reply::Type::Status && r.str == kAnsweredInPlace && sent && sent->answered) {
      return decide_from(sent->ints);  // the typed twin's answer
    }
    r.check();
    if (r.type != Reply::Type::Array || r.elements.size() != lims().size() + 1) {
      throw ProtocolError("fixed_window_hit returned an unexpected reply");
    }
    detail::Ints v;
    for (const Reply& e : r.elements) v.push_back(e.as_integer());
    return decide_from(v);
  }
  // v: allowed (1/0), then the count per limit.
  Decision decide_from(const detail::Ints& v) const {
    if (v.size() != lims().size() + 1) throw ProtocolError("fixed_window_hit returned an unexpected reply");
    const bool allowed = v[0] == 1;
    Decision d = decide(v.data() + 1, allowed, allowed ? 0 : cost);
    if (allowed) d.charged_at_us = now * 1000;  // the windows were located at `now`: refund() finds them by it
    return d;
  }
};

struct FixedWindowTest : FixedWindowWork {
  std::int64_t cost = 1;
  std::vector<Request> batch(std::int64_t at) {
    locate_all(at);
    return gets();
  }
  Decision finish(std::vector<Reply>&& replies) const {
    auto counts = read_counts(replies);
    bool allowed = true;
    for (std::size_t i = 0; i < lims().size(); ++i) allowed &= !exceeds(counts[i], cost, lims()[i].amount);
    return decide(counts.data(), allowed, allowed ? 0 : cost);
  }
};

struct FixedWindowStats : FixedWindowWork {
  std::vector<Request> batch(std::int64_t at) {
    locate_all(at);
    return gets();
  }
  std::vector<LimitStats> finish(std::vector<Reply>&& replies) const {
    auto counts = read_counts(replies);
    std::vector<LimitStats> out;
    for (std::size_t i = 0; i < lims().size(); ++i) {
      out.push_back(LimitStats{lims()[i], counts[i], remaining_of(lims()[i].amount, counts[i]),
                               places[i].pos.end_ms - now});
    }
    return out;
  }
};

struct FixedWindowReset : FixedWindowWork {
  std::vector<Request> batch(std::int64_t at) {
    locate_all(at);
    Command del{{"DEL"}};
    for (const auto& p : places) del.args.push_back(p.key);
    std::vector<Request> out;
    out.emplace_back(std::move(del));
    return out;
  }
  std::monostate finish(std::vector<Reply>&& replies) const {
    for (const Reply& r : replies) r.check();
    return {};
  }
};

// hit_all/test_all: a group is one fixed_window_hit.lua call over its keys (a hit) or their
// GETs (a test); a charge is given back with DECRBY.
class FixedWindowMulti final : public detail::MultiRules {
 public:
  FixedWindowMulti(std::string prefix, std::shared_ptr<const Calendar> calendar)
      : prefix_(std::move(prefix)), calendar_(std::move(calendar)) {}
  std::string_view name() const noexcept override { return "fixed-window"; }
  void check(const std::vector<RateLimit>& limits, std::int64_t cost) const override {
    detail::require_no_burst(limits, name());
    if (calendar_) {
      for (const auto& l : limits) require_calendar_unit(l.unit, l.multiple, *calendar_);
    }
    validate_cost(limits, cost);
  }
  bool client_time() const noexcept override { return true; }
  // The same window, and so the same key, as FixedWindowWork gives a single-key hit.
  WindowPos where(const RateLimit& l, std::string_view key, std::int64_t now_ms) const {
    if (calendar_) {
      const Period p = calendar_->period(calendar_unit(l.unit).value_or(CalendarUnit::Day), now_ms, l.multiple);
      return WindowPos{p.start_ms, p.start_ms, p.end_ms, p.end_ms + kLimiterGraceMs, p.end_ms - p.start_ms};
    }
    return locate(WindowSpec{l.window_ms, kLimiterGraceMs, false}, key, now_ms);
  }
  std::string storage_key(const RateLimit& l, std::string_view key, std::string_view tag,
                          std::int64_t now_ms) const override {
    const WindowPos pos = where(l, key, now_ms);
    return fixed_window_limiter_key(prefix_, key, pos.span_ms, pos.index, tag);
  }
  std::vector<Request> group(const std::vector<RateLimit>& limits, std::vector<std::string> keys, std::int64_t cost,
                             bool hit, std::optional<std::int64_t>, std::int64_t now_ms,
                             std::shared_ptr<const ScriptArgs>& sent) const override {
    std::vector<Request> out;
    if (!hit) {
      for (auto& k : keys) out.emplace_back(Command{{"GET", std::move(k)}});
      return out;
    }
    auto args = std::make_shared<HitArgs>();
    args->cost = cost;
    for (const auto& l : limits) args->limits.push_back({l.amount, expire_at(l, now_ms)});
    sent = args;
    out.emplace_back(ScriptCall{&kFixedWindowHitScript, std::move(keys), {}, std::move(args)});
    return out;
  }
  bool read(const std::vector<RateLimit>& limits, std::int64_t cost, bool hit, std::vector<Reply>& replies,
            const ScriptArgs* sent, std::int64_t now_ms, std::vector<detail::Outcome>& out,
            detail::Ints& v) const override {
    bool allowed = true;
    std::size_t at = 0;  // counts start at v[at]
    v.clear();
    if (hit) {
      const Reply& r = replies.front();
      const auto* args = static_cast<const HitArgs*>(sent);
      if (r.type == Reply::Type::Status && r.str == kAnsweredInPlace && args && args->answered) {
        v = args->ints;
      } else {
        r.check();
        if (r.type != Reply::Type::Array) throw ProtocolError("fixed_window_hit returned an unexpected reply");
        for (const Reply& e : r.elements) v.push_back(e.as_integer());
      }
      if (v.size() != limits.size() + 1) throw ProtocolError("fixed_window_hit returned an unexpected reply");
      allowed = v[0] == 1;
      at = 1;
    } else {
      for (std::int64_t c : FixedWindowWork::read_counts(replies)) v.push_back(c);
      for (std::size_t i = 0; i < limits.size(); ++i) allowed &= !exceeds(v[i], cost, limits[i].amount);
    }
    out.clear();
    for (std::size_t i = 0; i < limits.size(); ++i) {
      const RateLimit& l = limits[i];
      const std::int64_t end = where(l, "", now_ms).end_ms;
      detail::Outcome o;
      o.amount = l.amount;
      const std::int64_t count = v[at + i];
      o.count = count;
      o.remaining = remaining_of(l.amount, count);
      o.reset_after_ms = end - now_ms;
      o.refuses = !allowed && exceeds(count, cost, l.amount);
      o.retry_after_ms = o.refuses ? end - now_ms : 0;
      out.push_back(o);
    }
    return allowed;
  }
  void release(const RateLimit& l, const std::string& key, std::int64_t cost, const detail::Ints&, const ScriptArgs*,
               std::int64_t now_ms, std::vector<Request>& out) const override {
    out.emplace_back(Command{{"DECRBY", key, std::to_string(cost)}});
    // The window's own deadline, should the key have expired after all.
    out.emplace_back(Command{{"PEXPIREAT", key, std::to_string(expire_at(l, now_ms)), "NX"}});
  }
  std::string_view adjust_kind() const noexcept override { return "fw"; }
  std::array<std::int64_t, 4> adjust_args(const RateLimit& l, std::int64_t now_ms) const override {
    return {l.amount, expire_at(l, now_ms), 0, 0};
  }
  std::string record_key(std::string_view key, std::string_view what, std::string_view request_id,
                         std::string_view tag) const override {
    return limiter_record_key(prefix_, "fw", key, what, request_id, tag);
  }

 private:
  std::int64_t expire_at(const RateLimit& l, std::int64_t now_ms) const { return where(l, "", now_ms).expire_at_ms; }
  std::string prefix_;
  std::shared_ptr<const Calendar> calendar_;
};

class FixedWindowLimiter final : public LimiterStrategy {
 public:
  FixedWindowLimiter(std::shared_ptr<Store> store, const LimiterOptions& o)
      : LimiterStrategy(store),
        time_(store, o.clock),
        prefix_(std::make_shared<const std::string>(o.prefix)),
        calendar_(o.calendar),
        multi_(std::make_shared<FixedWindowMulti>(o.prefix, o.calendar)) {}

  std::shared_ptr<Op<Decision>> make_hit_all(const std::vector<KeyedLimits>& items, std::int64_t cost,
                                             std::string_view tag) override {
    return detail::make_multi_decision(store_, time_, multi_, items, cost, tag, true);
  }
  std::shared_ptr<Op<Decision>> make_test_all(const std::vector<KeyedLimits>& items, std::int64_t cost,
                                              std::string_view tag) override {
    return detail::make_multi_decision(store_, time_, multi_, items, cost, tag, false);
  }

  // refunds.cpp's operations over this strategy's keys (the window at the time they run).
  std::shared_ptr<Op<Adjustment>> make_refund(const std::vector<RateLimit>& limits, std::string_view key,
                                              std::int64_t cost, std::string_view request_id, std::string_view tag,
                                              std::optional<std::int64_t> charged_at_us) override {
    auto after = make_test(limits, key, 1, tag);  // checks the limits, the key and the tag
    return detail::make_refund_op(store_, time_, multi_, limits, key, cost, request_id, tag, charged_at_us,
                                  std::move(after));
  }
  std::shared_ptr<Op<Adjustment>> make_reserve(const std::vector<RateLimit>& limits, std::string_view key,
                                               std::int64_t estimate, std::string_view request_id,
                                               std::int64_t deadline_ms, std::string_view tag) override {
    check_cost(limits, key, estimate);
    return detail::make_reserve_op(store_, time_, multi_, limits, key, estimate, request_id, deadline_ms, tag,
                                   make_test(limits, key, 1, tag), make_test(limits, key, estimate, tag));
  }
  std::shared_ptr<Op<Adjustment>> make_settle(const std::vector<RateLimit>& limits, std::string_view key,
                                              std::string_view request_id, std::int64_t actual,
                                              std::string_view tag) override {
    auto after = make_test(limits, key, 1, tag);
    return detail::make_settle_op(store_, time_, multi_, limits, key, request_id, actual, tag, std::move(after));
  }

  std::string_view name() const noexcept override { return "fixed-window"; }
  // The window's key is named after the time, so the client must know it: server time
  // comes from the measured offset (ServerOffset) rather than from inside the script.
  ClockMode clock() const noexcept override {
    return time_.requested() == ClockMode::Client ? ClockMode::Client : ClockMode::ServerOffset;
  }

  std::shared_ptr<Op<Decision>> make_hit(const std::vector<RateLimit>& limits, std::string_view key,
                                         std::int64_t cost, std::string_view tag) override {
    check_cost(limits, key, cost);
    FixedWindowHit spec;
    fill(spec, limits, key, tag);
    spec.cost = cost;
    return make_clocked_batch<Decision>(time_, std::move(spec));
  }

  // make_hit's operation on this stack frame, borrowing the arguments: no copies on the
  // hot path.
  Decision hit(const std::vector<RateLimit>& limits, std::string_view key, std::int64_t cost) override {
    check_cost(limits, key, cost);
    FixedWindowHit spec;
    spec.prefix = prefix_;
    spec.calendar = calendar_;
    spec.borrowed_limits = &limits;
    spec.borrowed_key = key;
    spec.cost = cost;
    ClockedBatch<Decision, FixedWindowHit> op(time_, std::move(spec));
    return run(*store_, op);
  }

  std::shared_ptr<Op<LeaseGrant>> make_take_lease(const std::vector<RateLimit>& limits, std::string_view key,
                                                  std::int64_t least, std::int64_t most,
                                                  std::vector<Request> before) override {
    check_cost(limits, key, least);
    return detail::make_fixed_window_lease(time_, prefix_, calendar_, limits, key, least, most, std::move(before));
  }
  std::int64_t lease_now_ms() const override { return time_.now_ms(); }

  std::shared_ptr<Op<Decision>> make_test(const std::vector<RateLimit>& limits, std::string_view key,
                                          std::int64_t cost, std::string_view tag) override {
    check_cost(limits, key, cost);
    FixedWindowTest spec;
    fill(spec, limits, key, tag);
    spec.cost = cost;
    return make_clocked_batch<Decision>(time_, std::move(spec));
  }

  std::shared_ptr<Op<std::vector<LimitStats>>> make_stats(const std::vector<RateLimit>& limits, std::string_view key,
                                                          std::string_view tag) override {
    detail::require_limits(limits);
    check_calendar(limits);
    validate_key(key);
    FixedWindowStats spec;
    fill(spec, limits, key, tag);
    return make_clocked_batch<std::vector<LimitStats>>(time_, std::move(spec));
  }

  std::shared_ptr<Op<std::monostate>> make_reset(const std::vector<RateLimit>& limits, std::string_view key,
                                                 std::string_view tag) override {
    detail::require_limits(limits);
    check_calendar(limits);
    validate_key(key);
    FixedWindowReset spec;
    fill(spec, limits, key, tag);
    return make_clocked_batch<std::monostate>(time_, std::move(spec));
  }

 private:
  void check_cost(const std::vector<RateLimit>& limits, std::string_view key, std::int64_t cost) const {
    detail::require_limits(limits);
    detail::require_no_burst(limits, name());
    check_calendar(limits);
    detail::require_distinct_windows(limits);
    validate_cost(limits, cost);
    validate_key(key);
  }

  // With a calendar, every limit must be one calendar period ("10000/month").
  void check_calendar(const std::vector<RateLimit>& limits) const {
    if (!calendar_) return;
    for (const auto& l : limits) require_calendar_unit(l.unit, l.multiple, *calendar_);
  }

  void fill(FixedWindowWork& w, const std::vector<RateLimit>& limits, std::string_view key,
            std::string_view tag) const {
    if (!tag.empty()) validate_name(tag, "tag");
    w.tag = std::string(tag);
    w.prefix = prefix_;
    w.calendar = calendar_;
    w.own_limits = limits;
    w.own_key = std::string(key);
  }

  TimeSource time_;
  std::shared_ptr<const std::string> prefix_;
  std::shared_ptr<const Calendar> calendar_;
  std::shared_ptr<const detail::MultiRules> multi_;
};

}  // namespace

namespace detail {

std::unique_ptr<LimiterStrategy> make_fixed_window(std::shared_ptr<Store> store, const LimiterOptions& o) {
  return std::make_unique<FixedWindowLimiter>(std::move(store), o);
}

}  // namespace detail
}  // namespace redcount
