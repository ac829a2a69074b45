#include "redcount/store/hot_keys.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <set>
#include <utility>

#include "redcount/common/errors.h"
#include "redcount/store/key_positions.h"

namespace redcount {
HotKeys::HotKeys(std::int64_t capacity) : capacity_(capacity) {
  if (capacity < 1 || capacity > kMaxCapacity) {
    throw InvalidArgument("HotKeys capacity must be 1.." + std::to_string(kMaxCapacity) + ", got " +
                          std::to_string(capacity));
  }
  // A fork takes the table's mutex first: a child must never inherit a table some other
  // thread of the parent was changing.
  fork_hooks_ = ForkHooks([this] { mu_.lock(); }, [this] { unlock_after_fork(false); },
                          [this] { unlock_after_fork(true); });
}

void HotKeys::unlock_after_fork(bool child) {
  if (child) clear_locked();
  mu_.unlock();
}

int HotKeys::new_bucket(std::uint64_t count, int after) {
  int b;
  if (!free_buckets_.empty()) {
    b = free_buckets_.back();
    free_buckets_.pop_back();
    buckets_[static_cast<std::size_t>(b)] = Bucket{};
  } else {
    b = static_cast<int>(buckets_.size());
    buckets_.emplace_back();
  }
  Bucket& nb = buckets_[static_cast<std::size_t>(b)];
  nb.count = count;
  nb.prev = after;
  nb.next = after < 0 ? lowest_ : buckets_[static_cast<std::size_t>(after)].next;
  if (nb.prev >= 0) {
    buckets_[static_cast<std::size_t>(nb.prev)].next = b;
  } else {
    lowest_ = b;
  }
  if (nb.next >= 0) {
    buckets_[static_cast<std::size_t>(nb.next)].prev = b;
  } else {
    highest_ = b;
  }
  return b;
}

void HotKeys::free_bucket(int b) {
  const Bucket& ob = buckets_[static_cast<std::size_t>(b)];
  if (ob.prev >= 0) {
    buckets_[static_cast<std::size_t>(ob.prev)].next = ob.next;
  } else {
    lowest_ = ob.next;
  }
  if (ob.next >= 0) {
    buckets_[static_cast<std::size_t>(ob.next)].prev = ob.prev;
  } else {
    highest_ = ob.prev;
  }
  free_buckets_.push_back(b);
}

void HotKeys::detach(int e) {
  Entry& en = entries_[static_cast<std::size_t>(e)];
  Bucket& b = buckets_[static_cast<std::size_t>(en.bucket)];
  if (en.prev >= 0) entries_[static_cast<std::size_t>(en.prev)].next = en.next;
  if (en.next >= 0) entries_[static_cast<std::size_t>(en.next)].prev = en.prev;
  if (b.first == e) b.first = en.next;
  en.prev = en.next = -1;
  if (b.first < 0) free_bucket(en.bucket);
  en.bucket = -1;
}

void HotKeys::attach(int e, int b) {
  Entry& en = entries_[static_cast<std::size_t>(e)];
  Bucket& bk = buckets_[static_cast<std::size_t>(b)];
  en.bucket = b;
  en.prev = -1;
  en.next = bk.first;
  if (bk.first >= 0) entries_[static_cast<std::size_t>(bk.first)].prev = e;
  bk.first = e;
}

void HotKeys::bump(int e, std::uint64_t n) {
  const int from = entries_[static_cast<std::size_t>(e)].bucket;
  const std::uint64_t target = buckets_[static_cast<std::size_t>(from)].count + n;
  entries_[static_cast<std::size_t>(e)].count = target;
  // The last bucket below the target count; for n = 1 the walk takes no step.
  int at = from;
  for (int nx = buckets_[static_cast<std::size_t>(at)].next;
       nx >= 0 && buckets_[static_cast<std::size_t>(nx)].count < target;
       nx = buckets_[static_cast<std::size_t>(at)].next) {
    at = nx;
  }
  const int nx = buckets_[static_cast<std::size_t>(at)].next;
  // The new bucket goes in before the old one may be freed, so `at` stays valid.
  const int dest = (nx >= 0 && buckets_[static_cast<std::size_t>(nx)].count == target) ? nx : new_bucket(target, at);
  detach(e);
  attach(e, dest);
}

void HotKeys::place(int e) {
  const std::uint64_t count = entries_[static_cast<std::size_t>(e)].count;
  int at = -1;  // the last bucket below `count`; -1 = none
  for (int b = lowest_; b >= 0 && buckets_[static_cast<std::size_t>(b)].count < count;
       b = buckets_[static_cast<std::size_t>(b)].next) {
    at = b;
  }
  const int nx = at < 0 ? lowest_ : buckets_[static_cast<std::size_t>(at)].next;
  const int dest = (nx >= 0 && buckets_[static_cast<std::size_t>(nx)].count == count) ? nx : new_bucket(count, at);
  attach(e, dest);
}

void HotKeys::observe(std::string_view key, std::int64_t n) {
  if (key.empty()) throw InvalidArgument("a hot key must not be empty");
  if (key.size() > kMaxKeyBytes) {
    throw InvalidArgument("a hot key must be at most " + std::to_string(kMaxKeyBytes) + " bytes, got " +
                          std::to_string(key.size()));
  }
  if (n < 1 || n > kMaxWeight) {
    throw InvalidArgument("a hot-key observation's n must be 1.." + std::to_string(kMaxWeight) + ", got " +
                          std::to_string(n));
  }
  const auto w = static_cast<std::uint64_t>(n);
  std::lock_guard<std::mutex> g(mu_);
  total_ += w;
  if (auto it = index_.find(key); it != index_.end()) {
    bump(it->second, w);
    return;
  }
  if (entries_.size() < static_cast<std::size_t>(capacity_)) {
    const int e = static_cast<int>(entries_.size());
    entries_.push_back(Entry{std::string(key), w, 0});
    index_.emplace(entries_.back().key, e);
    place(e);
    return;
  }
  // Full: the new key takes over an entry of the lowest count, inheriting it as its error.
  const int e = buckets_[static_cast<std::size_t>(lowest_)].first;
  Entry& victim = entries_[static_cast<std::size_t>(e)];
  auto node = index_.extract(victim.key);
  victim.error = victim.count;
  victim.key.assign(key);
  node.key() = victim.key;
  index_.insert(std::move(node));
  bump(e, w);
}

std::vector<HotKey> HotKeys::top(std::int64_t n) const {
  if (n < 0) throw InvalidArgument("top(n) needs n >= 0, got " + std::to_string(n));
  std::vector<HotKey> out;
  std::lock_guard<std::mutex> g(mu_);
  // Whole buckets from the highest count down, so ties at the cut are ordered by key.
  for (int b = highest_; b >= 0 && out.size() < static_cast<std::size_t>(n);
       b = buckets_[static_cast<std::size_t>(b)].prev) {
    const std::size_t from = out.size();
    for (int e = buckets_[static_cast<std::size_t>(b)].first; e >= 0; e = entries_[static_cast<std::size_t>(e)].next) {
      const Entry& en = entries_[static_cast<std::size_t>(e)];
      out.push_back(HotKey{en.key, en.count, en.error});
    }
    std::sort(out.begin() + static_cast<std::ptrdiff_t>(from), out.end(),
              [](const HotKey& a, const HotKey& c) { return a.key < c.key; });
  }
  if (out.size() > static_cast<std::size_t>(n)) out.resize(static_cast<std::size_t>(n));
  return out;
}

std::uint64_t HotKeys::total() const {
  std::lock_guard<std::mutex> g(mu_);
  return total_;
}

std::size_t HotKeys::size() const {
  std::lock_guard<std::mutex> g(mu_);
  return entries_.size();
}

void HotKeys::reset() {
  std::lock_guard<std::mutex> g(mu_);
  clear_locked();
}

void HotKeys::clear_locked() {
  total_ = 0;
  entries_.clear();
  buckets_.clear();
  free_buckets_.clear();
  index_.clear();
  lowest_ = highest_ = -1;
}

// --- the store wrapper ---------------------------------------------------------------

HotKeysStore::HotKeysStore(std::shared_ptr<Store> inner, std::shared_ptr<HotKeys> hot_keys)
    : inner_(std::move(inner)), hot_keys_(std::move(hot_keys)) {
  if (!inner_ || !hot_keys_) throw InvalidArgument("HotKeysStore needs a store and a HotKeys");
}

void HotKeysStore::observe(const std::vector<Request>& batch) {
  HotKeys& hk = *hot_keys_;
  // A MULTI ... EXEC transaction is one request: each key it names counts once (an
  // increment is INCRBY + PEXPIREAT on one key), as the script it stands in for would.
  bool in_multi = false;
  std::vector<std::string_view> multi_keys;  // views into the batch, which outlives this call
  std::vector<std::string_view> keys;
  // A key the table refuses (over-long) is not observed: the request itself goes on.
  auto see = [&](std::string_view key) {
    if (key.empty() || key.size() > HotKeys::kMaxKeyBytes) return;
    if (!in_multi) return hk.observe(key, 1);
    if (std::find(multi_keys.begin(), multi_keys.end(), key) == multi_keys.end()) multi_keys.push_back(key);
  };
  auto is = [](const std::string& name, std::string_view what) {
    return name.size() == what.size() && std::equal(name.begin(), name.end(), what.begin(), [](char a, char b) {
             return std::toupper(static_cast<unsigned char>(a)) == b;
           });
  };
  for (const Request& r : batch) {
    if (const auto* call = std::get_if<ScriptCall>(&r)) {
      if (!call->keys.empty()) see(call->keys.front());
      continue;
    }
    const auto& args = std::get<Command>(r).args;
    if (args.empty()) continue;
    if (is(args[0], "MULTI")) {
      in_multi = true;
      continue;
    }
    if (is(args[0], "EXEC") || is(args[0], "DISCARD")) {
      in_multi = false;
      for (std::string_view k : multi_keys) hk.observe(k, 1);
      multi_keys.clear();
      continue;
    }
    // Key positions come from the table the cluster router routes by, so both agree on
    // which arguments of a command are keys. A script sent as EVAL/EVALSHA counts its first
    // key only, like a script call above.
    keys.clear();
    if (keys_of(r, keys) != KeyRole::Keyed) continue;
    const bool script = is(args[0], "EVAL") || is(args[0], "EVALSHA") || is(args[0], "EVAL_RO") ||
                        is(args[0], "EVALSHA_RO") || is(args[0], "FCALL") || is(args[0], "FCALL_RO");
    for (std::string_view k : keys) {
      see(k);
      if (script) break;
    }
  }
  for (std::string_view k : multi_keys) hk.observe(k, 1);  // a MULTI without its EXEC
}

std::vector<Reply> HotKeysStore::execute(const std::vector<Request>& batch) {
  observe(batch);
  return inner_->execute(batch);
}

void HotKeysStore::submit(std::vector<Request> batch, BatchDone done, CancelFlag cancelled) {
  observe(batch);
  inner_->submit(std::move(batch), std::move(done), std::move(cancelled));
}

std::shared_ptr<Store> observe_hot_keys(std::shared_ptr<Store> store, std::shared_ptr<HotKeys> hot_keys) {
  return std::make_shared<HotKeysStore>(std::move(store), std::move(hot_keys));
}

}  // namespace redcount
