// The memory store's native twin of limiter_adjust.lua (refunds, reservations and
// settlements of the rate strategies' state): the same reads and writes on the keyspace,
// in C++. Keep it in step with the Lua file; the parity tests run both.
#include <algorithm>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "memory/twins/twins.h"
#include "redcount/common/bounds.h"
#include "redcount/common/errors.h"
#include "redcount/common/util.h"
#include "store/script_args.h"

namespace redcount::twins {
namespace {

using detail::ceil_div;
using detail::sat_add;
using detail::sat_mul;
using detail::sat_sub;

struct Limit {
  std::int64_t a = 0, b = 0, c = 0, d = 0;  // the four numbers of limiter_adjust.lua
};

// One strategy's state operations over keys[i] (see the Lua file's give/allows/charge).
class Adjuster {
 public:
  Adjuster(Keyspace& ks, const std::vector<std::string>& keys, std::string kind, std::int64_t now,
           std::string uid, std::vector<Limit> limits)
      : ks_(ks), keys_(keys), kind_(std::move(kind)), now_(now), uid_(std::move(uid)), l_(std::move(limits)) {}

  // Gives back up to c of a charge of `charged` made at `mark` (nullopt: unknown, the
  // current state); see the Lua file's head for what each strategy may credit.
  std::int64_t give(std::size_t i, std::int64_t c, std::optional<std::int64_t> mark, std::int64_t charged) {
    const std::string& k = keys_[i];
    if (kind_ == "fw") {
      if (mark && *mark != l_[i].b) return 0;  // that window has ended
      const std::int64_t have = count(i);
      if (have <= 0) return 0;
      const std::int64_t g = std::min(have, c);
      ks_.incrby(k, -g);
      return g;
    }
    if (kind_ == "sw") {
      if (!mark) {
        const std::int64_t g = std::min(trim(i), c);
        if (g > 0) {
          for (const auto& [member, score] : ks_.zrange(k, -g, -1)) ks_.zrem(k, member);
        }
        return g;
      }
      trim(i);
      const std::int64_t own = std::min(charged, l_[i].a);
      const std::int64_t g = own - std::min(charged - c, own);
      if (g <= 0) return 0;
      const auto at = static_cast<double>(*mark);
      const auto mine = ks_.zrangebyscore(k, at, at, g);
      for (const auto& [member, score] : mine) ks_.zrem(k, member);
      return static_cast<std::int64_t>(mine.size());
    }
    if (kind_ == "swa") {
      const std::int64_t bucket = l_[i].b, sub = l_[i].c;
      const std::int64_t cur = now_ / bucket;
      if (mark) {
        const std::int64_t idx = *mark / bucket;
        if (idx < cur - sub || idx > cur) return 0;  // no longer weighs in
        const std::int64_t g = std::min(field(i, idx), c);
        if (g <= 0) return 0;
        if (ks_.hincrby(k, std::to_string(idx), -g) <= 0) ks_.hdel(k, std::to_string(idx));
        return g;
      }
      std::int64_t left = c;
      for (std::int64_t idx = cur; idx >= cur - sub && left > 0; --idx) {
        const std::int64_t have = field(i, idx);
        if (have <= 0) continue;
        const std::int64_t g = std::min(have, left);
        if (ks_.hincrby(k, std::to_string(idx), -g) <= 0) ks_.hdel(k, std::to_string(idx));
        left -= g;
      }
      return c - left;
    }
    if (kind_ == "tb") {
      const std::int64_t amount = l_[i].a, window = l_[i].b, full = l_[i].c * l_[i].b;
      std::int64_t back = sat_mul(c, window);
      if (mark) {
        // What has not refilled since the charge (units of 1/window token).
        const std::int64_t refilled = sat_mul(std::max<std::int64_t>(0, sat_sub(now_, *mark)), amount);
        back = std::min(back, std::max<std::int64_t>(0, sat_sub(sat_mul(charged, window), refilled)));
      }
      const std::int64_t lv = level(i);
      const std::int64_t after = std::min(full, sat_add(lv, back));
      store_level(i, after);
      return ceil_div(after - lv, window);  // a token partly refilled counts as given
    }
    const std::int64_t interval = l_[i].a;  // gcra
    std::int64_t back = sat_mul(c, interval);
    if (mark) {
      const std::int64_t elapsed = std::max<std::int64_t>(0, sat_sub(now_, *mark));
      back = std::min(back, std::max<std::int64_t>(0, sat_sub(sat_mul(charged, interval), elapsed)));
    }
    const std::int64_t t = tat(i);
    const std::int64_t after = std::max(now_, sat_sub(t, back));
    store_tat(i, after);
    return ceil_div(t - after, interval);
  }

  // Where a charge made now is: the window's expire-at (fw), else the time.
  std::int64_t mark(std::size_t i) const { return kind_ == "fw" ? l_[i].b : now_; }

  bool allows(std::size_t i, std::int64_t c) {
    const Limit& l = l_[i];
    if (kind_ == "fw") return sat_add(count(i), c) <= l.a;
    if (kind_ == "sw") return sat_add(trim(i), c) <= l.a;
    if (kind_ == "swa") {
      const std::int64_t bucket = l.b, sub = l.c;
      const std::int64_t cur = now_ / bucket;
      std::int64_t scaled = sat_mul(field(i, cur - sub), bucket - (now_ - cur * bucket));
      for (std::int64_t idx = cur - sub + 1; idx <= cur; ++idx) scaled = sat_add(scaled, sat_mul(field(i, idx), bucket));
      return sat_add(scaled, sat_mul(c, bucket)) <= sat_mul(l.a, bucket);
    }
    if (kind_ == "tb") return level(i) >= sat_mul(c, l.b);
    return sat_sub(sat_add(tat(i), sat_mul(c, l.a)), now_) <= sat_mul(l.b, l.a);  // gcra
  }

  void charge(std::size_t i, std::int64_t c) {
    const std::string& k = keys_[i];
    const Limit& l = l_[i];
    if (kind_ == "fw") {
      if (!parse_int64(ks_.or_reset(k, [&] { return ks_.get(k); }).value_or("0"))) ks_.del(k);
      ks_.incrby(k, c);
      ks_.hold_expiry(k, l.b);
      return;
    }
    if (kind_ == "sw") {
      trim(i);
      const std::int64_t m = std::min(c, l.a);
      const std::string stamp = std::to_string(now_) + ":" + uid_ + ":";
      for (std::int64_t x = 1; x <= m; ++x) ks_.zadd(k, static_cast<double>(now_), stamp + std::to_string(x));
      // Until the newest entry leaves the window (a lease's, stamped ahead, may be newer).
      const auto last = ks_.zrange(k, -1, -1);
      const std::int64_t keep =
          last.empty() ? l.b : std::max(l.b, static_cast<std::int64_t>(last.front().second) - now_ + l.b);
      ks_.pexpireat(k, ks_.now_ms() + keep);
      return;
    }
    if (kind_ == "swa") {
      const std::int64_t bucket = l.b, sub = l.c;
      const std::int64_t cur = now_ / bucket;
      field(i, cur);
      ks_.hincrby(k, std::to_string(cur), c);
      ks_.pexpireat(k, ks_.now_ms() + (cur + sub + 1) * bucket - now_);
      return;
    }
    if (kind_ == "tb") {
      store_level(i, std::max<std::int64_t>(0, sat_sub(level(i), sat_mul(c, l.b))));
      return;
    }
    store_tat(i, sat_add(tat(i), sat_mul(c, l.a)));  // gcra
  }

 private:
  std::int64_t count(std::size_t i) {
    const std::string& k = keys_[i];
    std::optional<std::string> raw;
    try {
      raw = ks_.get(k);
    } catch (const ReplyError&) {
      return 0;  // another type: counts nothing
    }
    return parse_int64(raw.value_or("0")).value_or(0);
  }

  std::int64_t trim(std::size_t i) {
    const std::string& k = keys_[i];
    ks_.or_reset(k, [&] { return ks_.zremrangebyscore(k, -std::numeric_limits<double>::infinity(),
                                                      static_cast<double>(now_ - l_[i].b)); });
    return ks_.zcard(k);
  }

  std::int64_t field(std::size_t i, std::int64_t idx) {
    const std::string& k = keys_[i];
    auto v = ks_.or_reset(k, [&] { return ks_.hget(k, std::to_string(idx)); });
    return parse_int64(v.value_or("0")).value_or(0);
  }

  std::int64_t level(std::size_t i) {
    const std::string& k = keys_[i];
    const std::int64_t amount = l_[i].a, full = l_[i].c * l_[i].b;
    const std::int64_t t = parse_int64(ks_.or_reset(k, [&] { return ks_.hget(k, "tokens"); }).value_or("")).value_or(-1);
    const auto ts = parse_int64(ks_.hget(k, "ts").value_or(""));
    const auto was = parse_int64(ks_.hget(k, "cap").value_or(""));
    if (t < 0 || !ts) return full;
    std::int64_t held = t;
    if (was && *was != full) held = std::max<std::int64_t>(0, sat_add(t, sat_sub(full, *was)));
    held = std::min(held, full);
    if (now_ > *ts) {
      const std::int64_t elapsed = sat_sub(now_, *ts);
      if (elapsed >= ceil_div(full - held, amount)) return full;
      held = sat_add(held, sat_mul(elapsed, amount));
    }
    return std::min(held, full);
  }

  void store_level(std::size_t i, std::int64_t lv) {
    const std::string& k = keys_[i];
    const std::int64_t amount = l_[i].a, full = l_[i].c * l_[i].b;
    if (lv >= full) {
      ks_.del(k);  // a full bucket is an absent key
      return;
    }
    ks_.hset(k, "tokens", std::to_string(lv));
    ks_.hset(k, "ts", std::to_string(now_));
    ks_.hset(k, "cap", std::to_string(full));
    ks_.pexpireat(k, ks_.now_ms() + std::max<std::int64_t>(1, ceil_div(full - lv, amount)));
  }

  std::int64_t tat(std::size_t i) {
    const std::string& k = keys_[i];
    auto raw = ks_.or_reset(k, [&] { return ks_.get(k); });
    auto t = raw ? parse_int64(*raw) : std::optional<std::int64_t>(0);
    if (!t) {
      ks_.del(k);
      t = 0;
    }
    return std::max(*t, now_);
  }

  void store_tat(std::size_t i, std::int64_t t) {
    const std::string& k = keys_[i];
    ks_.del(k);
    if (t > now_) ks_.set_nx_pxat(k, std::to_string(t), ks_.now_ms() + ceil_div(t - now_, 1000));
  }

  Keyspace& ks_;
  const std::vector<std::string>& keys_;
  std::string kind_;
  std::int64_t now_;
  std::string uid_;
  std::vector<Limit> l_;
};

Reply reply(std::int64_t now, std::int64_t status, std::int64_t units, std::int64_t estimate) {
  return Reply::of_array({Reply::of_integer(now), Reply::of_integer(status), Reply::of_integer(units),
                          Reply::of_integer(estimate)});
}

// The leading digits of a record as a number, as Lua's tonumber(string.match(h, '^%d+')).
std::int64_t leading_int(std::string_view v) {
  std::size_t end = 0;
  while (end < v.size() && v[end] >= '0' && v[end] <= '9') ++end;
  return parse_int64(v.substr(0, end)).value_or(0);
}

// A pending reservation's record, '<estimate>@<mark 1>,<mark 2>,...': its estimate and
// where it charged, per limit (none in a record written before marks were kept).
std::pair<std::int64_t, std::vector<std::optional<std::int64_t>>> pending(std::string_view h) {
  const std::size_t at = h.find('@');
  if (at == std::string_view::npos) return {parse_int64(h).value_or(0), {}};
  std::vector<std::optional<std::int64_t>> marks;
  std::string_view rest = h.substr(at + 1);
  while (!rest.empty()) {
    const std::size_t comma = rest.find(',');
    const std::string_view part = rest.substr(0, comma);
    if (!part.empty()) marks.push_back(parse_int64(part));
    if (comma == std::string_view::npos) break;
    rest = rest.substr(comma + 1);
  }
  return {parse_int64(h.substr(0, at)).value_or(0), std::move(marks)};
}

// SET key value PX ttl (the record), as del + set-if-absent.
void put(Keyspace& ks, const std::string& key, const std::string& value, std::int64_t ttl) {
  ks.del(key);
  ks.set_nx_pxat(key, value, ks.now_ms() + std::max<std::int64_t>(1, ttl));
}

}  // namespace

// The memory store's twin of limiter_adjust.lua; keep the two in step.
Reply native_limiter_adjust(Keyspace& ks, const std::vector<std::string>& keys, const std::vector<std::string>& args) {
  if (args.size() < 7 || (args.size() - 7) % 4 != 0) return detail::malformed("limiter_adjust");
  const std::size_t n = (args.size() - 7) / 4;
  if (keys.size() != n && keys.size() != n + 1) return detail::malformed("limiter_adjust");
  const std::string& kind = args[1];
  const std::string& op = args[2];
  if (kind != "fw" && kind != "sw" && kind != "swa" && kind != "tb" && kind != "gcra") {
    return detail::malformed("limiter_adjust");
  }
  auto now = detail::script_time(ks, args[0], kind == "gcra" ? 1000 : 1);
  auto units = detail::arg_in(args[3], 0, detail::kMaxExact);
  auto ttl = detail::arg_in(args[4], 0, detail::kMaxExact);
  std::optional<std::int64_t> charged_at;
  if (!args[6].empty()) {
    charged_at = detail::arg_in(args[6], 0, std::numeric_limits<std::int64_t>::max());
    if (!charged_at) return detail::malformed("limiter_adjust");
  }
  if (!now || !units || !ttl) return detail::malformed("limiter_adjust");
  std::vector<Limit> limits(n);
  std::vector<std::int64_t> adj_limit_c(n);
  for (std::size_t i = 0; i < n; ++i) {
    auto a = detail::arg_in(args[7 + 4 * i], 0, detail::kMaxExact);
    auto b = detail::arg_in(args[8 + 4 * i], 0, std::numeric_limits<std::int64_t>::max());
    auto c = detail::arg_in(args[9 + 4 * i], 0, detail::kMaxExact);
    auto d = detail::arg_in(args[10 + 4 * i], 0, detail::kMaxExact);
    if (!a || !b || !c || !d) return detail::malformed("limiter_adjust");
    limits[i] = Limit{*a, *b, *c, *d};
    adj_limit_c[i] = *c;
    const bool bad = (kind == "sw" && *b < 1) || (kind == "swa" && (*b < 1 || *c < 1)) ||
                     (kind == "tb" && (*a < 1 || *b < 1 || *c < 1)) || (kind == "gcra" && *a < 1);
    if (bad) return detail::malformed("limiter_adjust");
  }
  const std::optional<std::string> record = keys.size() == n + 1 ? std::optional<std::string>(keys[n]) : std::nullopt;
  if (!record && op != "refund") return detail::malformed("limiter_adjust");
  Adjuster adj(ks, keys, kind, *now, args[5], std::move(limits));
  auto held = [&]() -> std::optional<std::string> {
    if (!record) return std::nullopt;
    return ks.or_reset(*record, [&] { return ks.get(*record); });
  };
  if (op == "refund") {
    if (held()) return reply(*now, 2, 0, 0);
    std::int64_t least = *units;
    for (std::size_t i = 0; i < n; ++i) {
      std::optional<std::int64_t> mark = charged_at;
      if (mark && kind == "fw") mark = adj_limit_c[i];
      least = std::min(least, adj.give(i, *units, mark, *units));
    }
    if (record) put(ks, *record, charged_at ? args[6] : std::string("1"), *ttl);
    return reply(*now, 1, least, 0);
  }
  if (op == "reserve") {
    if (auto h = held()) {
      const std::string_view v = *h;
      return reply(*now, 2, 0, leading_int(v.starts_with("s") ? v.substr(1) : v));
    }
    for (std::size_t i = 0; i < n; ++i) {
      if (!adj.allows(i, *units)) return reply(*now, 0, 0, *units);
    }
    std::string value = std::to_string(*units) + "@";
    for (std::size_t i = 0; i < n; ++i) {
      adj.charge(i, *units);
      if (i > 0) value += ",";
      value += std::to_string(adj.mark(i));
    }
    put(ks, *record, value, *ttl);
    return reply(*now, 1, *units, *units);
  }
  if (op != "settle") return detail::malformed("limiter_adjust");
  auto h = held();
  if (!h) return reply(*now, 3, 0, 0);
  if (h->starts_with("s")) return reply(*now, 2, 0, parse_int64(std::string_view(*h).substr(1)).value_or(0));
  const auto [estimate, marks] = pending(*h);
  const std::int64_t delta = estimate - *units;
  std::int64_t moved = delta;
  for (std::size_t i = 0; i < n; ++i) {
    if (delta > 0) {
      moved = std::min(moved,
                       adj.give(i, delta, i < marks.size() ? marks[i] : std::optional<std::int64_t>(), estimate));
    } else if (delta < 0) {
      adj.charge(i, -delta);
    }
  }
  // SET ... KEEPTTL
  const std::int64_t left = ks.pttl(*record);
  put(ks, *record, "s" + std::to_string(estimate), left > 0 ? left : *ttl);
  return reply(*now, 1, moved, estimate);
}

}  // namespace redcount::twins
