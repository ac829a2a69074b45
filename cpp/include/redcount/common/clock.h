// Time sources in milliseconds since the Unix epoch.
//
// Stores own a clock: the Redis store uses the system clock, the memory store
// can be given a ManualClock so tests step through windows without sleeping:
//
//   auto clock = std::make_shared<ManualClock>(1'700'000'000'000);
//   MemoryStore store({.clock = clock});
//   clock->advance(60'000);
//
// All clocks are thread-safe.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>

namespace redcount {

class Clock {
 public:
  virtual ~Clock() = default;
  virtual std::int64_t now_ms() const = 0;
};

class SystemClock final : public Clock {
 public:
  std::int64_t now_ms() const override {
    using namespace std::chrono;
    return duration_cast<milliseconds>(system_clock::now().time_since_epoch()).count();
  }
};

class ManualClock final : public Clock {
 public:
  explicit ManualClock(std::int64_t start_ms) : now_(start_ms) {}
  std::int64_t now_ms() const override { return now_.load(std::memory_order_acquire); }
  void set(std::int64_t ms) { now_.store(ms, std::memory_order_release); }
  void advance(std::int64_t ms) { now_.fetch_add(ms, std::memory_order_acq_rel); }

 private:
  std::atomic<std::int64_t> now_;
};

}  // namespace redcount
