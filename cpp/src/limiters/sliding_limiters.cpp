// The sliding-window limiters: the exact log and the weighted sub-bucket estimate.
#include <algorithm>
#include <charconv>
#include <limits>
#include <map>

#include "limiters/limiter_internal.h"
#include "redcount/common/errors.h"
#include "redcount/common/window.h"

namespace redcount {
namespace {

using detail::ceil_div;
using detail::Outcome;

// ------------------------------------------------------------------ exact sliding log

class SlidingLogRules final : public detail::ScriptedRules {
 public:
  using ScriptedRules::ScriptedRules;
  std::string_view name() const noexcept override { return "sliding-window"; }
  const Script& script() const noexcept override { return kSlidingLogScript; }
  std::int64_t max_cost() const noexcept override { return detail::kMaxMembersPerCall; }

  void check(const std::vector<RateLimit>& limits) const override {
    detail::require_limits(limits);
    detail::require_no_burst(limits, name());
    detail::require_members(limits, name());
    detail::require_span(limits, name());
  }

  std::string storage_key(const RateLimit& l, std::string_view key, std::string_view tag) const override {
    return detail::limiter_key(prefix_, "sw", key, l.window_ms, tag);
  }
  std::string_view adjust_kind() const noexcept override { return "sw"; }
  std::array<std::int64_t, 4> adjust_args(const RateLimit& l) const override { return {l.amount, l.window_ms, 0, 0}; }

  ScriptCall call(const std::vector<RateLimit>& limits, std::vector<std::string> keys, std::int64_t cost, bool hit,
                  std::optional<std::int64_t> now) const override {
    auto args = std::make_shared<LogArgs>();
    args->now = now;
    args->hit = hit;
    args->cost = cost;
    args->id = detail::next_unique_id();
    ScriptCall c{&kSlidingLogScript, std::move(keys), {}};
    for (const auto& l : limits) {
      args->amount.push_back(l.amount);
      args->window.push_back(l.window_ms);
    }
    c.typed = std::move(args);
    return c;
  }

  std::size_t reply_size(const std::vector<RateLimit>& limits) const override { return 2 + 3 * limits.size(); }

  // The members the call added: "<now>:<id>:<m>" from the Lua script, "<id>:<m>" from the
  // memory store's twins (the global id from the text twin, the short local one from the
  // typed twin). ZREM of all three forms removes exactly this call's entries on any store.
  void release(const RateLimit&, const std::string& key, std::int64_t cost, const detail::Ints& v,
               const ScriptArgs* sent, std::vector<Request>& out) const override {
    const auto* args = static_cast<const LogArgs*>(sent);
    const std::string global = args->id.global(), local = args->id.local();
    const std::string stamp = std::to_string(v[0]) + ":" + global + ":";
    Command zrem{{"ZREM", key}};
    for (std::int64_t m = 1; m <= cost; ++m) {
      const std::string n = std::to_string(m);
      zrem.args.push_back(stamp + n);
      zrem.args.push_back(global + ":" + n);
      zrem.args.push_back(local + ":" + n);
    }
    out.emplace_back(std::move(zrem));
  }

  std::vector<Outcome> outcomes(const std::vector<RateLimit>& limits, std::int64_t,
                                const detail::Ints& v) const override {
    const std::int64_t now = v[0];
    std::vector<Outcome> outcomes;
    for (std::size_t i = 0; i < limits.size(); ++i) {
      const std::int64_t count = v[2 + 3 * i], newest = v[3 + 3 * i], need_at = v[4 + 3 * i];
      Outcome o;
      o.amount = limits[i].amount;
      o.count = count;
      o.remaining = detail::remaining_of(limits[i].amount, count);
      o.reset_after_ms = count > 0 ? std::max<std::int64_t>(0, newest + limits[i].window_ms - now) : 0;
      o.refuses = need_at > 0;
      o.retry_after_ms = o.refuses ? std::max<std::int64_t>(1, need_at - now) : 0;
      outcomes.push_back(o);
    }
    return outcomes;
  }
};

// ---------------------------------------------------------- approximate sliding window

class SlidingApproxRules final : public detail::ScriptedRules {
 public:
  SlidingApproxRules(std::string prefix, std::int64_t k)
      : ScriptedRules(std::move(prefix)), k_(k), kind_("swa" + std::to_string(k_)) {}

  std::string_view name() const noexcept override { return "sliding-window-approx"; }
  const Script& script() const noexcept override { return kSlidingApproxScript; }

  void check(const std::vector<RateLimit>& limits) const override {
    detail::require_limits(limits);
    detail::require_no_burst(limits, name());
    detail::require_span(limits, name());
    detail::require_exact(limits, name(), false);
    for (const auto& l : limits) {
      if (l.window_ms % k_ != 0) {
        throw InvalidArgument("'" + l.text() + "': " + std::to_string(k_) + " sub-buckets do not divide its window of " +
                              std::to_string(l.window_ms) + " ms evenly");
      }
    }
  }

  std::string storage_key(const RateLimit& l, std::string_view key, std::string_view tag) const override {
    return detail::limiter_key(prefix_, kind_, key, l.window_ms, tag);
  }
  std::string_view adjust_kind() const noexcept override { return "swa"; }
  std::array<std::int64_t, 4> adjust_args(const RateLimit& l) const override {
    return {l.amount, l.window_ms / k_, k_, 0};
  }

  ScriptCall call(const std::vector<RateLimit>& limits, std::vector<std::string> keys, std::int64_t cost, bool hit,
                  std::optional<std::int64_t> now) const override {
    auto args = std::make_shared<ApproxArgs>();
    args->now = now;
    args->hit = hit;
    args->cost = cost;
    ScriptCall c{&kSlidingApproxScript, std::move(keys), {}};
    for (const auto& l : limits) {
      args->limits.push_back(ApproxArgs::Limit{l.amount, l.window_ms / k_, k_});
    }
    c.typed = std::move(args);
    return c;
  }

  std::size_t reply_size(const std::vector<RateLimit>& limits) const override {
    return 2 + static_cast<std::size_t>(k_ + 1) * limits.size();
  }

  // The call charged sub-bucket floor(now / bucket_ms); the key lives at least a window
  // after that, so the decrement never meets a missing key.
  void release(const RateLimit& l, const std::string& key, std::int64_t cost, const detail::Ints& v,
               const ScriptArgs*, std::vector<Request>& out) const override {
    const std::int64_t cur = v[0] / (l.window_ms / k_);
    out.emplace_back(Command{{"HINCRBY", key, std::to_string(cur), std::to_string(-cost)}});
    // Should the key have expired after all, the hash HINCRBY made must not live forever.
    out.emplace_back(Command{{"PEXPIRE", key, std::to_string(l.window_ms), "NX"}});
  }

  std::vector<Outcome> outcomes(const std::vector<RateLimit>& limits, std::int64_t cost,
                                const detail::Ints& v) const override {
    const std::size_t per = static_cast<std::size_t>(k_ + 1);
    const std::int64_t now = v[0];
    std::vector<Outcome> out;
    out.reserve(limits.size());
    for (std::size_t i = 0; i < limits.size(); ++i) out.push_back(outcome(limits[i], v.data() + 2 + per * i, now, cost));
    return out;
  }

 private:
  // c[off] = count of sub-bucket cur-k+off. Everything is scaled by the bucket length.
  Outcome outcome(const RateLimit& l, const std::int64_t* c, std::int64_t now, std::int64_t cost) const {
    const std::int64_t b = l.window_ms / k_;
    const std::int64_t cur = now / b;
    const std::int64_t e = now - cur * b;
    // With no further hits, at offset ep into sub-bucket cur + j the estimate (times b) is
    //   recent(j) + old(j) * (b - ep),
    // recent(j) = b * (sum of c over sub-buckets cur+j-k+1 .. cur), old(j) = c[cur+j-k].
    auto count_of = [&](std::int64_t idx) -> std::int64_t {
      return idx >= cur - k_ && idx <= cur ? c[idx - cur + k_] : 0;
    };
    auto recent = [&](std::int64_t j) {
      std::int64_t sum = 0;
      for (std::int64_t idx = cur + j - k_ + 1; idx <= cur; ++idx) sum += count_of(idx) * b;
      return sum;
    };
    auto old = [&](std::int64_t j) { return count_of(cur + j - k_); };
    Outcome o;
    o.amount = l.amount;
    const std::int64_t scaled = recent(0) + old(0) * (b - e);
    o.count = ceil_div(scaled, b);
    o.remaining = detail::remaining_of(l.amount, o.count);
    // Empty once the newest non-empty sub-bucket has fully aged out.
    std::int64_t newest = -1;
    for (std::int64_t idx = cur; idx >= cur - k_; --idx) {
      if (count_of(idx) != 0) {
        newest = idx;
        break;
      }
    }
    o.reset_after_ms = newest < 0 ? 0 : std::max<std::int64_t>(0, (newest + k_ + 1) * b - now);
    const std::int64_t bound = (l.amount - cost) * b;  // allowed when the estimate is <= this
    if (scaled > bound) {
      o.refuses = true;
      // The first time t >= now at which the estimate allows `cost`; by sub-bucket cur+k+1
      // every charged sub-bucket has aged out, so the loop always finds one.
      std::int64_t when = (cur + k_ + 1) * b;
      for (std::int64_t j = 0; j <= k_; ++j) {
        const std::int64_t start = j == 0 ? e : 0;
        const std::int64_t r = recent(j), w = old(j);
        if (r + w * 1 > bound) continue;  // still refused at the sub-bucket's last ms
        std::int64_t ep = start;
        if (r + w * (b - start) > bound) ep = std::max(start, b - (bound - r) / w);  // w > 0 here
        when = (cur + j) * b + ep;
        break;
      }
      o.retry_after_ms = std::max<std::int64_t>(1, when - now);
    }
    return o;
  }

  std::int64_t k_;
  std::string kind_;  // "swa<k>"
};

}  // namespace



namespace detail {
std::unique_ptr<LimiterStrategy> make_sliding_log(std::shared_ptr<Store> store, const LimiterOptions& o) {
  return std::make_unique<ScriptedLimiter>(store, o, std::make_shared<SlidingLogRules>(o.prefix));
}
std::unique_ptr<LimiterStrategy> make_sliding_approx(std::shared_ptr<Store> store, const LimiterOptions& o) {
  return std::make_unique<ScriptedLimiter>(store, o, std::make_shared<SlidingApproxRules>(o.prefix, o.sub_buckets));
}
}  // namespace detail
}  // namespace redcount
