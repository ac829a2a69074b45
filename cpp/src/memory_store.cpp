#include "redcount/memory_store.h"

#include <algorithm>
#include <cctype>
#include <limits>

#include "redcount/errors.h"
#include "redcount/util.h"

namespace redcount {
namespace {

constexpr const char* kNotInteger = "ERR value is not an integer or out of range";
constexpr const char* kOverflow = "ERR increment or decrement would overflow";
constexpr const char* kSyntax = "ERR syntax error";

std::string upper(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return out;
}

Reply wrong_args(std::string_view cmd) {
  return Reply::of_error("ERR wrong number of arguments for '" + ascii_lower(cmd) + "' command");
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
    auto it = s_.data_.find(key);
    if (it == s_.data_.end()) return nullptr;
    if (it->second.expire_at != 0 && it->second.expire_at <= now_) {
      erase(it);
      return nullptr;
    }
    return &it->second;
  }

  void erase(std::unordered_map<std::string, Entry>::iterator it) {
    if (it->second.expire_at != 0) s_.expiry_.erase({it->second.expire_at, it->first});
    s_.data_.erase(it);
  }

  void set_expiry(const std::string& key, Entry& e, std::int64_t at) {
    if (e.expire_at != 0) s_.expiry_.erase({e.expire_at, key});
    e.expire_at = at;
    if (at != 0) s_.expiry_.insert({at, key});
  }

  std::optional<std::string> get(const std::string& key) override {
    Entry* e = find(key);
    if (!e) return std::nullopt;
    return e->value;
  }

  std::int64_t incrby(const std::string& key, std::int64_t amount) override {
    Entry* e = find(key);
    std::int64_t cur = 0;
    if (e) {
      auto v = parse_int64(e->value);
      if (!v) throw ReplyError(kNotInteger);
      cur = *v;
    }
    if ((amount > 0 && cur > std::numeric_limits<std::int64_t>::max() - amount) ||
        (amount < 0 && cur < std::numeric_limits<std::int64_t>::min() - amount)) {
      throw ReplyError(kOverflow);
    }
    cur += amount;
    if (e) {
      e->value = to_string(cur);
    } else {
      s_.data_[key] = Entry{to_string(cur), 0};
    }
    return cur;
  }

  // SET with every option; returns false when NX/XX prevented it.
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

 private:
  MemoryStore& s_;
  std::int64_t now_;
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
    while (!expiry_.empty() && expiry_.begin()->first <= now && slice < 1024) {
      auto node = expiry_.extract(expiry_.begin());
      data_.erase(node.value().second);
      ++slice;
    }
    freed += slice;
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
        out.push_back(call.script->native(ops, call.keys, call.args));
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
    data_.clear();
    expiry_.clear();
    return Reply::of_status("OK");
  }
  std::string shown;
  for (std::size_t i = 1; i < n && i < 4; ++i) shown += "'" + args[i] + "' ";
  return Reply::of_error("ERR unknown command '" + args[0] + "', with args beginning with: " + shown);
}

}  // namespace redcount
