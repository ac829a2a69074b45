// ResilientStore: the breaker's states, the fallback's routing and the errors it raises,
// over a store that can be switched down (the real-Redis outage tests, SIGKILL and SIGSTOP,
// are in tests/python/test_resilient.py).
#include <atomic>
#include <chrono>
#include <thread>
#include <future>

#include "redcount/store/resilient_store.h"
#include "test_support.h"

namespace rctest {
namespace {

using redcount::ResilienceOptions;
using redcount::ResilientStore;
using redcount::Unavailable;
using namespace std::chrono_literals;

// A memory store whose transport can be "down": refused (nothing sent), timed out (maybe
// applied) or answering with a thrown ReplyError. Counts the batches that reached it.
class SwitchableStore final : public Store {
 public:
  enum class Mode { Up, Refused, Timeout, LateTimeout, ReplyErr, BadInput };
  explicit SwitchableStore(std::shared_ptr<Store> inner) : inner_(std::move(inner)) {}
  std::vector<Reply> execute(const std::vector<redcount::Request>& batch) override {
    ++calls;
    switch (mode.load()) {
      case Mode::Refused: throw redcount::ConnectionError("connection refused", false);
      case Mode::Timeout: throw redcount::TimeoutError("timed out", true);
      case Mode::LateTimeout:
        // What a caller that was not running at its deadline sees: the timeout, long after.
        std::this_thread::sleep_for(late);
        throw redcount::TimeoutError("timed out", true);
      case Mode::ReplyErr: throw redcount::ReplyError("WRONGTYPE Operation against a key holding the wrong kind");
      case Mode::BadInput: throw redcount::InvalidArgument("refused select: it would switch the database");
      case Mode::Up: break;
    }
    return inner_->execute(batch);
  }
  std::int64_t now_ms() const override { return inner_->now_ms(); }
  bool has_expire_options() const noexcept override { return true; }
  std::string describe() const override { return "redis://test:1/0"; }
  bool is_memory() const noexcept override { return false; }
  void close() override { inner_->close(); }

  std::atomic<Mode> mode{Mode::Up};
  std::atomic<int> calls{0};
  std::chrono::milliseconds late{0};

 private:
  std::shared_ptr<Store> inner_;
};

struct Fixture {
  std::shared_ptr<redcount::ManualClock> clock = std::make_shared<redcount::ManualClock>(kT0);
  std::shared_ptr<SwitchableStore> primary = std::make_shared<SwitchableStore>(memory_store(clock));
  std::shared_ptr<Store> fallback;
  std::shared_ptr<ResilientStore> store;

  explicit Fixture(bool with_fallback, std::chrono::milliseconds budget = 50ms) {
    redcount::take_breaker_events();  // events of earlier tests
    if (with_fallback) fallback = memory_store(clock);
    ResilienceOptions o;
    o.budget = budget;
    o.probe_min = 1ms;
    o.probe_max = 2ms;
    store = std::make_shared<ResilientStore>(primary, fallback, o);
  }
  Reply incr() { return run(*store, {"INCR", "k"}); }
};

TEST(ResilientStore, OpensAfterConsecutiveFailuresThenFailsFastWithoutTouchingThePrimary) {
  Fixture f(false);
  EXPECT_EQ(f.incr().integer, 1);
  f.primary->mode = SwitchableStore::Mode::Refused;
  for (int i = 0; i < 3; ++i) {
    try {
      f.incr();
      FAIL() << "no error";
    } catch (const Unavailable& e) {
      EXPECT_FALSE(e.maybe_applied());
      EXPECT_TRUE(contains(e.what(), "connection refused")) << e.what();
      EXPECT_TRUE(contains(e.what(), "budget 50 ms")) << e.what();
    }
  }
  EXPECT_EQ(f.store->state(), ResilientStore::State::Open);
  const int reached = f.primary->calls;
  try {
    f.incr();
    FAIL() << "no error";
  } catch (const Unavailable& e) {
    EXPECT_TRUE(contains(e.what(), "circuit breaker is open")) << e.what();
    EXPECT_FALSE(e.maybe_applied());
  }
  EXPECT_LE(f.primary->calls, reached + 1);  // at most a probe (PING), never the call itself
  EXPECT_EQ(f.store->switches(), 1u);
}

TEST(ResilientStore, TimeoutsSeenMoreThanTwiceTheBudgetLateNeverOpenIt) {
  // The caller's process was not running at the deadline (a starved host, a stopped
  // worker): that says nothing about Redis. Timeouts seen on time still open it.
  Fixture f(false, 200ms);
  f.primary->late = 500ms;  // > 2 x 200 ms + 10 ms
  f.primary->mode = SwitchableStore::Mode::LateTimeout;
  for (int i = 0; i < 3; ++i) {
    try {
      f.incr();
      FAIL() << "no error";
    } catch (const Unavailable& e) {
      EXPECT_TRUE(e.maybe_applied());
    }
  }
  EXPECT_EQ(f.store->state(), ResilientStore::State::Closed);
  f.primary->mode = SwitchableStore::Mode::Timeout;
  for (int i = 0; i < 3; ++i) EXPECT_THROW(f.incr(), Unavailable);
  EXPECT_EQ(f.store->state(), ResilientStore::State::Open);
}

TEST(ResilientStore, ProbeClosesTheBreakerWhenThePrimaryAnswers) {
  Fixture f(false);
  f.primary->mode = SwitchableStore::Mode::Refused;
  for (int i = 0; i < 3; ++i) EXPECT_THROW(f.incr(), Unavailable);
  ASSERT_EQ(f.store->state(), ResilientStore::State::Open);
  // Failed probes keep it open.
  for (int i = 0; i < 20; ++i) {
    EXPECT_THROW(f.incr(), Unavailable);
    std::this_thread::sleep_for(1ms);  // lets the next probe fall due
  }
  EXPECT_NE(f.store->state(), ResilientStore::State::Closed);
  f.primary->mode = SwitchableStore::Mode::Up;
  bool served = false;
  for (int i = 0; i < 1000 && !served; ++i) {
    try {
      f.incr();
      served = true;
    } catch (const Unavailable&) {
      std::this_thread::sleep_for(1ms);
    }
  }
  ASSERT_TRUE(served);
  EXPECT_EQ(f.store->state(), ResilientStore::State::Closed);
  EXPECT_EQ(f.store->switches(), 2u);
  int warnings = 0, opened = 0, closed = 0;
  for (const auto& e : redcount::take_breaker_events()) {
    if (e.level != redcount::BreakerEvent::Level::Warning) continue;
    ++warnings;
    opened += contains(e.message, "circuit breaker open") ? 1 : 0;
    closed += contains(e.message, "reachable again") ? 1 : 0;
  }
  EXPECT_EQ(warnings, 2);
  EXPECT_EQ(opened, 1);
  EXPECT_EQ(closed, 1);
}

TEST(ResilientStore, ErrorRepliesAndBadInputNeverCount) {
  Fixture f(false);
  f.primary->mode = SwitchableStore::Mode::ReplyErr;
  for (int i = 0; i < 10; ++i) EXPECT_THROW(f.incr(), redcount::ReplyError);
  f.primary->mode = SwitchableStore::Mode::BadInput;
  for (int i = 0; i < 10; ++i) EXPECT_THROW(f.incr(), redcount::InvalidArgument);
  f.primary->mode = SwitchableStore::Mode::Up;
  run(*f.store, {"SET", "t", "text"});
  for (int i = 0; i < 10; ++i) EXPECT_TRUE(run(*f.store, {"INCR", "t"}).is_error());
  EXPECT_EQ(f.store->state(), ResilientStore::State::Closed);
  EXPECT_EQ(f.store->switches(), 0u);
}

TEST(ResilientStore, FallbackServesUnsentCallsAndEverythingWhileOpen) {
  Fixture f(true);
  EXPECT_EQ(f.incr().integer, 1);  // on the primary
  f.primary->mode = SwitchableStore::Mode::Refused;
  for (int i = 1; i <= 5; ++i) EXPECT_EQ(f.incr().integer, i);  // all on the fallback, from 0
  EXPECT_TRUE(f.store->using_fallback());
  EXPECT_FALSE(f.store->has_expire_options());  // the fallback has no MULTI
  std::vector<redcount::Request> tx{Command{{"MULTI"}}, Command{{"INCR", "k"}}, Command{{"EXEC"}}};
  EXPECT_THROW(f.store->execute(tx), Unavailable);
  f.primary->mode = SwitchableStore::Mode::Up;
  bool back = false;
  for (int i = 0; i < 1000 && !back; ++i) {
    f.incr();
    back = f.store->state() == ResilientStore::State::Closed;
    if (!back) std::this_thread::sleep_for(1ms);
  }
  ASSERT_TRUE(back);
  EXPECT_FALSE(f.store->using_fallback());
  EXPECT_TRUE(f.store->has_expire_options());
  EXPECT_EQ(f.incr().integer, 2);  // the primary's count: nothing merged back
}

TEST(ResilientStore, MaybeAppliedFailuresAreNotRerunOnTheFallback) {
  Fixture f(true);
  f.primary->mode = SwitchableStore::Mode::Timeout;
  try {
    f.incr();
    FAIL() << "no error";
  } catch (const Unavailable& e) {
    EXPECT_TRUE(e.maybe_applied());
  }
  EXPECT_EQ(run(*f.fallback, {"GET", "k"}).type, Reply::Type::Nil);
}

TEST(ResilientStore, SubmitTakesTheSameRoutes) {
  Fixture f(true);
  f.primary->mode = SwitchableStore::Mode::Refused;
  for (int i = 1; i <= 4; ++i) {
    std::vector<redcount::Request> batch{Command{{"INCR", "k"}}};
    std::int64_t got = 0;
    std::exception_ptr error;
    f.store->submit(std::move(batch), [&](std::vector<Reply>&& r, std::exception_ptr e) {
      error = e;
      if (!e) got = r.front().integer;
    });
    EXPECT_FALSE(error);
    EXPECT_EQ(got, i);
  }
  Fixture g(false);
  g.primary->mode = SwitchableStore::Mode::Timeout;
  std::exception_ptr error;
  g.store->submit({Command{{"INCR", "k"}}}, [&](std::vector<Reply>&&, std::exception_ptr e) { error = e; });
  EXPECT_THROW(std::rethrow_exception(error), Unavailable);
}

TEST(ResilientStore, RefusesInconsistentOptions) {
  auto clock = std::make_shared<redcount::ManualClock>(kT0);
  auto primary = std::make_shared<SwitchableStore>(memory_store(clock));
  ResilienceOptions o;
  o.breaker = false;
  EXPECT_THROW(ResilientStore(primary, memory_store(clock), o), redcount::InvalidArgument);
  o.breaker = true;
  o.failure_threshold = 0;
  EXPECT_THROW(ResilientStore(primary, nullptr, o), redcount::InvalidArgument);
  o.failure_threshold = 3;
  EXPECT_THROW(redcount::open_resilient_store(redcount::parse_url("redis://127.0.0.1:1/0"), o, "redis://x:1/0"),
               redcount::InvalidArgument);
  EXPECT_THROW(redcount::open_resilient_store(redcount::parse_url("memory://"), o, "memory://"),
               redcount::InvalidArgument);
  o.budget = 50ms;
  auto mem = redcount::open_resilient_store(redcount::parse_url("memory://"), o, "");
  EXPECT_TRUE(mem->is_memory());
  auto plain = redcount::open_resilient_store(redcount::parse_url("redis://127.0.0.1:1/0"), ResilienceOptions{}, "");
  EXPECT_EQ(dynamic_cast<ResilientStore*>(plain.get()), nullptr);
  plain->close();
}

}  // namespace
}  // namespace rctest

namespace rctest {
namespace {

// A routed store (as a cluster or a ring is): requests whose key starts with "dead" are on
// a node that is down (never sent); the others run. A batch with both fails with outcomes.
class TwoNodeStore final : public Store {
 public:
  explicit TwoNodeStore(std::shared_ptr<Store> inner) : inner_(std::move(inner)) {}
  std::vector<Reply> execute(const std::vector<redcount::Request>& batch) override {
    auto outcomes = std::make_shared<std::vector<redcount::RequestOutcome>>(batch.size());
    bool dead = false;
    for (std::size_t i = 0; i < batch.size(); ++i) {
      const auto& cmd = std::get<Command>(batch[i]);
      if (cmd.args.size() > 1 && cmd.args[1].starts_with("dead")) {
        dead = true;
        (*outcomes)[i].kind = redcount::RequestOutcome::Kind::NotSent;
      } else {
        (*outcomes)[i].kind = redcount::RequestOutcome::Kind::Reply;
        (*outcomes)[i].reply = inner_->execute_one(cmd);
      }
    }
    if (!dead) {
      std::vector<Reply> out;
      for (auto& o : *outcomes) out.push_back(o.reply);
      return out;
    }
    redcount::Unavailable e("ring node 'b' is unavailable: the circuit breaker is open", false);
    e.set_outcomes(std::move(outcomes));
    throw e;
  }
  bool use_node_breakers(const ResilienceOptions&, bool) override { return true; }
  std::vector<redcount::NodeBreakerState> node_breakers() const override {
    return {{"a", redcount::BreakerState::Closed, 0}, {"b", redcount::BreakerState::Open, 1}};
  }
  std::int64_t now_ms() const override { return inner_->now_ms(); }
  std::string describe() const override { return "ring:a=redis://a:1/0,b=redis://b:1/0"; }
  bool is_memory() const noexcept override { return false; }
  void close() override { inner_->close(); }

 private:
  std::shared_ptr<Store> inner_;
};

}  // namespace

TEST(ResilientStore, BreakersPerNodeRerunOnlyTheUnsentRequestsOnTheFallback) {
  auto clock = std::make_shared<redcount::ManualClock>(kT0);
  auto inner = memory_store(clock);
  auto fallback = memory_store(clock);
  auto primary = std::make_shared<TwoNodeStore>(inner);
  ResilienceOptions o;
  o.budget = 50ms;
  ResilientStore store(primary, fallback, o);
  ASSERT_TRUE(store.per_node());
  std::vector<redcount::Request> batch;
  batch.emplace_back(Command{{"INCRBY", "live", "5"}});
  batch.emplace_back(Command{{"INCRBY", "dead", "7"}});
  batch.emplace_back(Command{{"INCRBY", "live", "1"}});
  auto replies = store.execute(batch);
  ASSERT_EQ(replies.size(), 3u);
  EXPECT_EQ(replies[0].integer, 5);
  EXPECT_EQ(replies[1].integer, 7);  // on the fallback
  EXPECT_EQ(replies[2].integer, 6);
  EXPECT_EQ(run(*inner, {"GET", "dead"}).type, Reply::Type::Nil);
  EXPECT_EQ(run(*fallback, {"GET", "live"}).type, Reply::Type::Nil);
  // The state sums the nodes' breakers up; the primary's own breaker never opened.
  EXPECT_EQ(store.state(), ResilientStore::State::Open);
  EXPECT_TRUE(store.using_fallback());
  EXPECT_FALSE(store.has_expire_options());
  EXPECT_EQ(store.switches(), 1u);
  EXPECT_EQ(store.node_breakers().size(), 2u);
  // A healthy batch goes to the primary.
  EXPECT_EQ(run(store, {"INCR", "live"}).integer, 7);

  // The async path takes the same route.
  std::promise<std::vector<Reply>> got;
  store.submit(batch, [&](std::vector<Reply>&& r, std::exception_ptr e) {
    if (e) return got.set_exception(e);
    got.set_value(std::move(r));
  });
  auto async = got.get_future().get();
  EXPECT_EQ(async[1].integer, 14);
}

TEST(ResilientStore, BreakersPerNodeWithoutFallbackKeepTheOutcomes) {
  auto clock = std::make_shared<redcount::ManualClock>(kT0);
  auto inner = memory_store(clock);
  ResilienceOptions o;
  o.budget = 50ms;
  ResilientStore store(std::make_shared<TwoNodeStore>(inner), nullptr, o);
  std::vector<redcount::Request> batch;
  batch.emplace_back(Command{{"INCR", "live"}});
  batch.emplace_back(Command{{"INCR", "dead"}});
  try {
    store.execute(batch);
    FAIL() << "no error";
  } catch (const Unavailable& e) {
    EXPECT_FALSE(e.maybe_applied());
    ASSERT_TRUE(e.outcomes());
    EXPECT_EQ((*e.outcomes())[0].kind, redcount::RequestOutcome::Kind::Reply);
    EXPECT_EQ((*e.outcomes())[0].reply.integer, 1);
    EXPECT_EQ((*e.outcomes())[1].kind, redcount::RequestOutcome::Kind::NotSent);
    EXPECT_TRUE(contains(e.what(), "circuit breaker is open")) << e.what();
  }
  // Many failures of one node never open a breaker for the whole store.
  for (int i = 0; i < 10; ++i) EXPECT_THROW(store.execute(batch), Unavailable);
  EXPECT_EQ(run(store, {"GET", "live"}).str, "11");
}

TEST(Breaker, OpensAfterTheThresholdProbesOnceAndCloses) {
  redcount::take_breaker_events();
  ResilienceOptions o;
  o.failure_threshold = 2;
  o.probe_min = 1ms;
  o.probe_max = 1ms;
  redcount::Breaker b(o, "ring node 'a' (redis://10.0.0.1:6379)", false);
  using Admit = redcount::Breaker::Admit;
  EXPECT_EQ(b.admit(), Admit::Go);
  b.on_failure("refused");
  b.on_success();  // not consecutive any more
  b.on_failure("refused");
  EXPECT_EQ(b.state(), redcount::BreakerState::Closed);
  b.on_failure("refused");
  EXPECT_EQ(b.state(), redcount::BreakerState::Open);
  std::this_thread::sleep_for(3ms);
  EXPECT_EQ(b.admit(), Admit::Probe);  // one probe...
  EXPECT_EQ(b.admit(), Admit::Refuse);  // ...at a time
  b.probe_done(true, "");
  EXPECT_EQ(b.state(), redcount::BreakerState::Closed);
  EXPECT_EQ(b.switches(), 2u);
  EXPECT_TRUE(contains(b.refusal_text(), "ring node 'a'"));
  int warnings = 0;
  for (const auto& e : redcount::take_breaker_events()) {
    warnings += e.level == redcount::BreakerEvent::Level::Warning ? 1 : 0;
  }
  EXPECT_EQ(warnings, 2);
}

}  // namespace rctest
