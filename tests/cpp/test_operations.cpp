// Operations driven by hand: prepare() and finish() with hand-made replies, so every
// follow-up step (the commands-mode TTL repair, the server-clock probe and the switch to
// server-offset, the TIME sync) is checked without a server that misbehaves on cue; and
// the drivers (run_async completes inline on the memory store).
#include <gtest/gtest.h>

#include <atomic>
#include <exception>
#include <memory>
#include <string>
#include <variant>
#include <vector>

#include "redcount/common/clock.h"
#include "redcount/common/errors.h"
#include "redcount/counters/fixed_window.h"
#include "redcount/limiters/limiter.h"
#include "redcount/common/limit_string.h"
#include "redcount/memory/memory_store.h"
#include "redcount/store/operation.h"
#include "redcount/counters/sliding_window.h"
#include "redcount/store/time_source.h"
#include "test_support.h"

namespace {

using namespace redcount;

constexpr std::int64_t kT0 = 1'700'006'400'000;

// A memory store that pretends to be remote: its clock is not the server's (so
// server-offset measures an offset) and it reads only text ARGV.
class RemoteLikeStore final : public Store {
 public:
  explicit RemoteLikeStore(std::shared_ptr<MemoryStore> inner) : inner_(std::move(inner)) {}
  std::vector<Reply> execute(const std::vector<Request>& batch) override { return inner_->execute(batch); }
  std::int64_t now_ms() const override { return inner_->now_ms(); }
  std::string describe() const override { return "remote-like"; }
  bool is_memory() const noexcept override { return false; }
  void close() override { inner_->close(); }

 private:
  std::shared_ptr<MemoryStore> inner_;
};

const Command& command(const Request& r) { return std::get<Command>(r); }
const ScriptCall& script_call(const Request& r) { return std::get<ScriptCall>(r); }
std::string time_arg(const Request& r) {
  std::vector<std::string> scratch;
  return script_call(r).argv(scratch).at(0);
}
Reply ints(std::vector<std::int64_t> v) {
  std::vector<Reply> out;
  for (auto x : v) out.push_back(Reply::of_integer(x));
  return Reply::of_array(std::move(out));
}
std::vector<Reply> one(Reply r) {
  std::vector<Reply> out;
  out.push_back(std::move(r));
  return out;
}

// TIME's reply for a time in ms.
Reply time_reply(std::int64_t ms) {
  return Reply::of_array({Reply::of_string(std::to_string(ms / 1000)), Reply::of_string(std::to_string(ms % 1000 * 1000))});
}

FixedWindowOptions counter_options(FixedWindowOptions::Mode mode, FixedWindowOptions::OnError on_error) {
  FixedWindowOptions o;
  o.name = "views";
  o.window_ms = 60'000;
  o.mode = mode;
  o.on_error = on_error;
  return o;
}

TEST(CounterOps, CommandsModeIncrWithABareKeyAsksForAPexpireatFollowUp) {
  auto store = rctest::memory_store(std::make_shared<ManualClock>(kT0));
  FixedWindowCounter c(store, counter_options(FixedWindowOptions::Mode::Commands, FixedWindowOptions::OnError::Raise));
  auto op = c.make_incr("k", 2);
  const std::string key = c.storage_key("k");
  const std::int64_t deadline = c.window("k").expire_at_ms;

  auto batch = op->prepare();
  ASSERT_EQ(batch.size(), 4u);
  EXPECT_EQ(command(batch[0]).args, (std::vector<std::string>{"TIME"}));
  EXPECT_EQ(command(batch[1]).args, (std::vector<std::string>{"SET", key, "0", "NX", "PXAT", std::to_string(deadline)}));
  EXPECT_EQ(command(batch[2]).args, (std::vector<std::string>{"INCRBY", key, "2"}));
  EXPECT_EQ(command(batch[3]).args, (std::vector<std::string>{"PTTL", key}));

  // The key existed without a TTL: SET NX did nothing, PTTL reads -1.
  std::vector<Reply> replies{time_reply(kT0), Reply::nil(), Reply::of_integer(7), Reply::of_integer(-1)};
  auto next = op->finish(std::move(replies));
  ASSERT_EQ(next.size(), 1u);
  EXPECT_EQ(command(next[0]).args, (std::vector<std::string>{"PEXPIREAT", key, std::to_string(deadline)}));
  EXPECT_FALSE(op->done());
  EXPECT_TRUE(op->finish(one(Reply::of_integer(1))).empty());
  EXPECT_EQ(op->take(), 7);

  // A key with its TTL needs no follow-up.
  auto op2 = c.make_incr("k", 1);
  op2->prepare();
  std::vector<Reply> fine{time_reply(kT0), Reply::nil(), Reply::of_integer(8), Reply::of_integer(30'000)};
  EXPECT_TRUE(op2->finish(std::move(fine)).empty());
  EXPECT_EQ(op2->take(), 8);

  // A key whose TTL runs past the deadline (a foreign PEXPIRE) is held to
  // it like a key without one, on the server's clock (TIME answers first in the batch)...
  auto op3 = c.make_incr("k", 1);
  op3->prepare();
  std::vector<Reply> far{time_reply(kT0), Reply::nil(), Reply::of_integer(9), Reply::of_integer(1'000'000'000'000)};
  auto repair = op3->finish(std::move(far));
  ASSERT_EQ(repair.size(), 1u);
  EXPECT_EQ(command(repair[0]).args, (std::vector<std::string>{"PEXPIREAT", key, std::to_string(deadline)}));
  // ...and a TTL ending exactly at the deadline is ours: no follow-up.
  auto op4 = c.make_incr("k", 1);
  op4->prepare();
  std::vector<Reply> exact{time_reply(kT0), Reply::nil(), Reply::of_integer(10), Reply::of_integer(deadline - kT0)};
  EXPECT_TRUE(op4->finish(std::move(exact)).empty());
  // A server that refuses TIME (a proxy): only a missing TTL can be seen.
  auto op5 = c.make_incr("k", 1);
  op5->prepare();
  std::vector<Reply> no_time{Reply::of_error("ERR unknown command 'TIME'"), Reply::nil(), Reply::of_integer(11),
                             Reply::of_integer(1'000'000'000'000)};
  EXPECT_TRUE(op5->finish(std::move(no_time)).empty());
  EXPECT_EQ(op5->take(), 11);
}

TEST(CounterOps, AFailedRepairIsQueuedAsARepairNeverAsAnIncrement) {
  auto store = rctest::memory_store(std::make_shared<ManualClock>(kT0));
  auto o = counter_options(FixedWindowOptions::Mode::Commands, FixedWindowOptions::OnError::Queue);
  o.retry_backoff_min = std::chrono::milliseconds(60'000);  // keep it queued while we look
  o.retry_backoff_max = o.retry_backoff_min;
  FixedWindowCounter c(store, o);
  auto op = c.make_incr("k", 1);
  op->prepare();
  std::vector<Reply> replies{time_reply(kT0), Reply::nil(), Reply::of_integer(1), Reply::of_integer(-1)};
  ASSERT_EQ(op->finish(std::move(replies)).size(), 1u);
  EXPECT_TRUE(op->fail(std::make_exception_ptr(ConnectionError("connection lost"))).empty());
  EXPECT_EQ(op->take(), 1);  // the increment landed; only its deadline is pending
  RetryStats s = c.stats();
  EXPECT_EQ(s.queued, 0u);  // no increment was queued...
  EXPECT_EQ(s.pending, 1u);  // ...only the TTL repair
}

TEST(CounterOps, TransportFailuresQueueWithOnErrorQueueAndRaiseOtherwise) {
  auto store = rctest::memory_store(std::make_shared<ManualClock>(kT0));
  FixedWindowCounter queueing(store, counter_options(FixedWindowOptions::Mode::Script, FixedWindowOptions::OnError::Queue));
  auto op = queueing.make_incr("k", 3);
  ASSERT_EQ(op->prepare().size(), 1u);
  EXPECT_TRUE(op->fail(std::make_exception_ptr(TimeoutError("no reply"))).empty());
  EXPECT_EQ(op->take(), 0);  // queued: its count is not known yet
  EXPECT_EQ(queueing.stats().queued, 1u);
  EXPECT_EQ(queueing.flush(std::chrono::milliseconds(5000)), 0u);
  EXPECT_EQ(queueing.get("k"), 3);

  FixedWindowCounter raising(store, counter_options(FixedWindowOptions::Mode::Script, FixedWindowOptions::OnError::Raise));
  auto op2 = raising.make_incr("k", 1);
  op2->prepare();
  EXPECT_THROW(op2->fail(std::make_exception_ptr(TimeoutError("no reply"))), TimeoutError);
}

TEST(CounterOps, FactoriesValidateBeforeAnythingIsSent) {
  auto store = rctest::memory_store(std::make_shared<ManualClock>(kT0));
  FixedWindowCounter c(store, counter_options(FixedWindowOptions::Mode::Script, FixedWindowOptions::OnError::Raise));
  EXPECT_THROW(c.make_incr("k", 0), InvalidArgument);
  EXPECT_THROW(c.make_incr("", 1), InvalidArgument);
  EXPECT_THROW(c.make_incr_many({{"a", 1}, {"b", -1}}), InvalidArgument);
  EXPECT_THROW(c.make_get_many({"a", ""}), InvalidArgument);
  EXPECT_EQ(store->stored_keys(), 0u);
}

TEST(CounterOps, OperationsOutliveTheCounter) {
  auto store = rctest::memory_store(std::make_shared<ManualClock>(kT0));
  std::shared_ptr<Op<std::int64_t>> op;
  std::string key;
  {
    FixedWindowCounter c(store, counter_options(FixedWindowOptions::Mode::Script, FixedWindowOptions::OnError::Raise));
    op = c.make_incr("k", 4);
    key = c.storage_key("k");
  }
  // The counter is closed and gone; an operation made before still runs (nothing it
  // needs was on the counter's stack), and reports the counter as closed.
  EXPECT_THROW(run(*store, *op), Error);
}

// ------------------------------------------------------------------ server clock

std::unique_ptr<LimiterStrategy> server_clock_limiter(std::shared_ptr<Store> store) {
  LimiterOptions o;
  o.prefix = "rl";
  o.clock = ClockMode::Server;
  return make_limiter(std::move(store), "sliding-window", o);
}

TEST(ClockOps, ARefusedProbeSwitchesToServerOffsetAndReruns) {
  auto inner = rctest::memory_store(std::make_shared<ManualClock>(kT0));
  auto store = std::make_shared<RemoteLikeStore>(inner);
  auto lim = server_clock_limiter(store);
  auto op = lim->make_hit(parse_limits("5/minute"), "k", 1);

  auto batch = op->prepare();
  ASSERT_EQ(batch.size(), 1u);
  EXPECT_EQ(script_call(batch[0]).script, &kSlidingLogScript);
  EXPECT_EQ(time_arg(batch[0]), "");  // Server mode: the script reads TIME

  auto probe = op->finish(one(Reply::of_error("ERR This Redis command is not allowed from script")));
  ASSERT_EQ(probe.size(), 1u);
  EXPECT_EQ(script_call(probe[0]).script, &kTimeProbeScript);
  EXPECT_EQ(lim->clock(), ClockMode::Server);  // not yet: the probe decides

  // The probe is refused: switch for good, measure the offset, rerun with an explicit time.
  auto sync = op->finish(one(Reply::of_error("NOPERM this user has no permissions to run the 'time' command")));
  EXPECT_EQ(lim->clock(), ClockMode::ServerOffset);
  ASSERT_EQ(sync.size(), 1u);
  EXPECT_EQ(command(sync[0]).args, std::vector<std::string>{"TIME"});
  // The server is 5 s ahead of this client.
  const std::int64_t server_ms = kT0 + 5000;
  auto rerun = op->finish(one(Reply::of_array({Reply::of_string(std::to_string(server_ms / 1000)),
                                               Reply::of_string(std::to_string((server_ms % 1000) * 1000))})));
  ASSERT_EQ(rerun.size(), 1u);
  EXPECT_EQ(script_call(rerun[0]).script, &kSlidingLogScript);
  EXPECT_EQ(time_arg(rerun[0]), std::to_string(server_ms));
  EXPECT_TRUE(op->finish(one(ints({server_ms, 1, 1, server_ms, 0}))).empty());
  Decision d = op->take();
  EXPECT_TRUE(d.allowed);
  EXPECT_EQ(d.remaining, 4);

  // Later operations use the offset without asking again (it is fresh).
  auto later = lim->make_hit(parse_limits("5/minute"), "k", 1)->prepare();
  ASSERT_EQ(later.size(), 1u);
  EXPECT_EQ(time_arg(later[0]), std::to_string(server_ms));
}

// A transient error is not a refusal of TIME.
TEST(ClockOps, BusyRepliesNeverSwitchTheClock) {
  auto inner = rctest::memory_store(std::make_shared<ManualClock>(kT0));
  auto store = std::make_shared<RemoteLikeStore>(inner);
  auto lim = server_clock_limiter(store);
  const auto limits = parse_limits("5/minute");

  // The script itself is refused with BUSY: no probe, the caller sees BUSY.
  auto op = lim->make_hit(limits, "k", 1);
  op->prepare();
  EXPECT_THROW(op->finish(one(Reply::of_error("BUSY Redis is busy running a script."))), ReplyError);
  EXPECT_EQ(lim->clock(), ClockMode::Server);

  // The script fails otherwise and the probe meets BUSY: still no switch, and the caller
  // sees the script's own error.
  auto op2 = lim->make_hit(limits, "k", 1);
  op2->prepare();
  auto probe = op2->finish(one(Reply::of_error("ERR something odd inside the script")));
  ASSERT_EQ(probe.size(), 1u);
  try {
    op2->finish(one(Reply::of_error("BUSY Redis is busy running a script.")));
    FAIL() << "expected the script's error";
  } catch (const ReplyError& e) {
    EXPECT_NE(std::string(e.what()).find("something odd"), std::string::npos) << e.what();
  }
  EXPECT_EQ(lim->clock(), ClockMode::Server);

  // And a probe that succeeds keeps the mode too.
  auto op3 = lim->make_hit(limits, "k", 1);
  op3->prepare();
  op3->finish(one(Reply::of_error("WRONGTYPE Operation against a key holding the wrong kind of value")));
  EXPECT_THROW(op3->finish(one(ints({kT0 / 1000, 0}))), ReplyError);
  EXPECT_EQ(lim->clock(), ClockMode::Server);
}

TEST(ClockOps, ServerOffsetSyncsTimeFirstWhenTheOffsetIsStale) {
  auto inner = rctest::memory_store(std::make_shared<ManualClock>(kT0));
  auto store = std::make_shared<RemoteLikeStore>(inner);
  LimiterOptions o;
  o.prefix = "rl";
  o.clock = ClockMode::ServerOffset;
  auto lim = make_limiter(store, "fixed-window", o);
  auto op = lim->make_hit(parse_limits("5/minute"), "k", 1);
  auto first = op->prepare();
  ASSERT_EQ(first.size(), 1u);
  EXPECT_EQ(command(first[0]).args, std::vector<std::string>{"TIME"});
  auto call = op->finish(one(Reply::of_array({Reply::of_string(std::to_string(kT0 / 1000)), Reply::of_string("0")})));
  ASSERT_EQ(call.size(), 1u);
  EXPECT_EQ(script_call(call[0]).script, &kFixedWindowHitScript);
  // On the memory store itself the store's clock is the server's: no TIME at all.
  auto local = make_limiter(inner, "fixed-window", o);
  auto direct = local->make_hit(parse_limits("5/minute"), "k", 1)->prepare();
  ASSERT_EQ(direct.size(), 1u);
  EXPECT_EQ(script_call(direct[0]).script, &kFixedWindowHitScript);
}

// ------------------------------------------------------------------ drivers

TEST(Drivers, RunAsyncOnTheMemoryStoreCompletesInline) {
  auto store = rctest::memory_store(std::make_shared<ManualClock>(kT0));
  auto lim = make_limiter(store, "sliding-window", "rl");
  auto op = lim->make_hit(parse_limits("2/minute"), "k", 1);
  bool called = false;
  std::exception_ptr error;
  run_async(store, op, [&](std::exception_ptr e) {
    called = true;
    error = e;
  });
  ASSERT_TRUE(called);  // before run_async returned: no thread hop
  EXPECT_FALSE(error);
  EXPECT_TRUE(op->result().allowed);

  FixedWindowCounter c(store, counter_options(FixedWindowOptions::Mode::Script, FixedWindowOptions::OnError::Raise));
  auto incr = c.make_incr("k", 5);
  called = false;
  run_async(store, incr, [&](std::exception_ptr e) {
    called = true;
    error = e;
  });
  ASSERT_TRUE(called);
  EXPECT_FALSE(error);
  EXPECT_EQ(incr->result(), 5);

  // An error reaches done(), not the caller of run_async.
  rctest::run(*store, {"SET", c.storage_key("w"), "x"});
  auto bad = c.make_incr("w", 1);
  called = false;
  run_async(store, bad, [&](std::exception_ptr e) {
    called = true;
    error = e;
  });
  ASSERT_TRUE(called);
  EXPECT_TRUE(error);
}

TEST(Drivers, LimiterOperationsOutliveTheirLimiterAndTheCallersFrame) {
  auto store = rctest::memory_store(std::make_shared<ManualClock>(kT0));
  std::vector<std::shared_ptr<Op<Decision>>> ops;
  {
    for (const char* name : {"fixed-window", "sliding-window", "sliding-window-approx", "token-bucket", "gcra",
                             "concurrency"}) {
      auto lim = make_limiter(store, name, "rl");
      std::string key = std::string("key-") + name;
      std::vector<RateLimit> limits = parse_limits("3/minute");
      ops.push_back(lim->make_hit(limits, key, 1));
    }  // the limiters, keys and limits are gone
  }
  for (auto& op : ops) EXPECT_TRUE(run(*store, *op).allowed);
}

TEST(Drivers, TypedArgumentsAreRenderedForStoresThatReadText) {
  // The same sliding-window hits through a text-only store and through the memory store's
  // typed twin give the same decisions.
  auto clock = std::make_shared<ManualClock>(kT0);
  auto a = rctest::memory_store(clock);
  auto b = std::make_shared<RemoteLikeStore>(rctest::memory_store(clock));
  for (const char* name : {"sliding-window", "sliding-window-approx"}) {
    auto la = make_limiter(a, name, "rl");
    auto lb = make_limiter(b, name, "rl");
    const auto limits = parse_limits("3/second;5/minute");
    for (int i = 0; i < 12; ++i) {
      Decision da = la->hit(limits, "k", 1), db = lb->hit(limits, "k", 1);
      EXPECT_EQ(da.allowed, db.allowed) << name << " " << i;
      EXPECT_EQ(da.remaining, db.remaining) << name << " " << i;
      EXPECT_EQ(da.retry_after_ms, db.retry_after_ms) << name << " " << i;
      clock->advance(150);
    }
  }
}

TEST(Drivers, SlidingCounterOperations) {
  auto store = rctest::memory_store(std::make_shared<ManualClock>(kT0));
  SlidingWindowCounter c(store, "logins", 60'000);
  EXPECT_THROW(c.make_add("k", 0), InvalidArgument);
  EXPECT_EQ(run(*store, *c.make_add("k", 3)), 3);
  EXPECT_EQ(run(*store, *c.make_count("k")), 3);
  EXPECT_EQ(run(*store, *c.make_add_unique("k", "ip1")), 1);
  EXPECT_EQ(run(*store, *c.make_count_unique("k")), 1);
  run(*store, *c.make_clear("k"));
  EXPECT_EQ(c.count("k"), 0);
}

}  // namespace
