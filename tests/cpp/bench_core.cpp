// Google Benchmark micro-benchmarks of the redcount core: key building, window math,
// the limit parser and the embedded store (raw commands, counters, the limiter).
//
//   redcount_micro_bench --benchmark_min_time=0.05s
#include <benchmark/benchmark.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "redcount/common/clock.h"
#include "redcount/counters/fixed_window.h"
#include "redcount/limiters/limiter.h"
#include "redcount/common/limit_string.h"
#include "redcount/memory/memory_store.h"
#include "redcount/common/options.h"
#include "redcount/common/window.h"

using namespace redcount;

namespace {

constexpr std::int64_t kT0 = 1'700'006'400'000;

std::shared_ptr<MemoryStore> bench_store() {
  StoreOptions o;
  o.clock = std::make_shared<ManualClock>(kT0);
  o.sweep_interval = std::chrono::milliseconds(0);  // no sweeper thread competing for the lock
  return std::make_shared<MemoryStore>(o);
}

FixedWindowOptions counter_options(FixedWindowOptions::Mode mode) {
  FixedWindowOptions o;
  o.name = "views";
  o.window_ms = 3'600'000;
  o.mode = mode;
  return o;
}

FixedWindowOptions::Mode mode_arg(const benchmark::State& state) {
  return state.range(0) == 0 ? FixedWindowOptions::Mode::Script : FixedWindowOptions::Mode::Commands;
}

void BM_WindowKey(benchmark::State& state) {
  std::int64_t index = 498'960;
  for (auto _ : state) {
    std::string key = window_key("redcount", "views", "page:/home", 3'600'000, index++);
    benchmark::DoNotOptimize(key);
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_WindowKey);

void BM_Locate(benchmark::State& state) {
  const WindowSpec spec{3'600'000, 1'000, state.range(0) != 0};
  std::int64_t now = kT0;
  for (auto _ : state) {
    WindowPos pos = locate(spec, "user:42", now);
    benchmark::DoNotOptimize(pos);
    now += 7;
  }
  state.SetItemsProcessed(state.iterations());
  state.SetLabel(spec.stagger ? "stagger" : "aligned");
}
BENCHMARK(BM_Locate)->Arg(0)->Arg(1);

void BM_ParseLimits(benchmark::State& state) {
  const std::string text = state.range(0) == 0 ? "10/minute" : "5/second;100/hour;1000/day";
  for (auto _ : state) {
    std::vector<RateLimit> limits = parse_limits(text);
    benchmark::DoNotOptimize(limits);
  }
  state.SetItemsProcessed(state.iterations());
  state.SetLabel(text);
}
BENCHMARK(BM_ParseLimits)->Arg(0)->Arg(1);

void BM_MemoryStoreIncrBy(benchmark::State& state) {
  auto store = bench_store();
  const std::vector<Request> batch{Command{{"INCRBY", "redcount:views:{page:/home}:3600000:498960", "1"}}};
  for (auto _ : state) {
    std::vector<Reply> replies = store->execute(batch);
    benchmark::DoNotOptimize(replies);
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_MemoryStoreIncrBy);

void BM_FixedWindowIncr(benchmark::State& state) {
  FixedWindowCounter counter(bench_store(), counter_options(mode_arg(state)));
  for (auto _ : state) {
    std::int64_t n = counter.incr("page:/home", 1);
    benchmark::DoNotOptimize(n);
  }
  state.SetItemsProcessed(state.iterations());
  state.SetLabel(state.range(0) == 0 ? "script" : "commands");
}
BENCHMARK(BM_FixedWindowIncr)->Arg(0)->Arg(1);

void BM_FixedWindowIncrMany128(benchmark::State& state) {
  FixedWindowCounter counter(bench_store(), counter_options(mode_arg(state)));
  std::vector<std::pair<std::string, std::int64_t>> items;
  for (int i = 0; i < 128; ++i) items.emplace_back(std::string("page:/").append(std::to_string(i)), 1 + i % 3);
  for (auto _ : state) {
    std::vector<std::int64_t> counts = counter.incr_many(items);
    benchmark::DoNotOptimize(counts);
  }
  state.SetItemsProcessed(state.iterations() * 128);  // items/s = increments per second
  state.SetLabel(state.range(0) == 0 ? "script" : "commands");
}
BENCHMARK(BM_FixedWindowIncrMany128)->Arg(0)->Arg(1);

void BM_LimiterHit(benchmark::State& state) {
  auto store = bench_store();
  auto limiter = make_limiter(store, "fixed-window", "redcount:lim");
  // Limits so high that every hit is allowed: the full charging path each time.
  const std::vector<RateLimit> limits = parse_limits("1000000000/second;1000000000/hour");
  for (auto _ : state) {
    Decision d = limiter->hit(limits, "ip:203.0.113.9", 1);
    benchmark::DoNotOptimize(d);
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_LimiterHit);

}  // namespace
