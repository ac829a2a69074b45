#include "redcount/memory_store.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <limits>

#include "redcount/errors.h"
#include "redcount/util.h"

namespace redcount {
namespace {

constexpr const char* kNotInteger = "ERR value is not an integer or out of range";
constexpr const char* kOverflow = "ERR increment or decrement would overflow";
constexpr const char* kSyntax = "ERR syntax error";
constexpr const char* kWrongType = "WRONGTYPE Operation against a key holding the wrong kind of value";
constexpr const char* kNotFloat = "ERR value is not a valid float";
constexpr const char* kBadRange = "ERR min or max is not a float";

std::string upper(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return out;
}

Reply wrong_args(std::string_view cmd) {
  return Reply::of_error("ERR wrong number of arguments for '" + ascii_lower(cmd) + "' command");
}

std::int64_t int64_arg(const std::string& s) {
  auto v = parse_int64(s);
  if (!v) throw ReplyError(kNotInteger);
  return *v;
}

// A score as ZADD reads it (Redis string2d): strtod over the whole argument, no leading
// space, no NaN, no overflow to infinity or underflow to zero ("inf" itself is fine).
std::optional<double> parse_score(const std::string& s) {
  if (s.empty() || std::isspace(static_cast<unsigned char>(s[0]))) return std::nullopt;
  errno = 0;
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  if (end != s.c_str() + s.size() || std::isnan(v)) return std::nullopt;
  if (errno == ERANGE && (std::isinf(v) || v == 0.0)) return std::nullopt;
  return v;
}

// A score interval of ZCOUNT, ZRANGEBYSCORE and ZREMRANGEBYSCORE.
struct ScoreRange {
  double min = 0, max = 0;
  bool minex = false, maxex = false;  // exclusive ends
  bool empty() const { return min > max || (min == max && (minex || maxex)); }
};

// One end of a score range as Redis reads it (zslParseRange): an optional '(' for an
// exclusive end, then strtod up to the first NUL. That is laxer than ZADD: leading
// space and overflow to +-inf pass, and an empty bound reads as 0.
bool parse_bound(const std::string& s, double& value, bool& exclusive) {
  const char* p = s.c_str();
  exclusive = *p == '(';
  if (exclusive) ++p;
  char* end = nullptr;
  value = std::strtod(p, &end);
  return *end == '\0' && !std::isnan(value);
}

ScoreRange parse_range(const std::string& min, const std::string& max) {
  ScoreRange r;
  if (!parse_bound(min, r.min, r.minex) || !parse_bound(max, r.max, r.maxex)) throw ReplyError(kBadRange);
  return r;
}

// A score in a reply, as Redis 7.0 writes one over RESP2 (addReplyDouble: "%.17g", with
// infinities spelled "inf" and "-inf").
std::string format_score(double d) {
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  char buf[40];
  const int len = std::snprintf(buf, sizeof buf, "%.17g", d);
  return std::string(buf, static_cast<std::size_t>(len));
}

Reply scored_members_reply(std::vector<Keyspace::ScoredMember> items, bool withscores) {
  std::vector<Reply> out;
  out.reserve(items.size() * (withscores ? 2 : 1));
  for (auto& [member, score] : items) {
    out.push_back(Reply::of_string(std::move(member)));
    if (withscores) out.push_back(Reply::of_string(format_score(score)));
  }
  return Reply::of_array(std::move(out));
}

// Redis-style glob matching for KEYS: * ? [abc] [^a] [a-z] and \ escapes.
bool glob_match(std::string_view p, std::string_view s) {
  std::size_t pi = 0, si = 0, star_p = std::string_view::npos, star_s = 0;
  auto match_class = [&](std::size_t& i, char c) {
    // p[i] == '['; returns whether c matches and leaves i after ']'.
    ++i;
    bool negate = i < p.size() && p[i] == '^';
    if (negate) ++i;
    bool hit = false;
    while (i < p.size() && p[i] != ']') {
      if (p[i] == '\\' && i + 1 < p.size()) {
        ++i;
        hit |= p[i] == c;
      } else if (i + 2 < p.size() && p[i + 1] == '-' && p[i + 2] != ']') {
        char lo = std::min(p[i], p[i + 2]), hi = std::max(p[i], p[i + 2]);
        hit |= c >= lo && c <= hi;
        i += 2;
      } else {
        hit |= p[i] == c;
      }
      ++i;
    }
    if (i < p.size()) ++i;  // skip ']'
    return negate ? !hit : hit;
  };
  while (si < s.size()) {
    if (pi < p.size() && p[pi] == '*') {
      star_p = pi++;
      star_s = si;
      continue;
    }
    if (pi < p.size()) {
      std::size_t next = pi;
      bool ok = false;
      if (p[pi] == '?') {
        ok = true;
        next = pi + 1;
      } else if (p[pi] == '[') {
        ok = match_class(next, s[si]);
      } else if (p[pi] == '\\' && pi + 1 < p.size()) {
        ok = p[pi + 1] == s[si];
        next = pi + 2;
      } else {
        ok = p[pi] == s[si];
        next = pi + 1;
      }
      if (ok) {
        pi = next;
        ++si;
        continue;
      }
    }
    if (star_p == std::string_view::npos) return false;
    pi = star_p + 1;
    si = ++star_s;
  }
  while (pi < p.size() && p[pi] == '*') ++pi;
  return pi == p.size();
}

}  // namespace

// The keyspace as seen by one command or script: time is frozen for its duration,
// as Redis freezes it for a script.
class MemoryStore::Ops final : public Keyspace {
 public:
  Ops(MemoryStore& store, std::int64_t now) : s_(store), now_(now) {}

  std::int64_t now_ms() const override { return now_; }

  Entry* find(const std::string& key) {
    // A script touches the same key several times in a row: remember the last one found.
    // (Element pointers survive rehashing; erase() forgets it.)
    if (memo_ != nullptr && memo_key_ == key) {
      if (memo_->expire_at == 0 || memo_->expire_at > now_) return memo_;
    }
    auto it = s_.data_.find(key);
    if (it == s_.data_.end()) return nullptr;
    if (it->second.expire_at != 0 && it->second.expire_at <= now_) {
      erase(it);
      return nullptr;
    }
    memo_key_ = it->first;
    memo_ = &it->second;
    return &it->second;
  }

  void forget() noexcept { memo_ = nullptr; }

  // The live value of `key` if it is a T; nullptr when there is none; WRONGTYPE when
  // the key holds another type.
  template <class T>
  T* find_as(const std::string& key) {
    Entry* e = find(key);
    if (!e) return nullptr;
    T* v = std::get_if<T>(&e->value);
    if (!v) throw ReplyError(kWrongType);
    return v;
  }

  template <class T>
  T& find_or_create(const std::string& key) {
    if (T* v = find_as<T>(key)) return *v;
    return s_.data_[key].value.template emplace<T>();  // find() left no expired entry behind
  }

  void erase(std::unordered_map<std::string, Entry>::iterator it) {
    forget();
    if (it->second.indexed_at != 0) s_.expiry_.erase({it->second.indexed_at, it->first});
    s_.data_.erase(it);
  }

  // Keeps the invariant "a key with a deadline is filed in expiry_ at or before it" with
  // as little index work as possible: a deadline pushed later (a sliding window's key on
  // every hit) costs nothing here.
  void set_expiry(const std::string& key, Entry& e, std::int64_t at) {
    e.expire_at = at;
    if (at != 0 && e.indexed_at != 0 && e.indexed_at <= at) return;
    if (e.indexed_at != 0) s_.expiry_.erase({e.indexed_at, key});
    e.indexed_at = at;
    if (at != 0) s_.expiry_.insert({at, key});
  }

  // ---- keys and strings ---------------------------------------------------------------

  std::optional<std::string> get(const std::string& key) override {
    const std::string* v = find_as<std::string>(key);
    if (!v) return std::nullopt;
    return *v;
  }

  std::int64_t incrby(const std::string& key, std::int64_t amount) override {
    std::string* v = find_as<std::string>(key);
    std::int64_t cur = 0;
    if (v) {
      auto parsed = parse_int64(*v);
      if (!parsed) throw ReplyError(kNotInteger);
      cur = *parsed;
    }
    if ((amount > 0 && cur > std::numeric_limits<std::int64_t>::max() - amount) ||
        (amount < 0 && cur < std::numeric_limits<std::int64_t>::min() - amount)) {
      throw ReplyError(kOverflow);
    }
    cur += amount;
    if (v) {
      *v = to_string(cur);
    } else {
      s_.data_[key] = Entry{to_string(cur), 0};
    }
    return cur;
  }

  // SET with every option; returns false when NX/XX prevented it. Like Redis, it
  // replaces a value of any type.
  bool set(const std::string& key, const std::string& value, bool nx, bool xx, std::int64_t at,
           bool keepttl) {
    Entry* e = find(key);
    if ((nx && e) || (xx && !e)) return false;
    if (at != 0 && at <= now_) {  // an expiry in the past deletes the key, as Redis does
      if (e) erase(s_.data_.find(key));
      return true;
    }
    if (!e) {
      e = &s_.data_[key];
    }
    e->value = value;
    if (!keepttl) set_expiry(key, *e, at);
    return true;
  }

  bool set_nx_pxat(const std::string& key, const std::string& value, std::int64_t at) override {
    return set(key, value, true, false, at, false);
  }

  std::int64_t pttl(const std::string& key) override {
    Entry* e = find(key);
    if (!e) return -2;
    if (e->expire_at == 0) return -1;
    return e->expire_at - now_;
  }

  bool pexpireat(const std::string& key, std::int64_t at) override {
    Entry* e = find(key);
    if (!e) return false;
    if (at <= now_) {
      erase(s_.data_.find(key));
      return true;
    }
    set_expiry(key, *e, at);
    return true;
  }

  bool persist(const std::string& key) {
    Entry* e = find(key);
    if (!e || e->expire_at == 0) return false;
    set_expiry(key, *e, 0);
    return true;
  }

  bool del(const std::string& key) override {
    if (!find(key)) return false;
    erase(s_.data_.find(key));
    return true;
  }

  bool exists(const std::string& key) override { return find(key) != nullptr; }

  // TYPE's answer.
  const char* type_of(const std::string& key) {
    const Entry* e = find(key);
    if (!e) return "none";
    if (std::holds_alternative<ZSet>(e->value)) return "zset";
    if (std::holds_alternative<Hash>(e->value)) return "hash";
    return "string";
  }

  // ---- sorted sets ----------------------------------------------------------------------

  using ZOrderIt = std::set<ZItem, ZLess>::const_iterator;

  struct ZAddFlags {
    bool nx = false, xx = false, gt = false, lt = false;
  };
  enum class ZAdded { kNothing, kAdded, kRescored };

  // One score-member pair of ZADD (Redis zsetAdd without INCR). `score` is not NaN.
  static ZAdded zset_add(ZSet& z, double score, const std::string& member, ZAddFlags f) {
    // A small Redis set (listpack) stores -0 as 0; do the same so ZSCORE agrees.
    if (score == 0) score = 0;
    auto it = z.scores.find(member);
    if (it == z.scores.end()) {
      if (f.xx) return ZAdded::kNothing;
      z.scores.emplace(member, score);
      z.order.emplace(score, member);
      return ZAdded::kAdded;
    }
    const double cur = it->second;
    if (f.nx || (f.gt && score <= cur) || (f.lt && score >= cur) || score == cur) return ZAdded::kNothing;
    auto node = z.order.extract(ZItem{cur, member});
    node.value().first = score;
    z.order.insert(std::move(node));
    it->second = score;
    return ZAdded::kRescored;
  }

  // The members of `z` in `r`, as [first, last).
  static std::pair<ZOrderIt, ZOrderIt> zset_range(const ZSet& z, const ScoreRange& r) {
    if (r.empty()) return {z.order.end(), z.order.end()};
    auto first = r.minex ? z.order.upper_bound(r.min) : z.order.lower_bound(r.min);
    auto last = r.maxex ? z.order.lower_bound(r.max) : z.order.upper_bound(r.max);
    return {first, last};
  }

  // Deletes `key` when its sorted set or hash has just lost its last element, TTL and all.
  void drop_if_empty(const std::string& key, bool empty) {
    if (empty) erase(s_.data_.find(key));
  }

  bool zadd(const std::string& key, double score, const std::string& member) override {
    if (std::isnan(score)) throw ReplyError(kNotFloat);
    return zset_add(find_or_create<ZSet>(key), score, member, {}) == ZAdded::kAdded;
  }

  bool zrem(const std::string& key, const std::string& member) override {
    ZSet* z = find_as<ZSet>(key);
    if (!z) return false;
    auto it = z->scores.find(member);
    if (it == z->scores.end()) return false;
    z->order.erase(ZItem{it->second, member});
    z->scores.erase(it);
    drop_if_empty(key, z->scores.empty());
    return true;
  }

  std::int64_t zcard(const std::string& key) override {
    const ZSet* z = find_as<ZSet>(key);
    return z ? static_cast<std::int64_t>(z->scores.size()) : 0;
  }

  std::optional<double> zscore(const std::string& key, const std::string& member) override {
    const ZSet* z = find_as<ZSet>(key);
    if (!z) return std::nullopt;
    auto it = z->scores.find(member);
    if (it == z->scores.end()) return std::nullopt;
    return it->second;
  }

  std::int64_t zcount(const std::string& key, const ScoreRange& r) {
    const ZSet* z = find_as<ZSet>(key);
    if (!z) return 0;
    auto [first, last] = zset_range(*z, r);
    return static_cast<std::int64_t>(std::distance(first, last));
  }

  std::int64_t zremrangebyscore(const std::string& key, const ScoreRange& r) {
    ZSet* z = find_as<ZSet>(key);
    if (!z) return 0;
    auto [first, last] = zset_range(*z, r);
    std::int64_t removed = 0;
    while (first != last) {
      z->scores.erase(first->second);
      first = z->order.erase(first);
      ++removed;
    }
    drop_if_empty(key, z->scores.empty());
    return removed;
  }

  std::int64_t zremrangebyscore(const std::string& key, double min, double max) override {
    if (std::isnan(min) || std::isnan(max)) throw ReplyError(kBadRange);
    return zremrangebyscore(key, ScoreRange{min, max, false, false});
  }

  std::vector<ScoredMember> zrange(const std::string& key, std::int64_t start, std::int64_t stop) override {
    const ZSet* z = find_as<ZSet>(key);
    if (!z) return {};
    const auto size = static_cast<std::int64_t>(z->order.size());
    if (start < 0) start += size;
    if (stop < 0) stop += size;
    if (start < 0) start = 0;
    if (start > stop || start >= size) return {};
    if (stop >= size) stop = size - 1;
    // std::set has no rank index: walk from whichever end is nearer.
    auto it = start <= size - start ? std::next(z->order.begin(), start)
                                    : std::prev(z->order.end(), size - start);
    std::vector<ScoredMember> out;
    out.reserve(static_cast<std::size_t>(stop - start + 1));
    for (std::int64_t i = start; i <= stop; ++i, ++it) out.emplace_back(it->second, it->first);
    return out;
  }

  // ZRANGEBYSCORE key range LIMIT offset count; count < 0 means all, and a negative
  // offset gives nothing, as in Redis.
  std::vector<ScoredMember> zrangebyscore(const std::string& key, const ScoreRange& r, std::int64_t offset,
                                          std::int64_t count) {
    const ZSet* z = find_as<ZSet>(key);
    if (!z || offset < 0) return {};
    auto [it, last] = zset_range(*z, r);
    for (; offset > 0 && it != last; --offset) ++it;
    std::vector<ScoredMember> out;
    for (; count != 0 && it != last; ++it, --count) out.emplace_back(it->second, it->first);
    return out;
  }

  std::vector<ScoredMember> zrangebyscore(const std::string& key, double min, double max,
                                          std::int64_t limit) override {
    if (std::isnan(min) || std::isnan(max)) throw ReplyError(kBadRange);
    return zrangebyscore(key, ScoreRange{min, max, false, false}, 0, limit);
  }

  // ---- hashes ---------------------------------------------------------------------------

  std::optional<std::string> hget(const std::string& key, const std::string& field) override {
    const Hash* h = find_as<Hash>(key);
    if (!h) return std::nullopt;
    auto it = h->index.find(field);
    if (it == h->index.end()) return std::nullopt;
    return it->second->second;
  }

  // Sets one field; true when it is new. A new field goes last, an existing one keeps
  // its place (as in a listpack).
  static bool hash_set(Hash& h, const std::string& field, const std::string& value) {
    if (auto it = h.index.find(field); it != h.index.end()) {
      it->second->second = value;
      return false;
    }
    h.fields.emplace_back(field, value);
    auto node = std::prev(h.fields.end());
    h.index.emplace(std::string_view(node->first), node);
    return true;
  }

  void hset(const std::string& key, const std::string& field, const std::string& value) override {
    hash_set(find_or_create<Hash>(key), field, value);
  }

  bool hdel(const std::string& key, const std::string& field) override {
    Hash* h = find_as<Hash>(key);
    if (!h) return false;
    auto it = h->index.find(field);
    if (it == h->index.end()) return false;
    auto node = it->second;
    h->index.erase(it);  // before the node whose name it views
    h->fields.erase(node);
    drop_if_empty(key, h->fields.empty());
    return true;
  }

  void hvisit(const std::string& key, void* ctx,
              void (*visit)(void* ctx, std::string_view field, std::string_view value)) override {
    const Hash* h = find_as<Hash>(key);
    if (!h) return;
    for (const auto& [field, value] : h->fields) visit(ctx, field, value);
  }

  // In insertion order, which is what HGETALL answers with.
  std::vector<std::pair<std::string, std::string>> hgetall(const std::string& key) override {
    const Hash* h = find_as<Hash>(key);
    if (!h) return {};
    return {h->fields.begin(), h->fields.end()};
  }

  std::int64_t hincrby(const std::string& key, const std::string& field, std::int64_t amount) override {
    Hash& h = find_or_create<Hash>(key);
    std::int64_t cur = 0;
    auto it = h.index.find(field);
    if (it != h.index.end()) {
      auto parsed = parse_int64(it->second->second);
      if (!parsed) throw ReplyError("ERR hash value is not an integer");
      cur = *parsed;
    }
    if ((amount > 0 && cur > std::numeric_limits<std::int64_t>::max() - amount) ||
        (amount < 0 && cur < std::numeric_limits<std::int64_t>::min() - amount)) {
      throw ReplyError(kOverflow);
    }
    cur += amount;
    hash_set(h, field, to_string(cur));
    return cur;
  }

 private:
  MemoryStore& s_;
  std::int64_t now_;
  std::string_view memo_key_;
  Entry* memo_ = nullptr;
};

MemoryStore::MemoryStore(const StoreOptions& options)
    : clock_(options.clock ? options.clock : std::make_shared<SystemClock>()),
      sweep_interval_(options.sweep_interval) {
  if (sweep_interval_.count() > 0) sweeper_ = std::thread([this] { sweeper_loop(); });
}

MemoryStore::~MemoryStore() { close(); }

void MemoryStore::close() {
  {
    std::lock_guard<std::mutex> lock(sweeper_mu_);
    stop_sweeper_ = true;
  }
  sweeper_cv_.notify_all();
  if (sweeper_.joinable() && sweeper_.get_id() != std::this_thread::get_id()) sweeper_.join();
  std::lock_guard<std::mutex> lock(mu_);
  closed_ = true;
}

void MemoryStore::sweeper_loop() {
  std::unique_lock<std::mutex> lock(sweeper_mu_);
  while (!stop_sweeper_) {
    sweeper_cv_.wait_for(lock, sweep_interval_, [this] { return stop_sweeper_; });
    if (stop_sweeper_) break;
    lock.unlock();
    sweep();
    lock.lock();
  }
}

std::size_t MemoryStore::sweep() {
  std::size_t freed = 0;
  // Free in slices so a huge expiry wave never holds the lock for long.
  for (;;) {
    std::lock_guard<std::mutex> lock(mu_);
    const std::int64_t now = clock_->now_ms();
    std::size_t slice = 0;
    std::size_t erased = 0;
    while (!expiry_.empty() && expiry_.begin()->first <= now && slice < 1024) {
      auto node = expiry_.extract(expiry_.begin());
      ++slice;
      auto it = data_.find(node.value().second);
      if (it == data_.end()) continue;
      Entry& e = it->second;
      if (e.expire_at != 0 && e.expire_at > now) {  // its deadline moved later: file it there
        e.indexed_at = e.expire_at;
        node.value().first = e.expire_at;
        expiry_.insert(std::move(node));
      } else if (e.expire_at == 0) {
        e.indexed_at = 0;
      } else {
        data_.erase(it);
        ++erased;
      }
    }
    freed += erased;
    if (slice < 1024) return freed;
  }
}

std::size_t MemoryStore::stored_keys() const {
  std::lock_guard<std::mutex> lock(mu_);
  return data_.size();
}

std::vector<Reply> MemoryStore::execute(const std::vector<Request>& batch) {
  std::vector<Reply> out;
  out.reserve(batch.size());
  std::lock_guard<std::mutex> lock(mu_);
  if (closed_) throw ConnectionError("the memory:// store is closed; open a new one with redcount.connect()");
  for (const Request& req : batch) {
    Ops ops(*this, clock_->now_ms());
    try {
      if (const auto* cmd = std::get_if<Command>(&req)) {
        out.push_back(run_command(ops, cmd->args));
      } else {
        const auto& call = std::get<ScriptCall>(req);
        if (call.typed && call.script->typed != nullptr) {
          out.push_back(call.script->typed(ops, call.keys, *call.typed));
        } else if (call.typed && call.args.empty()) {
          std::vector<std::string> scratch;
          out.push_back(call.script->native(ops, call.keys, call.argv(scratch)));
        } else {
          out.push_back(call.script->native(ops, call.keys, call.args));
        }
      }
    } catch (const ReplyError& e) {
      out.push_back(Reply::of_error(e.what()));
    }
  }
  return out;
}

Reply MemoryStore::run_command(Ops& ops, const std::vector<std::string>& args) {
  if (args.empty()) return Reply::of_error("ERR empty command");
  const std::string cmd = upper(args[0]);
  const std::size_t n = args.size();
  auto int_arg = [&](std::size_t i) -> std::int64_t {
    auto v = parse_int64(args[i]);
    if (!v) throw ReplyError(kNotInteger);
    return *v;
  };

  if (cmd == "PING") {
    if (n == 1) return Reply::of_status("PONG");
    if (n == 2) return Reply::of_string(args[1]);
    return wrong_args(cmd);
  }
  if (cmd == "TIME") {
    if (n != 1) return wrong_args(cmd);
    const std::int64_t now = ops.now_ms();
    return Reply::of_array({Reply::of_string(to_string(now / 1000)),
                            Reply::of_string(to_string((now % 1000) * 1000))});
  }
  if (cmd == "GET") {
    if (n != 2) return wrong_args(cmd);
    auto v = ops.get(args[1]);
    return v ? Reply::of_string(std::move(*v)) : Reply::nil();
  }
  if (cmd == "SET") {
    if (n < 3) return wrong_args(cmd);
    bool nx = false, xx = false, keepttl = false;
    std::int64_t at = 0;
    bool have_expiry = false;
    for (std::size_t i = 3; i < n; ++i) {
      const std::string opt = upper(args[i]);
      if (opt == "NX" && !xx) {
        nx = true;
      } else if (opt == "XX" && !nx) {
        xx = true;
      } else if (opt == "KEEPTTL" && !have_expiry) {
        keepttl = true;
      } else if ((opt == "EX" || opt == "PX" || opt == "EXAT" || opt == "PXAT") && !have_expiry &&
                 !keepttl && i + 1 < n) {
        std::int64_t v = int_arg(++i);
        const bool seconds = opt == "EX" || opt == "EXAT";
        if (v <= 0 || (seconds && v > std::numeric_limits<std::int64_t>::max() / 1000)) {
          return Reply::of_error("ERR invalid expire time in 'set' command");
        }
        if (seconds) v *= 1000;
        if (opt == "EX" || opt == "PX") {
          if (v > std::numeric_limits<std::int64_t>::max() - ops.now_ms()) {
            return Reply::of_error("ERR invalid expire time in 'set' command");
          }
          v += ops.now_ms();
        }
        at = v;
        have_expiry = true;
      } else {
        return Reply::of_error(kSyntax);
      }
    }
    return ops.set(args[1], args[2], nx, xx, at, keepttl) ? Reply::of_status("OK") : Reply::nil();
  }
  if (cmd == "INCR" || cmd == "DECR") {
    if (n != 2) return wrong_args(cmd);
    return Reply::of_integer(ops.incrby(args[1], cmd == "INCR" ? 1 : -1));
  }
  if (cmd == "INCRBY" || cmd == "DECRBY") {
    if (n != 3) return wrong_args(cmd);
    std::int64_t amount = int_arg(2);
    if (cmd == "DECRBY") {
      if (amount == std::numeric_limits<std::int64_t>::min()) {
        return Reply::of_error("ERR decrement would overflow");
      }
      amount = -amount;
    }
    return Reply::of_integer(ops.incrby(args[1], amount));
  }
  if (cmd == "DEL" || cmd == "UNLINK" || cmd == "EXISTS") {
    if (n < 2) return wrong_args(cmd);
    std::int64_t count = 0;
    for (std::size_t i = 1; i < n; ++i) {
      count += cmd == "EXISTS" ? (ops.find(args[i]) != nullptr) : ops.del(args[i]);
    }
    return Reply::of_integer(count);
  }
  if (cmd == "TYPE") {
    if (n != 2) return wrong_args(cmd);
    return Reply::of_status(ops.type_of(args[1]));
  }
  if (cmd == "PTTL" || cmd == "TTL") {
    if (n != 2) return wrong_args(cmd);
    std::int64_t ms = ops.pttl(args[1]);
    if (ms < 0 || cmd == "PTTL") return Reply::of_integer(ms);
    return Reply::of_integer((ms + 500) / 1000);  // Redis rounds TTL to the nearest second
  }
  if (cmd == "PEXPIREAT" || cmd == "PEXPIRE" || cmd == "EXPIREAT" || cmd == "EXPIRE") {
    if (n < 3) return wrong_args(cmd);
    std::int64_t v = int_arg(2);
    const bool seconds = cmd == "EXPIREAT" || cmd == "EXPIRE";
    const bool relative = cmd == "PEXPIRE" || cmd == "EXPIRE";
    const std::int64_t lim = std::numeric_limits<std::int64_t>::max();
    if (seconds && (v > lim / 1000 || v < -lim / 1000)) {
      return Reply::of_error("ERR invalid expire time in '" + ascii_lower(cmd) + "' command");
    }
    if (seconds) v *= 1000;
    if (relative) {
      if ((v > 0 && v > lim - ops.now_ms())) {
        return Reply::of_error("ERR invalid expire time in '" + ascii_lower(cmd) + "' command");
      }
      v += ops.now_ms();
    }
    bool nx = false, xx = false, gt = false, lt = false;
    for (std::size_t i = 3; i < n; ++i) {
      const std::string opt = upper(args[i]);
      if (opt == "NX") nx = true;
      else if (opt == "XX") xx = true;
      else if (opt == "GT") gt = true;
      else if (opt == "LT") lt = true;
      else return Reply::of_error("ERR Unsupported option " + args[i]);
    }
    if (nx && (xx || gt || lt)) {
      return Reply::of_error("ERR NX and XX, GT or LT options at the same time are not compatible");
    }
    if (gt && lt) return Reply::of_error("ERR GT and LT options at the same time are not compatible");
    const std::int64_t cur = ops.pttl(args[1]);
    if (cur == -2) return Reply::of_integer(0);
    const bool has_ttl = cur >= 0;
    const std::int64_t cur_at = has_ttl ? ops.now_ms() + cur : 0;
    if (nx && has_ttl) return Reply::of_integer(0);
    if (xx && !has_ttl) return Reply::of_integer(0);
    if (gt && (!has_ttl || v <= cur_at)) return Reply::of_integer(0);  // no TTL counts as infinite
    if (lt && has_ttl && v >= cur_at) return Reply::of_integer(0);
    return Reply::of_integer(ops.pexpireat(args[1], v) ? 1 : 0);
  }
  if (cmd == "PERSIST") {
    if (n != 2) return wrong_args(cmd);
    return Reply::of_integer(ops.persist(args[1]) ? 1 : 0);
  }
  if (cmd == "DBSIZE") {
    if (n != 1) return wrong_args(cmd);
    std::int64_t live = 0;
    for (auto& [k, e] : data_) live += (e.expire_at == 0 || e.expire_at > ops.now_ms());
    return Reply::of_integer(live);
  }
  if (cmd == "KEYS") {
    if (n != 2) return wrong_args(cmd);
    std::vector<Reply> keys;
    for (auto& [k, e] : data_) {
      if ((e.expire_at == 0 || e.expire_at > ops.now_ms()) && glob_match(args[1], k)) {
        keys.push_back(Reply::of_string(k));
      }
    }
    return Reply::of_array(std::move(keys));
  }
  if (cmd == "FLUSHALL" || cmd == "FLUSHDB") {
    ops.forget();
    data_.clear();
    expiry_.clear();
    return Reply::of_status("OK");
  }
  if (!cmd.empty() && cmd[0] == 'Z') {
    if (auto reply = run_zset_command(ops, cmd, args)) return std::move(*reply);
  }
  if (!cmd.empty() && cmd[0] == 'H') {
    if (auto reply = run_hash_command(ops, cmd, args)) return std::move(*reply);
  }
  std::string shown;
  for (std::size_t i = 1; i < n && i < 4; ++i) shown += "'" + args[i] + "' ";
  return Reply::of_error("ERR unknown command '" + args[0] + "', with args beginning with: " + shown);
}

std::optional<Reply> MemoryStore::run_zset_command(Ops& ops, const std::string& cmd,
                                                   const std::vector<std::string>& args) {
  // Argument errors come before the key is looked at, in the order Redis reports them.
  const std::size_t n = args.size();
  if (cmd == "ZADD") {
    if (n < 4) return wrong_args(cmd);
    Ops::ZAddFlags f;
    bool ch = false, incr = false;
    std::size_t i = 2;
    for (; i < n; ++i) {
      const std::string opt = upper(args[i]);
      if (opt == "NX") f.nx = true;
      else if (opt == "XX") f.xx = true;
      else if (opt == "GT") f.gt = true;
      else if (opt == "LT") f.lt = true;
      else if (opt == "CH") ch = true;
      else if (opt == "INCR") incr = true;
      else break;
    }
    const std::size_t pairs = (n - i) / 2;
    if (i == n || (n - i) % 2 != 0) return Reply::of_error(kSyntax);
    if (f.nx && f.xx) return Reply::of_error("ERR XX and NX options at the same time are not compatible");
    if ((f.nx && (f.gt || f.lt)) || (f.gt && f.lt)) {
      return Reply::of_error("ERR GT, LT, and/or NX options at the same time are not compatible");
    }
    if (incr && pairs > 1) return Reply::of_error("ERR INCR option supports a single increment-element pair");
    if (incr) return Reply::of_error("ERR the memory:// store does not support ZADD INCR; use ZSCORE and ZADD");
    std::vector<double> scores;
    scores.reserve(pairs);
    for (std::size_t j = i; j < n; j += 2) {
      auto score = parse_score(args[j]);
      if (!score) return Reply::of_error(kNotFloat);
      scores.push_back(*score);
    }
    ZSet* z = ops.find_as<ZSet>(args[1]);
    if (!z) {
      if (f.xx) return Reply::of_integer(0);  // XX never creates the key
      z = &ops.find_or_create<ZSet>(args[1]);
    }
    std::int64_t added = 0, rescored = 0;
    for (std::size_t p = 0; p < pairs; ++p) {
      switch (Ops::zset_add(*z, scores[p], args[i + 2 * p + 1], f)) {
        case Ops::ZAdded::kAdded: ++added; break;
        case Ops::ZAdded::kRescored: ++rescored; break;
        case Ops::ZAdded::kNothing: break;
      }
    }
    return Reply::of_integer(ch ? added + rescored : added);
  }
  if (cmd == "ZREM") {
    if (n < 3) return wrong_args(cmd);
    std::int64_t removed = 0;
    for (std::size_t i = 2; i < n; ++i) removed += ops.zrem(args[1], args[i]);
    return Reply::of_integer(removed);
  }
  if (cmd == "ZCARD") {
    if (n != 2) return wrong_args(cmd);
    return Reply::of_integer(ops.zcard(args[1]));
  }
  if (cmd == "ZSCORE") {
    if (n != 3) return wrong_args(cmd);
    auto score = ops.zscore(args[1], args[2]);
    return score ? Reply::of_string(format_score(*score)) : Reply::nil();
  }
  if (cmd == "ZCOUNT") {
    if (n != 4) return wrong_args(cmd);
    return Reply::of_integer(ops.zcount(args[1], parse_range(args[2], args[3])));
  }
  if (cmd == "ZREMRANGEBYSCORE") {
    if (n != 4) return wrong_args(cmd);
    return Reply::of_integer(ops.zremrangebyscore(args[1], parse_range(args[2], args[3])));
  }
  if (cmd == "ZRANGE" || cmd == "ZRANGEBYSCORE") {
    if (n < 4) return wrong_args(cmd);
    const bool by_score = cmd == "ZRANGEBYSCORE";
    bool withscores = false;
    std::int64_t offset = 0, count = -1;
    for (std::size_t i = 4; i < n; ++i) {
      const std::string opt = upper(args[i]);
      if (opt == "WITHSCORES") {
        withscores = true;
      } else if (opt == "LIMIT" && n - i > 2) {
        offset = int64_arg(args[i + 1]);
        count = int64_arg(args[i + 2]);
        i += 2;
      } else if (!by_score && (opt == "BYSCORE" || opt == "BYLEX" || opt == "REV")) {
        return Reply::of_error("ERR syntax error, the memory:// store supports ZRANGE by rank only; "
                               "use ZRANGEBYSCORE");
      } else {
        return Reply::of_error(kSyntax);
      }
    }
    if (by_score) {
      const ScoreRange range = parse_range(args[2], args[3]);
      return scored_members_reply(ops.zrangebyscore(args[1], range, offset, count), withscores);
    }
    if (count != -1) {  // Redis's own check, which lets "LIMIT x -1" through
      return Reply::of_error("ERR syntax error, LIMIT is only supported in combination with either BYSCORE or BYLEX");
    }
    const std::int64_t start = int64_arg(args[2]);
    const std::int64_t stop = int64_arg(args[3]);
    return scored_members_reply(ops.zrange(args[1], start, stop), withscores);
  }
  return std::nullopt;
}

std::optional<Reply> MemoryStore::run_hash_command(Ops& ops, const std::string& cmd,
                                                   const std::vector<std::string>& args) {
  const std::size_t n = args.size();
  if (cmd == "HSET") {
    if (n < 4 || n % 2 != 0) return wrong_args(cmd);
    Hash& h = ops.find_or_create<Hash>(args[1]);
    std::int64_t added = 0;
    for (std::size_t i = 2; i < n; i += 2) added += Ops::hash_set(h, args[i], args[i + 1]);
    return Reply::of_integer(added);
  }
  if (cmd == "HGET") {
    if (n != 3) return wrong_args(cmd);
    auto v = ops.hget(args[1], args[2]);
    return v ? Reply::of_string(std::move(*v)) : Reply::nil();
  }
  if (cmd == "HMGET") {
    if (n < 3) return wrong_args(cmd);
    std::vector<Reply> out;
    out.reserve(n - 2);
    for (std::size_t i = 2; i < n; ++i) {
      auto v = ops.hget(args[1], args[i]);
      out.push_back(v ? Reply::of_string(std::move(*v)) : Reply::nil());
    }
    return Reply::of_array(std::move(out));
  }
  if (cmd == "HGETALL") {
    if (n != 2) return wrong_args(cmd);
    std::vector<Reply> out;
    for (auto& [field, value] : ops.hgetall(args[1])) {
      out.push_back(Reply::of_string(std::move(field)));
      out.push_back(Reply::of_string(std::move(value)));
    }
    return Reply::of_array(std::move(out));
  }
  if (cmd == "HDEL") {
    if (n < 3) return wrong_args(cmd);
    std::int64_t removed = 0;
    for (std::size_t i = 2; i < n; ++i) removed += ops.hdel(args[1], args[i]);
    return Reply::of_integer(removed);
  }
  if (cmd == "HLEN") {
    if (n != 2) return wrong_args(cmd);
    const Hash* h = ops.find_as<Hash>(args[1]);
    return Reply::of_integer(h ? static_cast<std::int64_t>(h->fields.size()) : 0);
  }
  if (cmd == "HEXISTS") {
    if (n != 3) return wrong_args(cmd);
    const Hash* h = ops.find_as<Hash>(args[1]);
    return Reply::of_integer(h && h->index.count(args[2]) ? 1 : 0);
  }
  if (cmd == "HINCRBY") {
    if (n != 4) return wrong_args(cmd);
    const std::int64_t amount = int64_arg(args[3]);
    return Reply::of_integer(ops.hincrby(args[1], args[2], amount));
  }
  return std::nullopt;
}

}  // namespace redcount
