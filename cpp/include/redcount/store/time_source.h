// Where counters and limiters take "now" from, and the operations that carry a time.
//
//   TimeSource time(store, ClockMode::Server);
//   struct Spec {   // what one operation sends and how it reads the reply
//     ScriptCall call(std::optional<std::int64_t> now);  // nullopt: the script reads TIME
//     Decision finish(Reply reply);
//   };
//   auto op = std::make_shared<ClockedScript<Decision, Spec>>(time, 1, Spec{...});
//   Decision d = run(*store, *op);
//
// Modes:
// - Client: the store's client clock (the system clock, or an injected one). Cheapest;
//   correct when the app servers' clocks agree to well under a window.
// - Server: scripts read Redis TIME themselves (the time argument is sent empty), so every
//   client shares the server's clock whatever their own clocks say. On the memory store
//   the store's clock is the server clock.
// - ServerOffset: the client clock corrected by an offset measured with the TIME command
//   (one extra request every 10 s, sent by the operation that finds the offset stale,
//   before its own request). For deployments that refuse TIME inside scripts: when a
//   Server-mode script fails, a probe script checks whether TIME is the reason, and only
//   if the server refuses it (not on a transient error such as BUSY) the source switches
//   to ServerOffset for good and the operation reruns its call.
//
// None of this does I/O: the steps are follow-up batches of the operation (ClockedScript,
// ClockedBatch). TimeSource is a handle on shared state: copies (one per operation) see
// the same mode and offset. Thread-safe.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "redcount/common/errors.h"
#include "redcount/store/operation.h"
#include "redcount/store/store.h"
#include "redcount/store/scripts.h"

namespace redcount {

enum class ClockMode { Client, Server, ServerOffset };

// "client", "server" or "server-offset"; anything else throws InvalidArgument.
ClockMode parse_clock_mode(std::string_view text);
std::string_view clock_mode_name(ClockMode mode) noexcept;

// `return redis.call('TIME')`: succeeds where scripts may read the server's clock.

class TimeSource {
 public:
  TimeSource(std::shared_ptr<Store> store, ClockMode mode);

  ClockMode requested() const noexcept { return state_->requested; }
  // The mode in force: Server turns into ServerOffset after the server refused TIME.
  ClockMode effective() const noexcept { return state_->effective.load(std::memory_order_acquire); }

  // True when now_ms() needs a fresh offset first: send time_request(), then
  // record_time() with its reply and the client times around it.
  bool offset_stale() const;
  static Request time_request() { return Command{{"TIME"}}; }
  // The offset's refresh, for an operation to send before its own requests when
  // offset_stale(): the TIME request (`sent_ms` receives the client time it leaves at)...
  std::vector<Request> refresh_requests(std::int64_t& sent_ms) const {
    sent_ms = client_now_ms();
    std::vector<Request> out;
    out.push_back(time_request());
    return out;
  }
  // ...and its replies recorded, with the client times around the round trip.
  void refresh_done(const std::vector<Reply>& replies, std::int64_t sent_ms) {
    if (replies.size() != 1) throw ProtocolError("expected one reply to TIME");
    record_time(replies.front(), sent_ms, client_now_ms());
  }
  // Throws ReplyError when the server refused TIME, ProtocolError for a malformed reply.
  void record_time(const Reply& reply, std::int64_t sent_ms, std::int64_t received_ms);
  // Milliseconds since the epoch by this source, computed on the client: the client clock
  // plus the last measured offset unless the mode is Client (or the store's clock is the
  // server's). Used where a key name depends on the time, as in fixed windows.
  std::int64_t now_ms() const;
  std::int64_t client_now_ms() const { return state_->store->now_ms(); }
  // After the server refused TIME inside scripts.
  void switch_to_offset() noexcept { state_->effective.store(ClockMode::ServerOffset, std::memory_order_release); }

 private:
  struct State {
    std::shared_ptr<Store> store;
    ClockMode requested;
    std::atomic<ClockMode> effective;
    mutable std::mutex mu;
    std::int64_t offset = 0;
    bool synced = false;
    std::chrono::steady_clock::time_point synced_at{};
  };
  bool needs_offset() const noexcept {
    return effective() != ClockMode::Client && !state_->store->server_clock_is_local();
  }
  std::shared_ptr<State> state_;
};

// One script call whose time argument the operation supplies: ClockedScript runs the TIME
// sync first when the offset is stale, sends Spec::call(now) with `now` in units of
// 1/scale ms (nullopt in Server mode), and on an error reply in Server mode probes whether
// the server refuses TIME inside scripts: if it does, switches to ServerOffset and sends
// the call again. Spec::finish(reply) gets the call's reply, error replies included, and
// returns the result (or throws).
template <class R, class Spec>
class ClockedScript final : public Op<R> {
 public:
  ClockedScript(TimeSource time, std::int64_t scale, Spec spec)
      : time_(std::move(time)), scale_(scale), spec_(std::move(spec)) {}

  std::vector<Request> prepare() override {
    if (time_.effective() != ClockMode::Server && time_.offset_stale()) [[unlikely]] {
      step_ = Step::Sync;
      return time_.refresh_requests(sent_ms_);
    }
    return send();
  }

  std::vector<Request> finish(std::vector<Reply> replies) override {
    if (replies.size() != 1) [[unlikely]] {
      throw ProtocolError("expected one reply, got " + std::to_string(replies.size()));
    }
    Reply& r = replies.front();
    if (step_ == Step::Call && !r.is_error()) [[likely]] {
      this->complete(spec_.finish(std::move(r)));
      return {};
    }
    return follow_up(r);
  }

 private:
  enum class Step { Sync, Call, Probe };

  // Everything but a plain successful call: the TIME sync, the probe, the rerun.
  [[gnu::noinline]] std::vector<Request> follow_up(Reply& r) {
    switch (step_) {
      case Step::Sync:
        time_.record_time(r, sent_ms_, time_.client_now_ms());
        return send();
      case Step::Call:
        if (r.is_error() && server_time_ && !ReplyError(r.str).transient()) {
          // Error replies say little about which command failed inside a script, so ask.
          failed_ = std::move(r);
          step_ = Step::Probe;
          std::vector<Request> out;
          out.push_back(ScriptCall{&kTimeProbeScript, {}, {}});
          return out;
        }
        this->complete(spec_.finish(std::move(r)));
        return {};
      case Step::Probe:
        if (r.is_error() && !ReplyError(r.str).transient()) {
          // The server will not run TIME inside scripts (an ACL, a renamed command, an old
          // server): measure its clock from outside instead, for good.
          time_.switch_to_offset();
          return prepare();
        }
        this->complete(spec_.finish(std::move(failed_)));
        return {};
    }
    return {};
  }

  std::vector<Request> send() {
    step_ = Step::Call;
    server_time_ = time_.effective() == ClockMode::Server;
    std::optional<std::int64_t> now;
    if (!server_time_) now = time_.now_ms() * scale_;
    std::vector<Request> out;
    out.push_back(spec_.call(now));
    return out;
  }

  TimeSource time_;
  std::int64_t scale_;
  Spec spec_;
  Step step_ = Step::Call;
  bool server_time_ = false;
  std::int64_t sent_ms_ = 0;
  Reply failed_;
};

template <class R, class Spec>
std::shared_ptr<Op<R>> make_clocked_script(TimeSource time, std::int64_t scale, Spec spec) {
  return std::make_shared<ClockedScript<R, Spec>>(std::move(time), scale, std::move(spec));
}

// A batch built from the client-side time (TimeSource::now_ms()), with the TIME sync first
// when the offset is stale: Spec::batch(now) -> requests, Spec::finish(replies) -> result.
template <class R, class Spec>
class ClockedBatch final : public Op<R> {
 public:
  ClockedBatch(TimeSource time, Spec spec) : time_(std::move(time)), spec_(std::move(spec)) {}

  std::vector<Request> prepare() override {
    if (time_.offset_stale()) {
      syncing_ = true;
      return time_.refresh_requests(sent_ms_);
    }
    return spec_.batch(time_.now_ms());
  }

  std::vector<Request> finish(std::vector<Reply> replies) override {
    if (syncing_) {
      syncing_ = false;
      time_.refresh_done(replies, sent_ms_);
      return spec_.batch(time_.now_ms());
    }
    this->complete(spec_.finish(std::move(replies)));
    return {};
  }

 private:
  TimeSource time_;
  Spec spec_;
  bool syncing_ = false;
  std::int64_t sent_ms_ = 0;
};

template <class R, class Spec>
std::shared_ptr<Op<R>> make_clocked_batch(TimeSource time, Spec spec) {
  return std::make_shared<ClockedBatch<R, Spec>>(std::move(time), std::move(spec));
}

}  // namespace redcount
