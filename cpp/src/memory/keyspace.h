// The memory store's keyspace: MemoryStore::Ops, the Keyspace that commands and native
// scripts run against while the store's lock is held, with Redis semantics (lazy expiry,
// WRONGTYPE, emptied sets and hashes deleted with their TTL).
//
//   std::lock_guard<std::mutex> lock(mu_);   // inside MemoryStore only
//   Ops ops(*this, clock_->now_ms());        // time frozen for one request
//   std::int64_t n = ops.incrby("k", 1);
//
// Private to the memory store (cpp/src/memory_store.cpp, cpp/src/memory/commands.cpp).
// Not thread-safe by itself: valid only under the store's lock.
#pragma once

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <iterator>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "redcount/common/errors.h"
#include "redcount/memory/memory_store.h"
#include "redcount/common/util.h"

namespace redcount {
namespace memory_errors {

// Redis's own error texts, so that callers see the same errors from both stores.
inline constexpr const char* kNotInteger = "ERR value is not an integer or out of range";
inline constexpr const char* kOverflow = "ERR increment or decrement would overflow";
inline constexpr const char* kSyntax = "ERR syntax error";
inline constexpr const char* kWrongType = "WRONGTYPE Operation against a key holding the wrong kind of value";
inline constexpr const char* kNotFloat = "ERR value is not a valid float";
inline constexpr const char* kBadRange = "ERR min or max is not a float";

}  // namespace memory_errors

using namespace memory_errors;  // NOLINT: the keyspace and the interpreter speak these

// A ZRANGEBYSCORE-style score range, as the interpreter parses it.
struct MemoryScoreRange {
  double min = 0, max = 0;
  bool minex = false, maxex = false;  // exclusive ends
  bool empty() const { return min > max || (min == max && (minex || maxex)); }
};

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

  // `out` = the decimal text of v, written into its own buffer (a counter's value is
  // rewritten on every increment).
  static void assign_decimal(std::string& out, std::int64_t v) {
    char buf[24];
    const auto end = std::to_chars(buf, buf + sizeof buf, v).ptr;
    out.assign(buf, static_cast<std::size_t>(end - buf));
  }

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
      assign_decimal(*v, cur);
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
    if (std::holds_alternative<Stream>(e->value)) return "stream";
    return "string";
  }

  // ---- sorted sets ----------------------------------------------------------------------

  using ZOrderIt = std::deque<ZItem>::iterator;

  struct ZAddFlags {
    bool nx = false, xx = false, gt = false, lt = false;
  };
  enum class ZAdded { kNothing, kAdded, kRescored };

  static void zset_index(ZSet& z) {
    if (z.indexed) return;
    z.scores.reserve(z.order.size());
    for (const auto& [score, member] : z.order) z.scores.emplace(member, score);
    z.indexed = true;
  }

  // Inserts in order; at the back (O(1)) in the common case of a log.
  static void zset_insert(ZSet& z, double score, const std::string& member) {
    if (z.order.empty() || z.order.back().first < score ||
        (z.order.back().first == score && z.order.back().second < member)) {
      z.order.emplace_back(score, member);
      return;
    }
    ZItem item{score, member};
    const auto at = std::upper_bound(z.order.begin(), z.order.end(), item);
    z.order.insert(at, std::move(item));
  }

  static ZOrderIt zset_find(ZSet& z, double score, const std::string& member) {
    return std::lower_bound(z.order.begin(), z.order.end(), ZItem{score, member});
  }

  // One score-member pair of ZADD (Redis zsetAdd without INCR). `score` is not NaN.
  static ZAdded zset_add(ZSet& z, double score, const std::string& member, ZAddFlags f) {
    // A small Redis set (listpack) stores -0 as 0; do the same so ZSCORE agrees.
    if (score == 0) score = 0;
    zset_index(z);
    auto it = z.scores.find(member);
    if (it == z.scores.end()) {
      if (f.xx) return ZAdded::kNothing;
      z.scores.emplace(member, score);
      zset_insert(z, score, member);
      return ZAdded::kAdded;
    }
    const double cur = it->second;
    if (f.nx || (f.gt && score <= cur) || (f.lt && score >= cur) || score == cur) return ZAdded::kNothing;
    z.order.erase(zset_find(z, cur, member));
    zset_insert(z, score, member);
    it->second = score;
    return ZAdded::kRescored;
  }

  // The members of `z` in `r`, as [first, last). A range open at either end starts or ends
  // there without a search, and the end of a short range is found by stepping from its
  // start: a log's trim (-inf up to a time) removes a few members at the front, and a
  // binary search over the whole deque would touch a cache line per probe.
  static std::pair<ZOrderIt, ZOrderIt> zset_range(ZSet& z, const MemoryScoreRange& r) {
    constexpr double kInf = std::numeric_limits<double>::infinity();
    constexpr int kSteps = 8;
    if (r.empty()) return {z.order.end(), z.order.end()};
    const ZLess less;
    const auto end = z.order.end();
    ZOrderIt first;
    if (r.min == -kInf && !r.minex) {
      first = z.order.begin();
    } else {
      first = r.minex ? std::upper_bound(z.order.begin(), end, r.min, less)
                      : std::lower_bound(z.order.begin(), end, r.min, less);
    }
    if (r.max == kInf && !r.maxex) return {first, end};
    auto inside = [&r](const ZItem& item) { return r.maxex ? item.first < r.max : item.first <= r.max; };
    auto last = first;
    for (int i = 0; i < kSteps && last != end && inside(*last); ++i) ++last;
    if (last != end && inside(*last)) {
      last = r.maxex ? std::lower_bound(last, end, r.max, less) : std::upper_bound(last, end, r.max, less);
    }
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

  void zadd_unique(const std::string& key, double score, const std::string& member) override {
    if (std::isnan(score)) throw ReplyError(kNotFloat);
    ZSet& z = find_or_create<ZSet>(key);
    if (z.indexed) {
      zset_add(z, score, member, {});
      return;
    }
    zset_insert(z, score == 0 ? 0 : score, member);
  }

  bool zrem(const std::string& key, const std::string& member) override {
    ZSet* z = find_as<ZSet>(key);
    if (!z) return false;
    zset_index(*z);
    auto it = z->scores.find(member);
    if (it == z->scores.end()) return false;
    z->order.erase(zset_find(*z, it->second, member));
    z->scores.erase(it);
    drop_if_empty(key, z->order.empty());
    return true;
  }

  std::int64_t zcard(const std::string& key) override {
    const ZSet* z = find_as<ZSet>(key);
    return z ? static_cast<std::int64_t>(z->size()) : 0;
  }

  std::optional<double> zscore(const std::string& key, const std::string& member) override {
    ZSet* z = find_as<ZSet>(key);
    if (!z) return std::nullopt;
    zset_index(*z);
    auto it = z->scores.find(member);
    if (it == z->scores.end()) return std::nullopt;
    return it->second;
  }

  std::int64_t zcount(const std::string& key, const MemoryScoreRange& r) {
    ZSet* z = find_as<ZSet>(key);
    if (!z) return 0;
    auto [first, last] = zset_range(*z, r);
    return static_cast<std::int64_t>(last - first);
  }

  std::int64_t zremrangebyscore(const std::string& key, const MemoryScoreRange& r) {
    ZSet* z = find_as<ZSet>(key);
    if (!z) return 0;
    auto [first, last] = zset_range(*z, r);
    const auto removed = static_cast<std::int64_t>(last - first);
    if (removed == 0) return 0;
    if (z->indexed) {
      for (auto it = first; it != last; ++it) z->scores.erase(it->second);
    }
    z->order.erase(first, last);
    drop_if_empty(key, z->order.empty());
    return removed;
  }

  std::int64_t zremrangebyscore(const std::string& key, double min, double max) override {
    if (std::isnan(min) || std::isnan(max)) throw ReplyError(kBadRange);
    return zremrangebyscore(key, MemoryScoreRange{min, max, false, false});
  }

  std::vector<ScoredMember> zrange(const std::string& key, std::int64_t start, std::int64_t stop) override {
    const ZSet* z = find_as<ZSet>(key);
    if (!z) return {};
    const auto size = static_cast<std::int64_t>(z->size());
    if (start < 0) start += size;
    if (stop < 0) stop += size;
    if (start < 0) start = 0;
    if (start > stop || start >= size) return {};
    if (stop >= size) stop = size - 1;
    std::vector<ScoredMember> out;
    out.reserve(static_cast<std::size_t>(stop - start + 1));
    for (std::int64_t i = start; i <= stop; ++i) {
      const ZItem& item = z->order[static_cast<std::size_t>(i)];
      out.emplace_back(item.second, item.first);
    }
    return out;
  }

  // ZRANGEBYSCORE key range LIMIT offset count; count < 0 means all, and a negative
  // offset gives nothing, as in Redis.
  std::vector<ScoredMember> zrangebyscore(const std::string& key, const MemoryScoreRange& r, std::int64_t offset,
                                          std::int64_t count) {
    ZSet* z = find_as<ZSet>(key);
    if (!z || offset < 0) return {};
    auto [it, last] = zset_range(*z, r);
    it += std::min<std::int64_t>(offset, last - it);
    std::vector<ScoredMember> out;
    for (; count != 0 && it != last; ++it, --count) out.emplace_back(it->second, it->first);
    return out;
  }

  std::vector<ScoredMember> zrangebyscore(const std::string& key, double min, double max,
                                          std::int64_t limit) override {
    if (std::isnan(min) || std::isnan(max)) throw ReplyError(kBadRange);
    return zrangebyscore(key, MemoryScoreRange{min, max, false, false}, 0, limit);
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
    if (it != h.index.end()) {
      assign_decimal(it->second->second, cur);  // no second lookup, no temporary string
    } else {
      hash_set(h, field, to_string(cur));
    }
    return cur;
  }

  // ---- streams --------------------------------------------------------------------------

  static std::string stream_id_text(StreamId id) { return to_string(static_cast<std::int64_t>(id.ms)) + "-" +
                                                          std::to_string(id.seq); }

  // The id XADD '*' gives (Redis streamNextID): the clock, or one more than the last id
  // when the clock has not moved past it.
  StreamId next_stream_id(const Stream& st) const {
    const auto ms = static_cast<std::uint64_t>(now_ > 0 ? now_ : 0);
    if (ms > st.last.ms) return StreamId{ms, 0};
    return StreamId{st.last.ms, st.last.seq + 1};
  }

  // Appends one entry with `id` (already checked to be above the stream's last id) and
  // trims to `maxlen` entries when maxlen >= 0.
  static void stream_append(Stream& st, StreamId id, std::vector<std::pair<std::string, std::string>> fields,
                            std::int64_t maxlen) {
    st.items.push_back(Stream::Item{id, std::move(fields)});
    st.last = id;
    ++st.added;
    if (maxlen >= 0) {
      while (st.items.size() > static_cast<std::size_t>(maxlen)) st.items.pop_front();
    }
  }

  std::string xadd(const std::string& key, const std::vector<std::pair<std::string, std::string>>& fields,
                   std::int64_t maxlen) override {
    Stream& st = find_or_create<Stream>(key);
    const StreamId id = next_stream_id(st);
    stream_append(st, id, fields, maxlen);
    return stream_id_text(id);
  }

 private:
  MemoryStore& s_;
  std::int64_t now_;
  std::string_view memo_key_;
  Entry* memo_ = nullptr;
};

}  // namespace redcount
