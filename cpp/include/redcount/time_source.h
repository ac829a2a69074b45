// Where counters and limiters take "now" from.
//
//   TimeSource time(store, ClockMode::Server);
//   ScriptCall call{&script, {key}, {time.script_now_ms(), ...}};
//   Reply r = time.run(std::move(call), 0);   // ARGV[1] is the time argument
//
// Modes:
// - Client: the store's client clock (the system clock, or an injected one). Cheapest;
//   correct when the app servers' clocks agree to well under a window.
// - Server: scripts read Redis TIME themselves (the time argument is sent empty), so every
//   client shares the server's clock whatever their own clocks say. On the memory store
//   the store's clock is the server clock.
// - ServerOffset: the client clock corrected by an offset measured with the TIME command
//   (one extra round trip every 10 s). For deployments that refuse TIME inside scripts:
//   when a Server-mode script fails, a probe script checks whether TIME is the reason,
//   and if so the source switches to ServerOffset for good and reruns the call.
//
// Thread-safe.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>

#include "redcount/store.h"

namespace redcount {

enum class ClockMode { Client, Server, ServerOffset };

// "client", "server" or "server-offset"; anything else throws InvalidArgument.
ClockMode parse_clock_mode(std::string_view text);
std::string_view clock_mode_name(ClockMode mode) noexcept;

// `return redis.call('TIME')`: succeeds where scripts may read the server's clock.
extern const Script kTimeProbeScript;

class TimeSource {
 public:
  TimeSource(std::shared_ptr<Store> store, ClockMode mode);

  ClockMode requested() const noexcept { return requested_; }
  // The mode in force: Server turns into ServerOffset after the server refused TIME.
  ClockMode effective() const noexcept { return effective_.load(std::memory_order_acquire); }

  // Milliseconds since the epoch by this source, computed on the client. In Server mode
  // this is the client clock plus the measured offset (used where a key name depends on
  // the time, as in fixed windows).
  std::int64_t now_ms();
  // The time argument of a script call: "" in Server mode (the script reads TIME),
  // else now_ms() (times `scale`, e.g. 1000 for microseconds) as decimal text.
  std::string script_now(std::int64_t scale = 1);
  // Runs a script call whose argument `now_arg` is the time argument. If the server
  // refuses TIME inside scripts, switches to ServerOffset and reruns the call once.
  Reply run(ScriptCall call, std::size_t now_arg, std::int64_t scale = 1);

 private:
  std::int64_t offset_ms();
  bool script_time_allowed();

  std::shared_ptr<Store> store_;
  ClockMode requested_;
  std::atomic<ClockMode> effective_;
  std::mutex mu_;
  std::int64_t offset_ = 0;
  bool synced_ = false;
  std::chrono::steady_clock::time_point synced_at_{};
};

}  // namespace redcount
