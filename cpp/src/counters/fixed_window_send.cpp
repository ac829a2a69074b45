#include "counters/fixed_window_send.h"

#include <algorithm>
#include <map>

#include "redcount/common/errors.h"
#include "redcount/common/util.h"

namespace redcount::fixed_window_detail {

std::vector<Request> SendOp::prepare() {
  if (core_.options.mode == FixedWindowOptions::Mode::Commands) return commands();
  const bool ids = std::any_of(items_.begin(), items_.end(),
                               [](const WindowedIncrement& w) { return !w.request_id_key.empty(); });
  // The transaction costs the server less and the client more (about 8,700 more client
  // instructions per increment: four commands and five replies against one of each).
  // Alone, or pipelined with other calls (coroutines, threads sharing a socket), the
  // server's time counts most; threads each on a socket of their own spend the client's
  // CPU first (measured: 8 threads 54-59k/s with the transaction, 57-65k/s with the
  // script, as before the engine). Both forms count and hold TTLs alike.
  // A batch (incr_many, a retry queue's drain) takes the script: there the client's cost per
  // key is what bounds one caller (measured over 1,000 keys: 1.0-1.2 us of client CPU per
  // key with the transaction, 0.4-0.5 us with 128 keys per script call; the server's
  // 1.3-1.4 us becomes 1.4-1.7 us).
  if (ids || !transaction_ok_) return scripts();
  if (items_.size() == 1) return transaction();
  // On a cluster a call keeps to one hash slot, so a batch of keys without a shared tag
  // becomes a call per key or so; there a one-key script costs the server about 2.5x the
  // transaction (4.6 against 1.7 us), and the server's time is what the masters scale by.
  std::vector<std::uint32_t> shards;
  shards.reserve(items_.size());
  for (const auto& w : items_) shards.push_back(core_.store->shard_of(w.storage_key));
  std::sort(shards.begin(), shards.end());
  const auto distinct = static_cast<std::size_t>(std::unique(shards.begin(), shards.end()) - shards.begin());
  return distinct * 4 > items_.size() ? transaction() : scripts();
}

std::vector<Request> SendOp::finish(std::vector<Reply> replies) {
  switch (step_) {
    case Step::Scripts: complete(scripts_done(replies)); return {};
    case Step::Transaction: return transaction_done(replies);
    case Step::Commands: return commands_done(replies);
    case Step::Repair:
      try {
        for (const Reply& rr : replies) rr.check();
      } catch (const Error& e) {
        repair_failed(e);
      }
      complete(std::move(out_));
      return {};
  }
  return {};
}

std::vector<Request> SendOp::fail(std::exception_ptr error) {
  if (step_ != Step::Repair) std::rethrow_exception(error);
  try {
    std::rethrow_exception(error);
  } catch (const Error& e) {
    repair_failed(e);
  }
  complete(std::move(out_));
  return {};
}

std::vector<Request> SendOp::scripts() {
  step_ = Step::Scripts;
  std::vector<Request> batch;
  if (items_.size() == 1) {  // incr(): one call, nothing to group
    const std::size_t only = 0;
    batch.push_back(script_call(&only, 1, items_[0].expire_at_ms));
    return batch;
  }
  // The calls go in one pipeline, so the server runs the first while later ones are
  // still being sent.
  std::map<std::pair<std::int64_t, std::uint32_t>, std::vector<std::size_t>> by_deadline;
  for (std::size_t i = 0; i < items_.size(); ++i) {
    by_deadline[{items_[i].expire_at_ms, core_.store->shard_of(items_[i].storage_key)}].push_back(i);
  }
  const std::size_t per_call = core_.options.max_script_batch;
  for (const auto& [group_key, indexes] : by_deadline) {
    const std::int64_t deadline = group_key.first;
    for (std::size_t start = 0; start < indexes.size(); start += per_call) {
      const std::size_t end = std::min(indexes.size(), start + per_call);
      batch.push_back(script_call(indexes.data() + start, end - start, deadline));
    }
  }
  return batch;
}

ScriptCall SendOp::script_call(const std::size_t* idx, std::size_t n, std::int64_t deadline) {
  auto args = std::make_shared<IncrArgs>();
  args->deadline = deadline;
  ScriptCall call{&kFixedWindowIncrScript, {}, {}};
  std::size_t ids = 0;
  for (std::size_t g = 0; g < n; ++g) ids += items_[idx[g]].request_id_key.empty() ? 0 : 1;
  call.keys.reserve(n + ids);
  // Without a retry queue nothing reads an item's storage key once its call is made (replies
  // go back by position, errors name the caller's key), so the call takes it: one copy and
  // one allocation less per key of a batch. A queue keeps them, to park what failed.
  const bool take = !core_.queueing();
  for (std::size_t g = 0; g < n; ++g) {
    WindowedIncrement& w = items_[idx[g]];
    call.keys.push_back(take ? std::move(w.storage_key) : w.storage_key);
    args->amounts.push_back(items_[idx[g]].amount);
    members_.push_back(idx[g]);
  }
  for (std::size_t g = 0; g < n && ids > 0; ++g) {
    if (items_[idx[g]].request_id_key.empty()) continue;
    call.keys.push_back(items_[idx[g]].request_id_key);
    args->rid_items.push_back(static_cast<std::int64_t>(g + 1));
  }
  group_end_.push_back(members_.size());
  sent_.push_back(args);
  call.typed = std::move(args);
  return call;
}

std::span<const std::size_t> SendOp::group(std::size_t c) const {
  const std::size_t begin = c == 0 ? 0 : group_end_[c - 1];
  return {members_.data() + begin, group_end_[c] - begin};
}

std::vector<Reply> SendOp::scripts_done(std::vector<Reply>& replies) {
  if (replies.size() != group_end_.size()) throw ProtocolError("fixed_window_incr: reply count mismatch");
  // A typed twin's answer, or the script's array reply: the per-item replies of call c.
  auto items_of = [&](std::size_t c) -> Reply* {
    Reply& r = replies[c];
    if (r.type == Reply::Type::Status && r.str == kAnsweredInPlace && sent_[c]->answered) {
      return sent_[c]->replies.size() == group(c).size() ? sent_[c]->replies.data() : nullptr;
    }
    if (r.type == Reply::Type::Array && r.elements.size() == group(c).size()) return r.elements.data();
    return nullptr;
  };
  if (items_.size() == 1 && replies.size() == 1) {  // incr(): the replies vector serves as the result
    if (Reply* item = items_of(0)) {
      Reply only = std::move(*item);
      replies[0] = std::move(only);
    } else if (!replies[0].is_error()) {
      throw ProtocolError("fixed_window_incr returned an unexpected reply");
    }
    return std::move(replies);
  }
  std::vector<Reply> out(items_.size());
  for (std::size_t c = 0; c < replies.size(); ++c) {
    const auto members = group(c);
    if (Reply* item = items_of(c)) {
      for (std::size_t g = 0; g < members.size(); ++g) out[members[g]] = std::move(item[g]);
    } else if (replies[c].is_error()) {
      for (std::size_t g : members) out[g] = replies[c];  // the whole call failed
    } else {
      throw ProtocolError("fixed_window_incr returned an unexpected reply");
    }
  }
  return out;
}

std::vector<Request> SendOp::transaction() {
  step_ = Step::Transaction;
  std::vector<Request> batch;
  if (items_.size() == 1) {  // incr(): one group, nothing to sort by shard
    const std::size_t only = 0;
    batch.reserve(4);
    transaction_group(batch, &only, 1);
    return batch;
  }
  std::map<std::uint32_t, std::vector<std::size_t>> by_shard;
  for (std::size_t i = 0; i < items_.size(); ++i) by_shard[core_.store->shard_of(items_[i].storage_key)].push_back(i);
  batch.reserve(items_.size() * 2 + by_shard.size() * 2);
  const std::size_t per_call = core_.options.max_script_batch;
  for (const auto& [shard, indexes] : by_shard) {
    for (std::size_t start = 0; start < indexes.size(); start += per_call) {
      const std::size_t end = std::min(indexes.size(), start + per_call);
      transaction_group(batch, indexes.data() + start, end - start);
    }
  }
  return batch;
}

void SendOp::transaction_group(std::vector<Request>& batch, const std::size_t* idx, std::size_t n) {
  batch.emplace_back(Command{{"MULTI"}});
  // The keys of a batch mostly share one deadline: its text is made once.
  std::int64_t deadline = 0;
  std::string deadline_text;
  for (std::size_t g = 0; g < n; ++g) {
    const WindowedIncrement& w = items_[idx[g]];
    if (deadline_text.empty() || w.expire_at_ms != deadline) {
      deadline = w.expire_at_ms;
      deadline_text = std::to_string(deadline);
    }
    batch.emplace_back(Command{{"INCRBY", w.storage_key, std::to_string(w.amount)}});
    batch.emplace_back(Command{{"PEXPIREAT", w.storage_key, deadline_text, "LT"}});
    members_.push_back(idx[g]);
  }
  batch.emplace_back(Command{{"EXEC"}});
  group_end_.push_back(members_.size());
}

std::vector<Request> SendOp::transaction_done(std::vector<Reply>& replies) {
  std::size_t expected = 0;
  for (std::size_t c = 0; c < group_end_.size(); ++c) expected += 2 + 2 * group(c).size();
  if (replies.size() != expected) throw ProtocolError("fixed-window transaction: reply count mismatch");
  out_.assign(items_.size(), Reply{});
  std::size_t r = 0;
  for (std::size_t c = 0; c < group_end_.size(); ++c) {
    const auto members = group(c);
    const std::size_t first = r;
    r += 1 + 2 * members.size();  // +OK, then +QUEUED per command
    Reply& exec = replies[r++];
    if (exec.type != Reply::Type::Array || exec.elements.size() != 2 * members.size()) {
      // EXECABORT (a command refused while queueing) or a failure of the whole call:
      // nothing of it ran. The refusal itself (LOADING, READONLY...) says more than
      // EXECABORT, and whether it is worth retrying.
      Reply whole = exec.is_error() ? exec : Reply::of_error("ERR EXEC returned an unexpected reply");
      for (std::size_t q = first; q + 1 < r; ++q) {
        if (replies[q].is_error()) {
          whole = replies[q];
          break;
        }
      }
      for (std::size_t i : members) out_[i] = whole;
      continue;
    }
    for (std::size_t g = 0; g < members.size(); ++g) {
      Reply& incr = exec.elements[2 * g];
      const Reply& expire = exec.elements[2 * g + 1];
      if (!incr.is_error() && expire.is_error()) fix_.push_back(members[g]);  // LT refused: plain repair
      out_[members[g]] = std::move(incr);
    }
  }
  if (fix_.empty()) {
    complete(std::move(out_));
    return {};
  }
  step_ = Step::Repair;
  std::vector<Request> repair;
  for (std::size_t i : fix_) {
    repair.emplace_back(Command{{"PEXPIREAT", items_[i].storage_key, std::to_string(items_[i].expire_at_ms)}});
  }
  return repair;
}

std::vector<Request> SendOp::commands() {
  step_ = Step::Commands;
  // TIME first, so a PTTL can be compared with the deadline on the server's clock (a
  // key given a later expiry by a foreign write is repaired like one without any); then
  // per item: SET key 0 NX PXAT deadline; INCRBY key amount; PTTL key.
  // (amount 0 marks a pending TTL repair: PTTL only.)
  std::vector<Request> batch;
  batch.reserve(1 + items_.size() * 3);
  batch.emplace_back(Command{{"TIME"}});
  for (const auto& inc : items_) {
    if (inc.amount > 0) {
      batch.emplace_back(Command{{"SET", inc.storage_key, "0", "NX", "PXAT", std::to_string(inc.expire_at_ms)}});
      batch.emplace_back(Command{{"INCRBY", inc.storage_key, std::to_string(inc.amount)}});
    }
    batch.emplace_back(Command{{"PTTL", inc.storage_key}});
  }
  return batch;
}

std::vector<Request> SendOp::commands_done(const std::vector<Reply>& replies) {
  std::size_t expected = 1;
  for (const auto& inc : items_) expected += inc.amount > 0 ? 3 : 1;
  if (replies.size() != expected) throw ProtocolError("fixed-window commands: reply count mismatch");
  // The server's time in ms, when it answered TIME (a proxy may refuse it: then only a
  // missing TTL can be seen).
  std::optional<std::int64_t> server_now;
  if (const Reply& t = replies[0]; t.type == Reply::Type::Array && t.elements.size() == 2) {
    auto s = parse_int64(t.elements[0].str);
    auto us = parse_int64(t.elements[1].str);
    if (s && us && *s >= 0 && *s < (std::int64_t{1} << 40)) server_now = *s * 1000 + *us / 1000;
  }
  // No TTL, or one past the deadline (PTTL runs after TIME, so a deadline set by us
  // never looks too late).
  auto unbounded = [&](const Reply& pttl, std::int64_t deadline) {
    if (pttl.type != Reply::Type::Integer) return false;
    return pttl.integer == -1 || (server_now && pttl.integer > deadline - *server_now);
  };
  std::size_t r = 1;
  for (std::size_t i = 0; i < items_.size(); ++i) {
    const auto& inc = items_[i];
    if (inc.amount == 0) {
      const Reply& pttl = replies[r++];
      out_.push_back(Reply::of_integer(0));
      if (unbounded(pttl, inc.expire_at_ms)) fix_.push_back(i);
      continue;
    }
    const Reply& set = replies[r];
    const Reply& incr = replies[r + 1];
    const Reply& pttl = replies[r + 2];
    r += 3;
    if (set.is_error()) {
      out_.push_back(set);
      continue;
    }
    out_.push_back(incr);
    if (incr.is_error()) {
      // A foreign value: the error stands, and the key still ends with its window.
      if (unbounded(pttl, inc.expire_at_ms)) fix_.push_back(i);
      continue;
    }
    // The key expired between SET and INCRBY (so INCRBY created it bare), or its TTL was
    // lost: either way PTTL reads -1. INCRBY == amount with no SET means the same race.
    const bool bare = unbounded(pttl, inc.expire_at_ms);
    const bool first_without_set =
        incr.type == Reply::Type::Integer && incr.integer == inc.amount && set.is_nil();
    if (bare || first_without_set) fix_.push_back(i);
  }
  if (fix_.empty()) {
    complete(std::move(out_));
    return {};
  }
  // The follow-up, only when a deadline is missing: PEXPIREAT key deadline.
  step_ = Step::Repair;
  std::vector<Request> repair;
  for (std::size_t i : fix_) {
    repair.emplace_back(Command{{"PEXPIREAT", items_[i].storage_key, std::to_string(items_[i].expire_at_ms)}});
  }
  return repair;
}

void SendOp::repair_failed(const Error& e) {
  if (!(core_.queueing() && is_transient(e))) throw;
  std::vector<WindowedIncrement> repairs;
  for (std::size_t i : fix_) {
    WindowedIncrement w = items_[i];
    w.amount = 0;
    w.request_id_key.clear();
    repairs.push_back(std::move(w));
  }
  try {
    core_.enqueue(std::move(repairs), e.what());
  } catch (const RetryQueueFull&) {
    // Counted in stats().overflowed; the next increment of these keys repairs them.
    // The increments themselves landed, so this call must not report a failure.
  }
}

}  // namespace redcount::fixed_window_detail
