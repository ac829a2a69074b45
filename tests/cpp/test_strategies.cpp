// The sliding, bucket and concurrency limiters, the sliding-window counter and the time
// source, on a MemoryStore with a ManualClock; their native scripts fed malformed input;
// and, when REDCOUNT_TEST_REDIS_URL is set, every Lua script against its native twin.
#include <gtest/gtest.h>

#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "redcount/clock.h"
#include "redcount/errors.h"
#include "redcount/limiter.h"
#include "redcount/limits.h"
#include "redcount/memory_store.h"
#include "redcount/options.h"
#include "redcount/redis_store.h"
#include "redcount/sliding_window.h"
#include "redcount/time_source.h"
#include "test_support.h"

using namespace redcount;
using rctest::contains;
using rctest::kT0;

namespace {

class StrategyTest : public ::testing::TestWithParam<std::string> {
 protected:
  std::shared_ptr<ManualClock> clock_ = std::make_shared<ManualClock>(kT0);
  std::shared_ptr<MemoryStore> store_ = rctest::memory_store(clock_);

  std::unique_ptr<LimiterStrategy> make(const std::string& name) { return make_limiter(store_, name, "rl"); }
};

const std::vector<std::string> kRate = {"fixed-window", "sliding-window", "sliding-window-approx", "token-bucket",
                                        "gcra"};

INSTANTIATE_TEST_SUITE_P(Rate, StrategyTest, ::testing::ValuesIn(kRate),
                         [](const auto& param_info) {
                           std::string n = param_info.param;
                           for (char& c : n) c = c == '-' ? '_' : c;
                           return n;
                         });

TEST_P(StrategyTest, AdmitsTheLimitThenRefusesAndStoresNothing) {
  auto lim = make(GetParam());
  const auto limits = parse_limits("4/minute;10/hour");
  for (int i = 0; i < 4; ++i) EXPECT_TRUE(lim->hit(limits, "k", 1).allowed) << i;
  const auto before = rctest::keys(*store_);
  std::vector<std::string> dumps;
  for (const auto& k : before) dumps.push_back(rctest::run(*store_, {"TYPE", k}).str);
  const Decision d = lim->hit(limits, "k", 1);
  EXPECT_FALSE(d.allowed);
  EXPECT_EQ(d.remaining, 0);
  EXPECT_GT(d.retry_after_ms, 0);
  EXPECT_EQ(rctest::keys(*store_), before);
  for (const auto& k : rctest::keys(*store_)) EXPECT_GT(rctest::run(*store_, {"PTTL", k}).integer, 0) << k;
}

TEST_P(StrategyTest, WaitingRetryAfterAdmits) {
  auto lim = make(GetParam());
  const auto limits = parse_limits("3/10 seconds");
  std::mt19937 rng(7);
  int admitted_after_wait = 0;
  for (int round = 0; round < 50; ++round) {
    Decision d = lim->hit(limits, "k", 1);
    if (d.allowed) {
      clock_->advance(static_cast<std::int64_t>(rng() % 700));
      continue;
    }
    clock_->advance(d.retry_after_ms - 1);
    EXPECT_FALSE(lim->test(limits, "k", 1).allowed) << "a millisecond early must still be refused";
    clock_->advance(1);
    EXPECT_TRUE(lim->hit(limits, "k", 1).allowed) << "waiting retry_after must admit";
    ++admitted_after_wait;
  }
  EXPECT_GT(admitted_after_wait, 5);
}

TEST_P(StrategyTest, CostAndInputChecks) {
  auto lim = make(GetParam());
  const auto limits = parse_limits("5/minute");
  EXPECT_TRUE(contains(rctest::error_of<InvalidArgument>([&] { lim->hit(limits, "k", 0); }), "cost must be >= 1"));
  EXPECT_TRUE(contains(rctest::error_of<InvalidArgument>([&] { lim->hit(limits, "k", 6); }), "exceeds"));
  rctest::error_of<InvalidArgument>([&] { lim->hit({}, "k", 1); });
  rctest::error_of<InvalidArgument>([&] { lim->hit(limits, "", 1); });
  rctest::error_of<InvalidArgument>([&] { lim->hit(limits, std::string("\xff\xfe"), 1); });
  rctest::error_of<InvalidArgument>([&] { lim->acquire(1, "k", 1000); });
  EXPECT_TRUE(rctest::keys(*store_).empty());
}

TEST(SlidingLog, MemoryIsBoundedByTheLimit) {
  auto clock = std::make_shared<ManualClock>(kT0);
  auto store = rctest::memory_store(clock);
  auto lim = make_limiter(store, "sliding-window", "rl");
  const auto limits = parse_limits("20/minute");
  int admitted = 0;
  for (int i = 0; i < 2000; ++i) {
    admitted += lim->hit(limits, "hammer", 1).allowed ? 1 : 0;
    clock->advance(3);
  }
  EXPECT_EQ(admitted, 20);
  EXPECT_EQ(rctest::run(*store, {"ZCARD", "rl:sw:20:{hammer}:60000"}).integer, 20);
}

TEST(SlidingApprox, RetryAfterIsTheFirstAdmittingMillisecond) {
  // Brute force: for random states, retry_after must be the first ms at which test() admits.
  auto clock = std::make_shared<ManualClock>(kT0);
  auto store = rctest::memory_store(clock);
  LimiterOptions o;
  o.prefix = "rl";
  o.sub_buckets = 4;
  auto lim = make_limiter(store, "sliding-window-approx", o);
  const auto limits = parse_limits("12/2 seconds");
  std::mt19937 rng(11);
  for (int round = 0; round < 300; ++round) {
    const std::int64_t cost = 1 + static_cast<std::int64_t>(rng() % 3);
    Decision d = lim->hit(limits, "k", cost);
    if (!d.allowed) {
      const std::int64_t start = clock->now_ms();
      std::int64_t first = -1;
      for (std::int64_t t = 0; t <= 5000 && first < 0; ++t) {
        clock->set(start + t);
        if (lim->test(limits, "k", cost).allowed) first = t;
      }
      EXPECT_EQ(first, d.retry_after_ms) << "round " << round;
      clock->set(start + d.retry_after_ms);
    }
    clock->advance(static_cast<std::int64_t>(rng() % 400));
  }
}

TEST(Concurrency, LeasesAcquireReleaseExpire) {
  auto clock = std::make_shared<ManualClock>(kT0);
  auto store = rctest::memory_store(clock);
  auto lim = make_limiter(store, "concurrency", "rl");
  auto a = lim->acquire(2, "job", 5000);
  auto b = lim->acquire(2, "job", 5000);
  ASSERT_TRUE(a && b);
  EXPECT_FALSE(lim->acquire(2, "job", 5000));
  EXPECT_EQ(lim->in_flight("job"), 2);
  EXPECT_TRUE(lim->release(*a));
  EXPECT_TRUE(contains(rctest::error_of<InvalidArgument>([&] { lim->release(*a); }), "already released"));
  clock->advance(5000);
  EXPECT_EQ(lim->in_flight("job"), 0);
  EXPECT_FALSE(lim->release(*b));  // expired before it was released
  EXPECT_TRUE(rctest::keys(*store).empty());
  rctest::error_of<InvalidArgument>([&] { lim->acquire(0, "job", 1000); });
  rctest::error_of<InvalidArgument>([&] { lim->acquire(1, "job", 0); });
  rctest::error_of<InvalidArgument>([&] { lim->release(Lease{}); });
}

TEST(SlidingCounter, CountsWeightsAndItems) {
  auto clock = std::make_shared<ManualClock>(kT0);
  auto store = rctest::memory_store(clock);
  SlidingWindowCounter c(store, "req", 10'000);
  EXPECT_EQ(c.add("k"), 1);
  EXPECT_EQ(c.add("k", 9), 10);
  clock->advance(5000);
  EXPECT_EQ(c.add("k"), 11);
  clock->advance(5000);
  EXPECT_EQ(c.count("k"), 1);
  EXPECT_EQ(c.add_unique("k", "a"), 1);
  EXPECT_EQ(c.add_unique("k", "a"), 1);
  EXPECT_EQ(c.add_unique("k", "b"), 2);
  clock->advance(10'000);
  EXPECT_EQ(c.count_unique("k"), 0);
  EXPECT_EQ(c.count("k"), 0);
  rctest::error_of<InvalidArgument>([&] { c.add("k", 0); });
  rctest::error_of<InvalidArgument>([&] { c.add("k", kMaxSlidingAmount + 1); });
  rctest::error_of<InvalidArgument>([&] { c.add_unique("k", ""); });
  rctest::error_of<InvalidArgument>([&] { SlidingWindowCounter(store, "x", 0); });
  rctest::error_of<InvalidArgument>([&] { SlidingWindowCounter(store, "x{", 1000); });
}

// Native scripts fed arguments they cannot use answer with an error reply; none crashes.
TEST(NativeScripts, MalformedArgumentsAreErrorReplies) {
  auto store = rctest::memory_store(std::make_shared<ManualClock>(kT0));
  const Script* scripts[] = {&kSlidingLogScript, &kSlidingApproxScript, &kTokenBucketScript,
                             &kGcraScript,       &kConcurrencyScript,   &kSlidingCounterScript};
  const std::vector<std::vector<std::string>> arg_sets = {
      {}, {""}, {"x", "hit", "1"}, {"", "hit", "x", "id", "5", "1000"}, {"", "hit", "1", "id", "5"},
      {"", "hit", "1", "1", "0", "1"}, {"", "acquire", "1", "1", "id", "x"}, {"", "add", "x", "1", "id"},
  };
  for (const Script* s : scripts) {
    for (const auto& args : arg_sets) {
      for (const std::vector<std::string>& keys :
           {std::vector<std::string>{}, std::vector<std::string>{"a"}, std::vector<std::string>{"a", "b"}}) {
        Reply r = store->execute_one(ScriptCall{s, keys, args});
        (void)r;  // any reply is fine; a crash or a sanitizer report is not
      }
    }
  }
  SUCCEED();
}

TEST(Limits, BurstSyntax) {
  auto l = parse_limits("10/second burst 50");
  ASSERT_EQ(l.size(), 1u);
  EXPECT_EQ(l[0].burst, 50);
  EXPECT_EQ(l[0].capacity(), 50);
  EXPECT_EQ(l[0].text(), "10/second burst 50");
  EXPECT_EQ(parse_limits("10 per 2 minutes BURST 3;5/hour")[0].capacity(), 3);
  EXPECT_EQ(parse_limits("5/hour")[0].capacity(), 5);
  EXPECT_TRUE(contains(rctest::error_of<InvalidArgument>([] { parse_limits("10/second burst 0"); }), "burst must be"));
  rctest::error_of<InvalidArgument>([] { parse_limits("10/second burst"); });
  rctest::error_of<InvalidArgument>([] { parse_limits("10/second burst -1"); });
  rctest::error_of<InvalidArgument>([] { parse_limits("10/second burst 99999999999999999999"); });
}

// A store that refuses TIME inside scripts, as an old server or a locked-down proxy would,
// but answers the TIME command: the time source must fall back to the measured offset.
class NoScriptTimeStore final : public Store {
 public:
  explicit NoScriptTimeStore(std::shared_ptr<MemoryStore> inner) : inner_(std::move(inner)) {}
  std::vector<Reply> execute(const std::vector<Request>& batch) override {
    std::vector<Reply> out;
    for (const Request& r : batch) {
      if (const auto* call = std::get_if<ScriptCall>(&r)) {
        const bool reads_time = call->script == &kTimeProbeScript || (!call->args.empty() && call->args[0].empty());
        if (reads_time) {
          ++refusals;
          out.push_back(Reply::of_error("ERR Write commands not allowed after non deterministic commands"));
          continue;
        }
      }
      out.push_back(inner_->execute_one(r));
    }
    return out;
  }
  std::int64_t now_ms() const override { return inner_->now_ms() - 30'000; }  // a client 30 s behind
  std::string describe() const override { return "refusing"; }
  bool is_memory() const noexcept override { return false; }
  void close() override { inner_->close(); }
  int refusals = 0;

 private:
  std::shared_ptr<MemoryStore> inner_;
};

TEST(TimeSource, FallsBackToTheOffsetWhereScriptsMayNotReadTime) {
  auto clock = std::make_shared<ManualClock>(kT0);
  auto inner = rctest::memory_store(clock);
  auto store = std::make_shared<NoScriptTimeStore>(inner);
  LimiterOptions o;
  o.prefix = "rl";
  o.clock = ClockMode::Server;
  auto lim = make_limiter(store, "sliding-window", o);
  EXPECT_EQ(lim->clock(), ClockMode::Server);
  const auto limits = parse_limits("2/minute");
  EXPECT_TRUE(lim->hit(limits, "k", 1).allowed);
  EXPECT_EQ(lim->clock(), ClockMode::ServerOffset);
  EXPECT_EQ(store->refusals, 2);  // the hit, then the probe; never again after the switch
  EXPECT_TRUE(lim->hit(limits, "k", 1).allowed);
  EXPECT_FALSE(lim->hit(limits, "k", 1).allowed);
  EXPECT_EQ(store->refusals, 2);
  // The entries carry the server's time (the inner store's clock), not the skewed client's.
  Reply r = rctest::run(*inner, {"ZRANGE", "rl:sw:2:{k}:60000", "0", "-1", "WITHSCORES"});
  ASSERT_EQ(r.elements.size(), 4u);
  EXPECT_EQ(r.elements[1].str, std::to_string(kT0));
}

TEST(TimeSource, OtherScriptErrorsDoNotSwitchModes) {
  auto clock = std::make_shared<ManualClock>(kT0);
  auto store = rctest::memory_store(clock);
  LimiterOptions o;
  o.prefix = "rl";
  o.clock = ClockMode::Server;
  auto lim = make_limiter(store, "sliding-window", o);
  rctest::run(*store, {"SET", "rl:sw:2:{k}:60000", "x"});
  rctest::error_of<ReplyError>([&] { lim->hit(parse_limits("2/minute"), "k", 1); });
  EXPECT_EQ(lim->clock(), ClockMode::Server);
  rctest::error_of<InvalidArgument>([] { parse_clock_mode("sever"); });
}

// ----------------------------------------------------------- Lua twins on a real Redis

class LuaTwinTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* url = std::getenv("REDCOUNT_TEST_REDIS_URL");
    if (url == nullptr || *url == '\0') GTEST_SKIP() << "REDCOUNT_TEST_REDIS_URL is not set";
    redis_ = std::make_shared<RedisStore>(parse_url(url));
    rctest::run(*redis_, {"FLUSHDB"});
  }
  void TearDown() override {
    if (redis_) {
      rctest::run(*redis_, {"FLUSHDB"});
      redis_->close();
    }
  }
  std::shared_ptr<RedisStore> redis_;
  std::shared_ptr<MemoryStore> memory_ = rctest::memory_store(std::make_shared<ManualClock>(kT0));
};

void expect_same(const Reply& a, const Reply& b, const std::string& what) {
  ASSERT_EQ(a.type, b.type) << what << ": redis '" << a.str << "' memory '" << b.str << "'";
  if (a.type == Reply::Type::Error) {
    // Redis appends the script's location to errors raised inside it.
    EXPECT_EQ(a.str.substr(0, a.str.find(' ')), b.str.substr(0, b.str.find(' '))) << what;
    return;
  }
  EXPECT_EQ(a.integer, b.integer) << what;
  EXPECT_EQ(a.str, b.str) << what;
  ASSERT_EQ(a.elements.size(), b.elements.size()) << what;
  for (std::size_t i = 0; i < a.elements.size(); ++i) expect_same(a.elements[i], b.elements[i], what);
}

// The same script calls, with explicit times, give the same replies from the Lua text on
// Redis and from its native twin on the memory store.
TEST_F(LuaTwinTest, EveryScriptMatchesItsTwin) {
  std::mt19937 rng(3);
  std::int64_t now = kT0;
  auto both = [&](const Script* s, std::vector<std::string> keys, std::vector<std::string> args, const std::string& what) {
    expect_same(redis_->execute_one(ScriptCall{s, keys, args}), memory_->execute_one(ScriptCall{s, keys, args}), what);
  };
  for (int i = 0; i < 400; ++i) {
    now += static_cast<std::int64_t>(rng() % 3000);
    const std::string t = std::to_string(now);
    const std::string cost = std::to_string(1 + rng() % 3);
    const std::string mode = rng() % 4 == 0 ? "test" : "hit";
    const std::string id = "id" + std::to_string(i);
    both(&kSlidingLogScript, {"sw:{a}:1", "sw:{a}:2"}, {t, mode, cost, id, "5", "10000", "9", "60000"}, "log " + std::to_string(i));
    both(&kSlidingApproxScript, {"swa:{a}:1", "swa:{a}:2"}, {t, mode, cost, "6", "2500", "4", "9", "60000", "1"},
         "approx " + std::to_string(i));
    both(&kTokenBucketScript, {"tb:{a}"}, {t, mode, cost, "5", "10000", "8"}, "tb " + std::to_string(i));
    both(&kGcraScript, {"gcra:{a}"}, {std::to_string(now * 1000), mode, cost, "2000000", "8"}, "gcra " + std::to_string(i));
    const char* ops[] = {"acquire", "test", "release"};
    both(&kConcurrencyScript, {"cc:{a}"}, {t, ops[rng() % 3], "3", "7000", "l" + std::to_string(rng() % 5), cost},
         "cc " + std::to_string(i));
    const char* sops[] = {"add", "count", "unique", "count-unique"};
    const std::string op = sops[rng() % 4];
    both(&kSlidingCounterScript, {op == "unique" || op == "count-unique" ? "u:{a}" : "e:{a}", "e:{a}:w"},
         {t, op, "20000", op == "add" ? std::to_string(1 + rng() % 4) : "item" + std::to_string(rng() % 6), id},
         "counter " + std::to_string(i));
  }
  // Wrong types: both answer WRONGTYPE.
  rctest::run(*redis_, {"SET", "str", "x"});
  rctest::run(*memory_, {"SET", "str", "x"});
  both(&kSlidingLogScript, {"str"}, {"1", "hit", "1", "id", "5", "1000"}, "wrongtype log");
  both(&kTokenBucketScript, {"str"}, {"1", "hit", "1", "5", "1000", "5"}, "wrongtype tb");
  both(&kGcraScript, {"str"}, {"1", "hit", "1", "1000", "5"}, "wrongtype gcra");
}

}  // namespace
