// The sending step of the fixed-window counter's increments (SendOp), and the state the
// counter shares with its operations (Core). SendOp is the protocol: one script call per
// group of items, a MULTI/EXEC transaction, or the commands-mode sequence with its TTL
// repair; the counter's operations (fixed_window.cpp) wrap it with the retry policy.
// Private to counters/.
#pragma once

#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "redcount/counters/fixed_window.h"
#include "store/script_args.h"

namespace redcount {

struct FixedWindowCounter::Core {
  std::shared_ptr<Store> store;
  FixedWindowOptions options;
  WindowSpec spec;
  std::shared_ptr<RetryQueue> retry;  // also what close() closes (with on_error="raise" it stays empty)

  bool queueing() const noexcept { return options.on_error == FixedWindowOptions::OnError::Queue; }
  void check_open() const {
    if (retry->closed()) throw Error("this counter is closed; create a new FixedWindowCounter");
  }
  // Whether a batch without request ids may go as MULTI/INCRBY/PEXPIREAT LT/EXEC rather
  // than as script calls: read when the operation is made, so its steps read no store state.
  bool transaction_ok() const { return store->has_expire_options() && !store->contended(); }
  WindowedIncrement resolve(std::string_view key, std::int64_t amount, std::string_view request_id,
                            std::int64_t now) const;
  void enqueue(std::vector<WindowedIncrement> items, const std::string& error);
};

namespace fixed_window_detail {

using Core = FixedWindowCounter::Core;

// Sends increments and answers one reply per item (a count, or the item's error reply).
// Script mode: one script call per max_script_batch items sharing a deadline and a shard.
// Commands mode: SET NX PXAT + INCRBY + PTTL per item, then a PEXPIREAT follow-up batch
// for the items whose deadline is missing; if that repair fails transiently under
// OnError::Queue, TTL repairs (amount 0) go to the retry queue, since the increments
// themselves landed and must never be counted again.
class SendOp final : public Op<std::vector<Reply>> {
 public:
  SendOp(Core& core, std::vector<WindowedIncrement> items, bool transaction_ok)
      : core_(core), items_(std::move(items)), transaction_ok_(transaction_ok) {}

  const std::vector<WindowedIncrement>& items() const noexcept { return items_; }

  std::vector<Request> prepare() override;

  std::vector<Request> finish(std::vector<Reply> replies) override;

  std::vector<Request> fail(std::exception_ptr error) override;

 private:
  enum class Step { Scripts, Transaction, Commands, Repair };
  std::vector<Request> scripts();

  // One fixed_window_incr call for the items at `idx[0..n)`, recorded as the next group
  // of members_. Its arguments are typed (a memory store reads them as they are; Redis gets
  // them rendered as the script's ARGV).
  ScriptCall script_call(const std::size_t* idx, std::size_t n, std::int64_t deadline);

  // The item indexes of call `c`.
  std::span<const std::size_t> group(std::size_t c) const;
  std::vector<Reply> scripts_done(std::vector<Reply>& replies);

  // Redis >= 7.0 without request ids: MULTI, then per item INCRBY key amount and
  // PEXPIREAT key deadline LT, then EXEC. LT sets the deadline when the key has none (its
  // first increment, or a TTL lost to PERSIST or a foreign SET) and lowers a foreign one
  // that is later, so this keeps every guarantee of the script at about a third of the
  // server's time (measured: 1.7 against 4.6 us per increment, pipelined).
  std::vector<Request> transaction();

  // MULTI, INCRBY and PEXPIREAT LT per item of `idx[0..n)`, EXEC; recorded in members_.
  void transaction_group(std::vector<Request>& batch, const std::size_t* idx, std::size_t n);
  std::vector<Request> transaction_done(std::vector<Reply>& replies);
  std::vector<Request> commands();
  std::vector<Request> commands_done(const std::vector<Reply>& replies);

  // Called inside a catch block: queues TTL repairs, or rethrows.
  void repair_failed(const Error& e);

  Core& core_;
  std::vector<WindowedIncrement> items_;
  bool transaction_ok_ = false;
  Step step_ = Step::Scripts;
  // Item indexes in call order (script calls, or MULTI groups); call c's are
  // members_[group_end_[c - 1], group_end_[c]). One inline slot each: incr() allocates none.
  detail::SmallVec<std::size_t, 1> members_;
  detail::SmallVec<std::size_t, 1> group_end_;
  detail::SmallVec<std::shared_ptr<const IncrArgs>, 1> sent_;  // per script call
  std::vector<Reply> out_;                          // commands mode: per-item replies
  std::vector<std::size_t> fix_;                    // commands mode: items to repair
};

}  // namespace fixed_window_detail
}  // namespace redcount
