// Refunds, reservations and settlements of the rate strategies (LimiterStrategy::refund,
// reserve, settle): one call of limiter_adjust.lua over the key's state under every limit
// and, when a request id is given, the id's record, so that the change and the record are
// written together (atomically on either store; the memory store runs the script's twin).
// The strategy's own test (cost 1) goes in the same batch, after the script, and reads the
// state afterwards for the caller's Decision: one round trip (a reservation also sends the
// test of its estimate, for the wait of a refusal).
//
// A refund or a settlement credits only the state that still holds the charge, so that no
// refund admits past a limit: a reservation's record keeps where it charged (per limit: the
// fixed window's expire-at, else the charge time) and a refund given the hit's Decision
// (Decision::charged_at_us) sends where the hit charged. Per strategy (never more than was
// charged; limiter_adjust.lua has the details):
//   fixed-window           the charged window's count goes down, while it is the current one
//   sliding-window         the charge's own entries still in the log are removed
//   sliding-window-approx  the charge's own sub-bucket goes down, while it still weighs in
//   token-bucket           tokens come back, at most what has not refilled since the charge
//   gcra                   the arrival time moves back likewise (not before now)
// A refund without a charge time credits the current state, as documented: the current
// window's count, the newest log entries or sub-buckets, the buckets' full cost.
// With a tag (refund(..., tag=), ...), the state is the key's under that hash tag, the one
// hit_all(..., tag=) and hit(..., tag=) charge, and the request id's record is put under
// the same tag, so that the script's keys share a slot on a cluster.
//
// A refund's marker lives as long as the longest window (1 s at least); a reservation's
// record until its deadline. A reservation not settled by then has settled at its
// estimate: its record is gone, and settle() changes nothing (Status::Expired).
#include <algorithm>

#include "limiters/limiter_internal.h"
#include "redcount/common/bounds.h"
#include "redcount/common/errors.h"
#include "redcount/common/util.h"
#include "redcount/common/window.h"

namespace redcount {

std::shared_ptr<Op<Adjustment>> LimiterStrategy::make_refund(const std::vector<RateLimit>&, std::string_view,
                                                              std::int64_t, std::string_view, std::string_view,
                                                              std::optional<std::int64_t>) {
  throw InvalidArgument("refund() is not available for strategy='" + std::string(name()) +
                        "' (it decides leases in flight, not rates: release() gives a lease back)");
}

std::shared_ptr<Op<Adjustment>> LimiterStrategy::make_reserve(const std::vector<RateLimit>&, std::string_view,
                                                               std::int64_t, std::string_view, std::int64_t,
                                                               std::string_view) {
  throw InvalidArgument("reserve() is not available for strategy='" + std::string(name()) +
                        "' (it decides leases in flight, not rates: acquire() takes a slot)");
}

std::shared_ptr<Op<Adjustment>> LimiterStrategy::make_settle(const std::vector<RateLimit>&, std::string_view,
                                                              std::string_view, std::int64_t, std::string_view) {
  throw InvalidArgument("settle() is not available for strategy='" + std::string(name()) +
                        "' (it decides leases in flight, not rates)");
}

namespace detail {
namespace {

enum class Kind { Refund, Reserve, Settle };

class AdjustOp final : public Op<Adjustment> {
 public:
  AdjustOp(std::shared_ptr<Store> store, TimeSource time, std::shared_ptr<const MultiRules> rules,
           std::vector<RateLimit> limits, std::string key, std::string tag, Kind kind, std::int64_t units,
           std::optional<std::int64_t> charged_at_us, std::string record,
           std::int64_t record_ttl_ms, std::shared_ptr<Op<Decision>> after, std::shared_ptr<Op<Decision>> refused)
      : store_(std::move(store)),
        time_(std::move(time)),
        rules_(std::move(rules)),
        limits_(std::move(limits)),
        key_(std::move(key)),
        tag_(std::move(tag)),
        kind_(kind),
        units_(units),
        charged_at_us_(charged_at_us),
        record_(std::move(record)),
        record_ttl_ms_(record_ttl_ms),
        after_(std::move(after)),
        refused_(std::move(refused)) {}

  std::vector<Request> prepare() override {
    if (client_time() && time_.offset_stale()) {
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
      case Step::Adjust:
        if (!client_time() && !replies.empty() && replies.front().is_error() &&
            !ReplyError(replies.front().str).transient()) {
          // clock="server": as hit() does, ask whether the server refuses TIME in scripts.
          failed_ = std::move(replies);
          step_ = Step::Probe;
          std::vector<Request> out;
          out.push_back(ScriptCall{&kTimeProbeScript, {}, {}});
          return out;
        }
        return adjusted(replies);
      case Step::Probe:
        if (replies.size() == 1 && replies.front().is_error() && !ReplyError(replies.front().str).transient()) {
          time_.switch_to_offset();  // for good; nothing was changed (the script failed)
          return prepare();
        }
        step_ = Step::Adjust;
        return adjusted(failed_);
      case Step::Then: {
        auto next = then_->finish(std::move(replies));
        if (!next.empty()) return next;
        return done(then_->take());
      }
    }
    return {};
  }

 private:
  enum class Step { Sync, Adjust, Probe, Then };

  // Fixed windows name keys after the time: always the client's time (with the offset).
  bool client_time() const { return rules_->client_time() || time_.effective() != ClockMode::Server; }

  std::vector<Request> send() {
    step_ = Step::Adjust;
    const std::int64_t now_ms = time_.now_ms();
    ScriptCall call{&kLimiterAdjustScript, {}, {}};
    call.keys.reserve(limits_.size() + 1);
    call.args.reserve(7 + 4 * limits_.size());
    call.args.push_back(client_time() ? std::to_string(now_ms * rules_->time_scale()) : std::string());
    call.args.emplace_back(rules_->adjust_kind());
    call.args.emplace_back(kind_ == Kind::Refund ? "refund" : kind_ == Kind::Reserve ? "reserve" : "settle");
    call.args.push_back(std::to_string(units_));
    call.args.push_back(std::to_string(record_ttl_ms_));
    call.args.push_back(unique_id());
    // Where the refunded units were charged, in the script's unit (µs for gcra, else ms).
    const bool fw = rules_->adjust_kind() == "fw";
    std::optional<std::int64_t> charged_ms;
    if (charged_at_us_) {
      charged_ms = *charged_at_us_ / 1000;  // (not negative: checked when made)
      call.args.push_back(std::to_string(rules_->time_scale() == 1 ? *charged_ms : *charged_at_us_));
    } else {
      call.args.emplace_back();
    }
    for (const RateLimit& l : limits_) {
      call.keys.push_back(rules_->storage_key(l, key_, tag_, now_ms));
      auto args = rules_->adjust_args(l, now_ms);
      // A fixed window's third number: the expire-at of the window the units were charged
      // in, which the script credits only while it is still the current one.
      if (fw && charged_ms) args[2] = rules_->adjust_args(l, *charged_ms)[1];
      for (std::int64_t v : args) call.args.push_back(std::to_string(v));
    }
    if (!record_.empty()) call.keys.push_back(record_);
    std::vector<Request> out;
    out.emplace_back(std::move(call));
    // The tests run after the script in the same batch (a store runs a batch in order).
    after_count_ = append(out, *after_);
    refused_count_ = refused_ ? append(out, *refused_) : 0;
    return out;
  }

  static std::size_t append(std::vector<Request>& out, Op<Decision>& op) {
    auto batch = op.prepare();
    for (auto& r : batch) out.push_back(std::move(r));
    return batch.size();
  }

  std::vector<Request> adjusted(std::vector<Reply>& replies) {
    if (replies.size() != 1 + after_count_ + refused_count_) {
      throw ProtocolError("limiter_adjust: unexpected number of replies");
    }
    const Ints v = integers(replies.front(), 4, "limiter_adjust");
    switch (v[1]) {
      case 0: result_.status = Adjustment::Status::Refused; break;
      case 1: result_.status = Adjustment::Status::Applied; break;
      case 2: result_.status = Adjustment::Status::Duplicate; break;
      case 3: result_.status = Adjustment::Status::Expired; break;
      default: throw ProtocolError("limiter_adjust returned an unexpected status");
    }
    result_.units = v[2];
    result_.estimate = v[3];
    // The state after, read by the strategy's own test.
    const bool refused = result_.status == Adjustment::Status::Refused && refused_;
    then_ = refused ? refused_ : after_;
    const std::size_t first = refused ? 1 + after_count_ : 1;
    const std::size_t count = refused ? refused_count_ : after_count_;
    std::vector<Reply> own(std::make_move_iterator(replies.begin() + static_cast<std::ptrdiff_t>(first)),
                           std::make_move_iterator(replies.begin() + static_cast<std::ptrdiff_t>(first + count)));
    step_ = Step::Then;
    auto next = then_->finish(std::move(own));  // (a clock sync or a rerun may follow)
    if (next.empty()) return done(then_->take());
    return next;
  }

  std::vector<Request> done(Decision d) {
    if (kind_ == Kind::Reserve) {
      d.allowed = result_.status != Adjustment::Status::Refused;
      if (d.allowed) {
        d.retry_after_ms = 0;
      } else {
        d.retry_after_ms = std::max<std::int64_t>(1, d.retry_after_ms);
      }
    }
    result_.decision = std::move(d);
    complete(std::move(result_));
    return {};
  }

  std::shared_ptr<Store> store_;
  TimeSource time_;
  std::shared_ptr<const MultiRules> rules_;
  std::vector<RateLimit> limits_;
  std::string key_;
  std::string tag_;  // empty: the key's untagged state
  Kind kind_;
  std::int64_t units_;
  std::optional<std::int64_t> charged_at_us_;  // refund(): where the units were charged
  std::string record_;
  std::int64_t record_ttl_ms_;
  std::shared_ptr<Op<Decision>> after_, refused_, then_;
  Step step_ = Step::Adjust;
  std::vector<Reply> failed_;  // the batch's replies while the time probe runs
  std::int64_t sent_ms_ = 0;
  std::size_t after_count_ = 0, refused_count_ = 0;  // the tests' requests in the batch
  Adjustment result_;
};

void check_rules(const MultiRules& rules, std::string_view tag) {
  if (rules.adjust_kind().empty()) {
    throw InvalidArgument("refund(), reserve() and settle() are not available for strategy='" +
                          std::string(rules.name()) + "'");
  }
  if (!tag.empty()) validate_name(tag, "tag");
}

void check_units(std::int64_t units, const char* what, std::int64_t least) {
  if (units < least || units > kMaxExact) {
    throw InvalidArgument(std::string(what) + " must be between " + std::to_string(least) + " and 2^53, got " +
                          std::to_string(units));
  }
}

// A refund's marker outlives every window it may concern (1 s at least).
std::int64_t marker_ttl(const std::vector<RateLimit>& limits) {
  std::int64_t ttl = 1000;
  for (const RateLimit& l : limits) ttl = std::max(ttl, l.window_ms + kLimiterGraceMs);
  return ttl;
}

}  // namespace

std::shared_ptr<Op<Adjustment>> make_refund_op(std::shared_ptr<Store> store, const TimeSource& time,
                                               std::shared_ptr<const MultiRules> rules,
                                               const std::vector<RateLimit>& limits, std::string_view key,
                                               std::int64_t cost, std::string_view request_id, std::string_view tag,
                                               std::optional<std::int64_t> charged_at_us,
                                               std::shared_ptr<Op<Decision>> after) {
  check_rules(*rules, tag);
  check_units(cost, "cost", 1);
  if (charged_at_us && *charged_at_us < 0) {
    throw InvalidArgument("charged_at must be >= 0 (µs since the epoch), got " + std::to_string(*charged_at_us));
  }
  std::string record;
  if (!request_id.empty()) {
    validate_request_id(request_id);
    record = rules->record_key(key, "refund", request_id, tag);
  }
  return std::make_shared<AdjustOp>(std::move(store), time, std::move(rules), limits, std::string(key),
                                    std::string(tag), Kind::Refund, cost, charged_at_us, std::move(record),
                                    marker_ttl(limits),
                                    std::move(after), nullptr);
}

std::shared_ptr<Op<Adjustment>> make_reserve_op(std::shared_ptr<Store> store, const TimeSource& time,
                                                std::shared_ptr<const MultiRules> rules,
                                                const std::vector<RateLimit>& limits, std::string_view key,
                                                std::int64_t estimate, std::string_view request_id,
                                                std::int64_t deadline_ms, std::string_view tag,
                                                std::shared_ptr<Op<Decision>> after,
                                                std::shared_ptr<Op<Decision>> refused) {
  check_rules(*rules, tag);
  check_units(estimate, "cost", 1);
  if (request_id.empty()) throw InvalidArgument("reserve() needs a request_id (settle() finds the reservation by it)");
  validate_request_id(request_id);
  if (deadline_ms < 1 || deadline_ms > kMaxLongTimeoutMs) {
    throw InvalidArgument("deadline must be > 0 seconds (at most about 35 years), got " +
                          std::to_string(deadline_ms) + " ms");
  }
  return std::make_shared<AdjustOp>(std::move(store), time, rules, limits, std::string(key), std::string(tag),
                                    Kind::Reserve, estimate, std::nullopt,
                                    rules->record_key(key, "reserve", request_id, tag),
                                    deadline_ms, std::move(after), std::move(refused));
}

std::shared_ptr<Op<Adjustment>> make_settle_op(std::shared_ptr<Store> store, const TimeSource& time,
                                               std::shared_ptr<const MultiRules> rules,
                                               const std::vector<RateLimit>& limits, std::string_view key,
                                               std::string_view request_id, std::int64_t actual, std::string_view tag,
                                               std::shared_ptr<Op<Decision>> after) {
  check_rules(*rules, tag);
  check_units(actual, "actual", 0);
  if (request_id.empty()) throw InvalidArgument("settle() needs the reservation's request_id");
  validate_request_id(request_id);
  return std::make_shared<AdjustOp>(std::move(store), time, rules, limits, std::string(key), std::string(tag),
                                    Kind::Settle, actual, std::nullopt,
                                    rules->record_key(key, "reserve", request_id, tag),
                                    marker_ttl(limits), std::move(after), nullptr);
}

std::shared_ptr<Op<Adjustment>> ScriptedLimiter::make_refund(const std::vector<RateLimit>& limits,
                                                             std::string_view key, std::int64_t cost,
                                                             std::string_view request_id, std::string_view tag,
                                                             std::optional<std::int64_t> charged_at_us) {
  auto after = make_test(limits, key, 1, tag);  // checks the limits, the key and the tag
  return make_refund_op(store_, time_, multi_, limits, key, cost, request_id, tag, charged_at_us, std::move(after));
}

std::shared_ptr<Op<Adjustment>> ScriptedLimiter::make_reserve(const std::vector<RateLimit>& limits,
                                                              std::string_view key, std::int64_t estimate,
                                                              std::string_view request_id,
                                                              std::int64_t deadline_ms, std::string_view tag) {
  auto refused = make_test(limits, key, estimate, tag);  // checks the estimate as hit() checks a cost
  return make_reserve_op(store_, time_, multi_, limits, key, estimate, request_id, deadline_ms, tag,
                         make_test(limits, key, 1, tag), std::move(refused));
}

std::shared_ptr<Op<Adjustment>> ScriptedLimiter::make_settle(const std::vector<RateLimit>& limits,
                                                             std::string_view key, std::string_view request_id,
                                                             std::int64_t actual, std::string_view tag) {
  auto after = make_test(limits, key, 1, tag);
  return make_settle_op(store_, time_, multi_, limits, key, request_id, actual, tag, std::move(after));
}

}  // namespace detail
}  // namespace redcount
