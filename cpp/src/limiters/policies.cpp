// Allow and deny lists, the refusal cache, penalties and the Guard (policies.h).
#include "redcount/limiters/policies.h"

#include <arpa/inet.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstring>
#include <utility>

#include "redcount/common/errors.h"
#include "redcount/common/keys.h"
#include "redcount/limiters/gate.h"
#include "redcount/store/reply.h"
#include "redcount/store/scripts.h"

namespace redcount {
namespace {

// --- addresses -------------------------------------------------------------------------

bool parse_address(std::string_view text, AccessLists::Network& out) {
  if (text.empty() || text.size() > 45) return false;
  char buf[46];
  std::memcpy(buf, text.data(), text.size());
  buf[text.size()] = '\0';
  if (text.find(':') == std::string_view::npos) {
    if (inet_pton(AF_INET, buf, out.address) != 1) return false;
    out.version = 4;
    out.prefix = 32;
    return true;
  }
  if (inet_pton(AF_INET6, buf, out.address) != 1) return false;
  out.version = 6;
  out.prefix = 128;
  return true;
}

// "N" with 0 <= N <= max, digits only.
std::optional<int> parse_prefix(std::string_view text, int max) {
  if (text.empty() || text.size() > 3) return std::nullopt;
  int n = 0;
  for (char c : text) {
    if (c < '0' || c > '9') return std::nullopt;
    n = n * 10 + (c - '0');
  }
  if (n > max) return std::nullopt;
  return n;
}

// Whether bits past `prefix` are set; with `clear`, clears them.
bool host_bits(AccessLists::Network& n, bool clear) {
  const int bytes = n.version == 4 ? 4 : 16;
  bool set = false;
  for (int i = 0; i < bytes; ++i) {
    const int keep = std::clamp(n.prefix - i * 8, 0, 8);
    const auto mask = static_cast<unsigned char>(keep == 8 ? 0xFF : (0xFF << (8 - keep)) & 0xFF);
    if ((n.address[i] & ~mask & 0xFF) != 0) {
      set = true;
      if (clear) n.address[i] = static_cast<unsigned char>(n.address[i] & mask);
    }
  }
  return set;
}

// `inner` lies inside `outer` (same version, at least as long a prefix, same leading bits).
bool subnet_of(const AccessLists::Network& inner, const AccessLists::Network& outer) {
  if (inner.version != outer.version || inner.prefix < outer.prefix) return false;
  const int full = outer.prefix / 8;
  if (std::memcmp(inner.address, outer.address, static_cast<std::size_t>(full)) != 0) return false;
  const int rest = outer.prefix % 8;
  if (rest == 0) return true;
  const auto mask = static_cast<unsigned char>((0xFF << (8 - rest)) & 0xFF);
  return (inner.address[full] & mask) == (outer.address[full] & mask);
}

bool same_network(const AccessLists::Network& a, const AccessLists::Network& b) {
  return a.version == b.version && a.prefix == b.prefix && std::memcmp(a.address, b.address, 16) == 0;
}

bool valid_utf8(std::string_view s) {
  std::size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    std::size_t n = 0;
    std::uint32_t cp = 0;
    if (c < 0x80) {
      ++i;
      continue;
    } else if ((c & 0xE0) == 0xC0) {
      n = 1;
      cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      n = 2;
      cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      n = 3;
      cp = c & 0x07;
    } else {
      return false;
    }
    if (i + n >= s.size()) return false;  // truncated
    for (std::size_t k = 1; k <= n; ++k) {
      const auto d = static_cast<unsigned char>(s[i + k]);
      if ((d & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (d & 0x3F);
    }
    if ((n == 1 && cp < 0x80) || (n == 2 && cp < 0x800) || (n == 3 && cp < 0x10000) || cp > 0x10FFFF ||
        (cp >= 0xD800 && cp <= 0xDFFF)) {
      return false;
    }
    i += n + 1;
  }
  return true;
}

// An entry quoted for an error message (Python's repr of a str, near enough).
std::string quoted(std::string_view s) {
  std::string out = "'";
  for (char c : s) {
    if (c == '\'' || c == '\\') out += '\\';
    out += c;
  }
  return out + "'";
}

// A float as Python's repr writes it: "60.0", "0.0005", "1e-05", "2e+16", "nan", "inf".
std::string py_float(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  char buf[64];
  const double a = std::fabs(v);
  const bool sci = a != 0 && (a >= 1e16 || a < 1e-4);
  auto r = std::to_chars(buf, buf + sizeof buf, v, sci ? std::chars_format::scientific : std::chars_format::fixed);
  std::string out(buf, r.ptr);
  if (sci) {
    // C++ writes "1e-05" and "2e+16" as Python does.
    return out;
  }
  if (out.find('.') == std::string::npos) out += ".0";
  return out;
}

}  // namespace

std::optional<AccessLists::Network> network_of_key(std::string_view key) {
  const auto colon = key.find(':');
  const std::string_view tries[2] = {key, colon == std::string_view::npos ? std::string_view() : key.substr(colon + 1)};
  for (std::string_view text : tries) {
    if (text.empty()) continue;
    AccessLists::Network n;
    const auto slash = text.find('/');
    if (slash == std::string_view::npos) {
      if (parse_address(text, n)) return n;
      continue;
    }
    if (!parse_address(text.substr(0, slash), n)) continue;
    const auto p = parse_prefix(text.substr(slash + 1), n.version == 4 ? 32 : 128);
    if (!p) continue;
    n.prefix = *p;
    host_bits(n, true);
    return n;
  }
  return std::nullopt;
}

AccessLists::AccessLists(const std::vector<std::string>& allow, const std::vector<std::string>& deny) {
  // Deny first: at equal specificity it wins.
  for (const auto* list : {&deny, &allow}) {
    const bool allowed = list == &allow;
    const char* where = allowed ? "allow" : "deny";
    for (const std::string& entry : *list) {
      if (!valid_utf8(entry)) throw InvalidArgument(std::string(where) + ": entry " + quoted(entry) + " is not UTF-8");
      if (entry.empty()) throw InvalidArgument(std::string(where) + ": an empty entry matches no key; remove it");
      const auto slash = entry.find('/');
      Network n;
      if (!parse_address(std::string_view(entry).substr(0, slash), n)) {
        keys_.emplace(entry, allowed);  // a key, matched exactly; a deny entry came first
        continue;
      }
      if (slash != std::string::npos) {
        const auto p = parse_prefix(std::string_view(entry).substr(slash + 1), n.version == 4 ? 32 : 128);
        if (!p) {
          throw InvalidArgument(std::string(where) + ": entry " + quoted(entry) +
                                " is not a valid CIDR (the prefix length must be 0 to " +
                                (n.version == 4 ? "32" : "128") + ")");
        }
        n.prefix = *p;
        if (host_bits(n, false)) {
          throw InvalidArgument(std::string(where) + ": entry " + quoted(entry) + " is not a valid CIDR (" + entry +
                                " has host bits set)");
        }
      }
      n.allowed = allowed;
      const bool denied_already = std::any_of(networks_.begin(), networks_.end(), [&](const Network& m) {
        return !m.allowed && same_network(m, n);
      });
      if (allowed && denied_already) continue;
      networks_.push_back(n);
    }
  }
  std::stable_sort(networks_.begin(), networks_.end(), [](const Network& a, const Network& b) {
    if (a.prefix != b.prefix) return a.prefix > b.prefix;
    return !a.allowed && b.allowed;
  });
}

std::optional<bool> AccessLists::lookup(std::string_view key) const {
  if (!keys_.empty()) {
    auto it = keys_.find(std::string(key));
    if (it != keys_.end()) return it->second;
  }
  if (networks_.empty()) return std::nullopt;
  const auto net = network_of_key(key);
  if (!net) return std::nullopt;
  for (const Network& n : networks_) {
    if (subnet_of(*net, n)) return n.allowed;
  }
  return std::nullopt;
}

std::string refusal_state_key(std::string_view key, std::string_view tag) {
  if (tag.empty()) return std::string(key);
  std::string out;
  out.reserve(tag.size() + key.size() + 4);
  out.append("@{").append(tag).append("}:").append(key);
  return out;
}

std::string limits_text(const std::vector<RateLimit>& limits) {
  std::string out;
  for (const auto& l : limits) {
    if (!out.empty()) out += ';';
    out += l.text();
  }
  return out;
}

// --- the refusal cache -------------------------------------------------------------------

RefusalCache::RefusalCache(std::size_t size, std::function<std::int64_t()> now_ms)
    : size_(size), now_ms_(std::move(now_ms)) {}

std::optional<Decision> RefusalCache::get(std::string_view limits, std::string_view key, std::int64_t cost) {
  const std::int64_t now = now_ms_();
  std::lock_guard<std::mutex> lock(mu_);
  auto it = map_.find(std::string(key));
  if (it == map_.end()) return std::nullopt;
  const Entry& e = it->second;
  if (e.limits != limits || now >= e.until_ms) {
    order_.erase(e.order);
    map_.erase(it);
    return std::nullopt;
  }
  if (cost < e.cost) return std::nullopt;
  ++hits_;
  Decision d;
  d.allowed = false;
  d.limit = e.amount;
  d.remaining = 0;
  d.reset_after_ms = std::max(e.reset_until_ms - now, e.until_ms - now);
  d.retry_after_ms = e.until_ms - now;
  return d;
}

void RefusalCache::put(std::string_view limits, std::string_view key, std::int64_t cost, const Decision& d) {
  if (size_ == 0 || d.allowed || d.unavailable || d.retry_after_ms <= 0) return;
  const std::int64_t now = now_ms_();
  std::lock_guard<std::mutex> lock(mu_);
  std::string k(key);
  auto it = map_.find(k);
  if (it == map_.end()) {
    if (map_.size() >= size_) {
      for (auto o = order_.begin(); o != order_.end();) {
        auto m = map_.find(*o);
        if (m->second.until_ms <= now) {
          map_.erase(m);
          o = order_.erase(o);
        } else {
          ++o;
        }
      }
      while (map_.size() >= size_) {
        map_.erase(order_.front());
        order_.pop_front();
      }
    }
    order_.push_back(k);
    it = map_.emplace(std::move(k), Entry{}).first;
    it->second.order = std::prev(order_.end());
  }
  // An entry replaced in place keeps its place in the order (the oldest still goes first).
  Entry& e = it->second;
  e.limits = std::string(limits);
  e.cost = cost;
  e.until_ms = now + d.retry_after_ms;
  e.reset_until_ms = now + d.reset_after_ms;
  e.amount = d.limit;
}

void RefusalCache::drop(std::string_view key) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = map_.find(std::string(key));
  if (it == map_.end()) return;
  order_.erase(it->second.order);
  map_.erase(it);
}

void RefusalCache::clear() {
  std::lock_guard<std::mutex> lock(mu_);
  map_.clear();
  order_.clear();
}

std::size_t RefusalCache::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return map_.size();
}

std::uint64_t RefusalCache::hits() const {
  std::lock_guard<std::mutex> lock(mu_);
  return hits_;
}

// --- penalties ---------------------------------------------------------------------------

namespace {
// A span in seconds as the whole milliseconds the script gets (truncated, as Python's int()).
double whole_ms(double seconds) { return std::trunc(seconds * 1000.0); }
}  // namespace

PenaltyConfig PenaltyConfig::make(std::int64_t after, double within, double block, double factor,
                                  double max_block) {
  PenaltyConfig p{after, within, block, factor, max_block};
  p.validate();
  return p;
}

void PenaltyConfig::validate() const {
  // The bounds are those penalty.lua (and its twin) accepts, checked when the penalty is
  // made so that a bad setting fails naming the field, not at the first refusal.
  if (after < 1) throw InvalidArgument("Penalty(after=) must be an int >= 1 (refusals), got " + std::to_string(after));
  const std::pair<const char*, double> numbers[] = {
      {"within", within}, {"block", block}, {"factor", factor}, {"max_block", max_block}};
  for (const auto& [name, v] : numbers) {
    if (!std::isfinite(v)) {
      throw InvalidArgument(std::string("Penalty(") + name + "=) must be a finite number, got " + py_float(v));
    }
  }
  if (!(factor >= kPenaltyMinFactor && factor <= kPenaltyMaxFactor)) {
    throw InvalidArgument("Penalty(factor=) must be between 1 and 1,000,000 (1: every block as long), got " +
                          py_float(factor));
  }
  for (const auto& [name, v] : {numbers[0], numbers[1], numbers[3]}) {
    const double ms = whole_ms(v);
    if (!(ms >= 1 && ms <= static_cast<double>(kPenaltyMaxSpanMs))) {
      throw InvalidArgument(std::string("Penalty(") + name +
                            "=) must be between 0.001 and 4398046511.104 seconds (1 ms to 2^42 ms, about 139 "
                            "years), got " +
                            py_float(v));
    }
  }
  if (whole_ms(max_block) < whole_ms(block)) {
    throw InvalidArgument("Penalty(max_block=) must be >= block (" + py_float(block) + "), got " + py_float(max_block));
  }
}

std::int64_t PenaltyConfig::within_ms() const noexcept { return static_cast<std::int64_t>(whole_ms(within)); }
std::int64_t PenaltyConfig::block_ms() const noexcept { return static_cast<std::int64_t>(whole_ms(block)); }
std::int64_t PenaltyConfig::max_block_ms() const noexcept { return static_cast<std::int64_t>(whole_ms(max_block)); }

std::vector<std::string> PenaltyConfig::script_args() const {
  return {std::to_string(after), std::to_string(within_ms()), std::to_string(block_ms()), py_float(factor),
          std::to_string(max_block_ms())};
}

// --- decisions made without the store ----------------------------------------------------

namespace {
std::int64_t smallest(const std::vector<RateLimit>& limits) {
  std::int64_t n = 0;
  bool first = true;
  for (const auto& l : limits) {
    const std::int64_t c = l.capacity();
    if (first || c < n) n = c;
    first = false;
  }
  return n;
}
}  // namespace

Decision allowed_decision(const std::vector<RateLimit>& limits) {
  Decision d;
  d.allowed = true;
  d.limit = d.remaining = smallest(limits);
  return d;
}

Decision denied_decision(const std::vector<RateLimit>& limits) { return blocked_decision(limits, kDeniedRetryAfterMs); }

Decision blocked_decision(const std::vector<RateLimit>& limits, std::int64_t ms) {
  Decision d;
  d.allowed = false;
  d.limit = smallest(limits);
  d.remaining = 0;
  d.reset_after_ms = d.retry_after_ms = ms;
  return d;
}

Decision unavailable_decision(OnUnavailable policy, std::exception_ptr error) {
  try {
    std::rethrow_exception(error);
  } catch (const StoreClosed&) {
    throw;
  } catch (const ConnectionError&) {
    if (policy == OnUnavailable::Raise) throw;
  }
  Decision d;
  d.allowed = policy == OnUnavailable::Allow;
  d.unavailable = true;
  d.retry_after_ms = d.allowed ? 0 : kUnavailableRetryAfterMs;
  return d;
}

// --- the guarded operations --------------------------------------------------------------

namespace {

// An operation complete before it starts (a decision the lists or the cache made): its
// prepare() sends nothing, and every driver completes it at once.
template <class T>
class ReadyOp final : public Op<T> {
 public:
  explicit ReadyOp(T value) { this->complete(std::move(value)); }
  std::vector<Request> prepare() override { return {}; }
  std::vector<Request> finish(std::vector<Reply>) override { return {}; }
};
using DecidedOp = ReadyOp<Decision>;

bool is_connection_error(std::exception_ptr e) {
  try {
    std::rethrow_exception(e);
  } catch (const ConnectionError&) {
    return true;
  } catch (...) {
    return false;
  }
}

// What every guarded decision shares: the steps around the store's decision.
//   gate     (optional) PTTL of the block keys, a batch of its own; a failure counts as no block
//   decide   the strategy's operation, or the same behind the block keys (make_gated)
//   penalty  (a charged refusal under a penalty) penalty.lua counts it and may start a block
//   file     a refusal goes into the refusal cache
// A ConnectionError of the decision is the limiter's on_unavailable; of a gate or the
// penalty script, ignored (the decision itself meets the failure; the refusal stands).
class GuardedOp final : public Op<Decision> {
 public:
  struct Plan {
    std::shared_ptr<Op<Decision>> plain;  // the decision, or
    std::shared_ptr<Op<Gated>> gated;     // the decision behind the block keys
    std::vector<std::string> gate_first;  // block keys checked by PTTL before the decision
    std::vector<RateLimit> limits;        // what a blocked decision reports
    std::string block_cache_key;          // non-empty: a block is filed in the cache under it
    // The penalty's script, after a charged refusal (keys: the refused key's, args).
    bool penalize = false;
    std::string prefix;
    std::vector<std::string> penalty_args;
    std::string penalty_key;  // single key: the key; many: taken from the decision's binding_key
    bool many = false;
    // The refusal cache, after a refusal not under a penalty.
    std::shared_ptr<RefusalCache> cache;
    bool file_refusal = false;
    std::string cache_limits;     // single key: limits_text; many: unused
    std::string cache_key;        // single key: the state key
    std::vector<KeyedLimits> items;  // many: the items asked about
    std::string tag;
    std::int64_t cost = 1;
    OnUnavailable on_unavailable = OnUnavailable::Raise;
  };

  explicit GuardedOp(Plan plan) : p_(std::move(plan)) {
    Operation* inner = p_.gated ? static_cast<Operation*>(p_.gated.get()) : p_.plain.get();
    meter = inner->meter;
    meter_items = inner->meter_items;
  }

  std::vector<Request> prepare() override {
    if (!p_.gate_first.empty()) {
      phase_ = Phase::Gate;
      std::vector<Request> batch;
      for (const auto& k : p_.gate_first) batch.emplace_back(Command{{"PTTL", k}});
      return batch;
    }
    return start_decision();
  }

  std::vector<Request> finish(std::vector<Reply> replies) override {
    switch (phase_) {
      case Phase::Gate: {
        std::int64_t longest = 0;
        for (const Reply& r : replies) {
          if (r.type == Reply::Type::Integer) longest = std::max(longest, r.integer);
        }
        if (longest > 0) return blocked(longest);
        return start_decision();
      }
      case Phase::Decide:
        try {
          return decided(p_.gated ? p_.gated->finish(std::move(replies)) : p_.plain->finish(std::move(replies)));
        } catch (const ConnectionError&) {
          return unavailable(std::current_exception());
        }
      case Phase::Penalty: {
        const Reply& r = replies.at(0);
        r.check();
        if (r.type != Reply::Type::Array || r.elements.empty() || r.elements[0].type != Reply::Type::Integer) {
          throw ProtocolError("the penalty script returned an unexpected reply");
        }
        if (r.elements[0].integer > 0) return blocked(r.elements[0].integer);
        return file(std::move(decision_));
      }
    }
    return {};
  }

  std::vector<Request> fail(std::exception_ptr error) override {
    switch (phase_) {
      case Phase::Gate:
        if (!is_connection_error(error)) std::rethrow_exception(error);
        return start_decision();  // no block known: the decision itself meets the failure
      case Phase::Decide:
        try {
          return decided(p_.gated ? p_.gated->fail(error) : p_.plain->fail(error));
        } catch (const ConnectionError&) {
          return unavailable(std::current_exception());
        }
      case Phase::Penalty:
        if (!is_connection_error(error)) std::rethrow_exception(error);
        return file(std::move(decision_));  // the refusal stands, uncounted
    }
    return {};
  }

 private:
  enum class Phase { Gate, Decide, Penalty };

  std::vector<Request> start_decision() {
    phase_ = Phase::Decide;
    try {
      return decided(p_.gated ? p_.gated->prepare() : p_.plain->prepare());
    } catch (const ConnectionError&) {
      return unavailable(std::current_exception());
    }
  }

  // The inner operation's next batch; when it is done, what follows its decision.
  std::vector<Request> decided(std::vector<Request> next) {
    if (!next.empty()) return next;
    Decision d;
    if (p_.gated) {
      Gated g = p_.gated->take();
      if (!g.decision) return blocked(g.blocked_ms);
      d = std::move(*g.decision);
    } else {
      d = p_.plain->take();
    }
    if (d.allowed || d.unavailable) {
      complete(std::move(d));
      return {};
    }
    if (p_.penalize) {
      std::string key = p_.many ? d.binding_key : p_.penalty_key;
      if (!key.empty()) {
        phase_ = Phase::Penalty;
        decision_ = std::move(d);
        std::vector<Request> batch;
        batch.emplace_back(ScriptCall{&kPenaltyScript,
                                      {penalty_key(p_.prefix, key, "b"), penalty_key(p_.prefix, key, "n"),
                                       penalty_key(p_.prefix, key, "l")},
                                      p_.penalty_args});
        return batch;
      }
    }
    return file(std::move(d));
  }

  std::vector<Request> file(Decision d) {
    if (p_.file_refusal && p_.cache) {
      if (!p_.many) {
        p_.cache->put(p_.cache_limits, p_.cache_key, p_.cost, d);
      } else if (!d.binding_key.empty()) {
        for (const auto& item : p_.items) {
          if (item.key != d.binding_key) continue;
          const bool has = std::any_of(item.limits.begin(), item.limits.end(),
                                       [&](const RateLimit& l) { return l.text() == d.binding_limit; });
          if (!has) continue;
          p_.cache->put(limits_text(item.limits), refusal_state_key(item.key, p_.tag), p_.cost, d);
          break;
        }
      }
    }
    complete(std::move(d));
    return {};
  }

  std::vector<Request> blocked(std::int64_t ms) {
    Decision d = blocked_decision(p_.limits, ms);
    if (p_.cache && !p_.block_cache_key.empty()) p_.cache->put(limits_text(p_.limits), p_.block_cache_key, 0, d);
    complete(std::move(d));
    return {};
  }

  std::vector<Request> unavailable(std::exception_ptr error) {
    complete(unavailable_decision(p_.on_unavailable, error));
    return {};
  }

  Plan p_;
  Phase phase_ = Phase::Decide;
  Decision decision_;
};

}  // namespace

Guard::Guard(std::shared_ptr<Store> store, std::string prefix, Options options)
    : store_(std::move(store)), prefix_(std::move(prefix)), on_unavailable_(options.on_unavailable) {
  if (!options.allow.empty() || !options.deny.empty()) {
    auto lists = std::make_shared<const AccessLists>(options.allow, options.deny);
    if (!lists->empty()) access_ = std::move(lists);
  }
  if (options.refusal_cache > 0) {
    // The limiter's clock: the store's (a ManualClock on memory:// in tests).
    cache_ = std::make_shared<RefusalCache>(options.refusal_cache, [store = store_] { return store->now_ms(); });
  }
  if (options.penalty) {
    options.penalty->validate();
    penalty_ = options.penalty;
  }
}

bool Guard::one_slot() {
  int known = one_slot_.load(std::memory_order_relaxed);
  if (known < 0) {
    // Asked once, on the first hit_all under a penalty (a cluster may fetch its slot table);
    // a store that cannot say keeps the block check a batch of its own.
    try {
      known = store_->nodes().size() <= 1 ? 1 : 0;
    } catch (const Error&) {
      return false;
    }
    one_slot_.store(known, std::memory_order_relaxed);
  }
  return known == 1;
}

const PenaltyConfig* Guard::penalty_for(const CallPenalty& p) const noexcept {
  switch (p.kind) {
    case CallPenalty::Kind::Limiter:
      return penalty_ ? &*penalty_ : nullptr;
    case CallPenalty::Kind::Off:
      return nullptr;
    case CallPenalty::Kind::Given:
      return &p.given;
  }
  return nullptr;
}

namespace {

// PTTL of a block key; a failure in transport is no block known.
class BlockCheckOp final : public Op<std::optional<Decision>> {
 public:
  BlockCheckOp(std::string key, std::vector<RateLimit> limits, std::shared_ptr<RefusalCache> cache, std::string filed)
      : key_(std::move(key)), limits_(std::move(limits)), cache_(std::move(cache)), filed_(std::move(filed)) {}
  std::vector<Request> prepare() override {
    std::vector<Request> batch;
    batch.emplace_back(Command{{"PTTL", key_}});
    return batch;
  }
  std::vector<Request> finish(std::vector<Reply> replies) override {
    const std::int64_t ms =
        !replies.empty() && replies[0].type == Reply::Type::Integer ? replies[0].integer : 0;
    if (ms <= 0) {
      complete(std::nullopt);
      return {};
    }
    Decision d = blocked_decision(limits_, ms);
    if (cache_) cache_->put(limits_text(limits_), filed_, 0, d);
    complete(std::move(d));
    return {};
  }
  std::vector<Request> fail(std::exception_ptr error) override {
    if (!is_connection_error(error)) std::rethrow_exception(error);
    complete(std::nullopt);
    return {};
  }

 private:
  std::string key_;
  std::vector<RateLimit> limits_;
  std::shared_ptr<RefusalCache> cache_;
  std::string filed_;
};

}  // namespace

std::shared_ptr<Op<std::optional<Decision>>> Guard::make_block_check(const std::vector<RateLimit>& limits,
                                                                     std::string_view key,
                                                                     const CallPenalty& penalty) {
  if (penalty_for(penalty) == nullptr) {
    return std::make_shared<ReadyOp<std::optional<Decision>>>(std::nullopt);
  }
  return std::make_shared<BlockCheckOp>(penalty_key(prefix_, key, "b"), limits, cache_, std::string(key));
}

std::shared_ptr<Op<Decision>> Guard::make_after(const std::vector<RateLimit>& limits, std::string_view key,
                                                std::int64_t cost, std::string_view tag, const CallPenalty& penalty,
                                                Decision decided, bool charge,
                                                std::optional<OnUnavailable> u) {
  const PenaltyConfig* pen = penalty_for(penalty);
  GuardedOp::Plan p;
  p.plain = std::make_shared<DecidedOp>(std::move(decided));
  p.limits = limits;
  p.cost = cost;
  p.tag = std::string(tag);
  p.on_unavailable = u.value_or(on_unavailable());
  p.cache = cache_;
  if (pen != nullptr) {
    p.block_cache_key = std::string(key);
    p.penalize = charge;
    p.prefix = prefix_;
    p.penalty_args = pen->script_args();
    p.penalty_key = std::string(key);
  }
  p.file_refusal = pen == nullptr && !penalty_;
  if (cache_) {
    p.cache_limits = limits_text(limits);
    p.cache_key = refusal_state_key(key, tag);
  }
  return std::make_shared<GuardedOp>(std::move(p));
}

std::optional<Decision> Guard::decide_locally(const std::vector<RateLimit>& limits, std::string_view key,
                                              std::int64_t cost, std::string_view tag, const CallPenalty& penalty) {
  if (access_) {
    if (auto listed = access_->lookup(key)) return *listed ? allowed_decision(limits) : denied_decision(limits);
  }
  // With a penalty every refusal must reach the store (to be counted): the cache holds only
  // blocks then, and answers only calls under a penalty or a limiter without one.
  const bool cached = penalty_for(penalty) != nullptr || !penalty_;
  if (cache_ && cached) return cache_->get(limits_text(limits), refusal_state_key(key, tag), cost);
  return std::nullopt;
}

std::shared_ptr<Op<Decision>> Guard::one(LimiterStrategy& strategy, const std::vector<RateLimit>& limits,
                                         std::string_view key, std::int64_t cost, std::string_view tag,
                                         const CallPenalty& penalty, bool charge, std::optional<OnUnavailable> u) {
  auto inner = charge ? strategy.make_hit(limits, key, cost, tag) : strategy.make_test(limits, key, cost, tag);
  if (auto d = decide_locally(limits, key, cost, tag, penalty)) return std::make_shared<DecidedOp>(std::move(*d));
  const PenaltyConfig* pen = penalty_for(penalty);
  GuardedOp::Plan p;
  p.limits = limits;
  p.cost = cost;
  p.tag = std::string(tag);
  p.on_unavailable = u.value_or(on_unavailable());
  p.cache = cache_;
  if (pen == nullptr) {
    p.plain = std::move(inner);
  } else {
    const std::string block = penalty_key(prefix_, key, "b");
    if (tag.empty()) {
      // One round trip: the block check inside the decision's script call.
      p.gated = make_gated(std::move(inner), {block});
    } else {
      // A state under a tag may sit in another slot than the key's block: the block check
      // is a PTTL of its own.
      p.plain = std::move(inner);
      p.gate_first = {block};
    }
    p.block_cache_key = std::string(key);
    p.penalize = charge;
    p.prefix = prefix_;
    p.penalty_args = pen->script_args();
    p.penalty_key = std::string(key);
  }
  p.file_refusal = pen == nullptr && !penalty_;
  if (cache_) {
    p.cache_limits = limits_text(limits);
    p.cache_key = refusal_state_key(key, tag);
  }
  return std::make_shared<GuardedOp>(std::move(p));
}

std::shared_ptr<Op<Decision>> Guard::many(LimiterStrategy& strategy, const std::vector<KeyedLimits>& items,
                                          std::int64_t cost, std::string_view tag, const CallPenalty& penalty,
                                          bool charge, std::optional<OnUnavailable> u) {
  const PenaltyConfig* pen = penalty_for(penalty);
  const bool cached = cache_ && (pen != nullptr || !penalty_);
  std::vector<KeyedLimits> rest;
  rest.reserve(items.size());
  for (const auto& item : items) {
    if (access_) {
      if (auto listed = access_->lookup(item.key)) {
        if (!*listed) return std::make_shared<DecidedOp>(denied_decision(item.limits));
        continue;
      }
    }
    if (cached) {
      if (auto d = cache_->get(limits_text(item.limits), refusal_state_key(item.key, tag), cost)) {
        return std::make_shared<DecidedOp>(std::move(*d));
      }
    }
    rest.push_back(item);
  }
  if (rest.empty() && !items.empty()) return std::make_shared<DecidedOp>(allowed_decision(items.front().limits));
  auto inner = charge ? strategy.make_hit_all(rest, cost, tag) : strategy.make_test_all(rest, cost, tag);
  GuardedOp::Plan p;
  p.many = true;
  p.cost = cost;
  p.tag = std::string(tag);
  p.on_unavailable = u.value_or(on_unavailable());
  p.cache = cache_;
  if (!rest.empty()) p.limits = rest.front().limits;
  if (pen != nullptr && !rest.empty()) {
    std::vector<std::string> blocks;
    blocks.reserve(rest.size());
    for (const auto& item : rest) blocks.push_back(penalty_key(prefix_, item.key, "b"));
    if (one_slot()) {
      // One round trip: every key's block checked inside the one script call.
      p.gated = make_gated(std::move(inner), std::move(blocks));
    } else {
      // A cluster decides keys of several slots: the block check is a batch of its own.
      p.plain = std::move(inner);
      p.gate_first = std::move(blocks);
    }
  } else {
    p.plain = std::move(inner);
  }
  if (pen != nullptr) {
    p.penalize = charge;
    p.prefix = prefix_;
    p.penalty_args = pen->script_args();
  }
  p.file_refusal = pen == nullptr && !penalty_;
  p.items = std::move(rest);
  return std::make_shared<GuardedOp>(std::move(p));
}

std::shared_ptr<Op<Decision>> Guard::make_hit(LimiterStrategy& strategy, const std::vector<RateLimit>& limits,
                                              std::string_view key, std::int64_t cost, std::string_view tag,
                                              const CallPenalty& penalty,
    std::optional<OnUnavailable> on_unavailable) {
  return one(strategy, limits, key, cost, tag, penalty, true, on_unavailable);
}

std::shared_ptr<Op<Decision>> Guard::make_test(LimiterStrategy& strategy, const std::vector<RateLimit>& limits,
                                               std::string_view key, std::int64_t cost, std::string_view tag,
                                               const CallPenalty& penalty,
    std::optional<OnUnavailable> on_unavailable) {
  return one(strategy, limits, key, cost, tag, penalty, false, on_unavailable);
}

std::shared_ptr<Op<Decision>> Guard::make_hit_all(LimiterStrategy& strategy, const std::vector<KeyedLimits>& items,
                                                  std::int64_t cost, std::string_view tag,
                                                  const CallPenalty& penalty,
    std::optional<OnUnavailable> on_unavailable) {
  return many(strategy, items, cost, tag, penalty, true, on_unavailable);
}

std::shared_ptr<Op<Decision>> Guard::make_test_all(LimiterStrategy& strategy, const std::vector<KeyedLimits>& items,
                                                   std::int64_t cost, std::string_view tag,
                                                   const CallPenalty& penalty,
    std::optional<OnUnavailable> on_unavailable) {
  return many(strategy, items, cost, tag, penalty, false, on_unavailable);
}

std::shared_ptr<Op<std::monostate>> Guard::make_reset(LimiterStrategy& strategy, const std::vector<RateLimit>& limits,
                                                      std::string_view key, std::string_view tag) {
  auto op = strategy.make_reset(limits, key, tag);  // validates first
  if (cache_) cache_->drop(refusal_state_key(key, tag));
  return op;
}

}  // namespace redcount
