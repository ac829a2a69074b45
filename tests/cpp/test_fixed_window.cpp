// FixedWindowCounter on a MemoryStore with a ManualClock, in both modes: counts, window
// turnover, TTL compensation and repair, request-id dedup, validation, errors, stagger,
// and the retry queue.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <limits>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "redcount/common/clock.h"
#include "redcount/common/errors.h"
#include "redcount/counters/fixed_window.h"
#include "redcount/memory/memory_store.h"
#include "redcount/common/window.h"
#include "test_support.h"

using namespace redcount;
using rctest::contains;
using rctest::kT0;
using Mode = FixedWindowOptions::Mode;
using OnError = FixedWindowOptions::OnError;
using std::chrono::milliseconds;

namespace {

constexpr std::int64_t kWindow = 60'000;
constexpr std::int64_t kGrace = 1'000;
constexpr std::int64_t kMax = std::numeric_limits<std::int64_t>::max();
constexpr const char* kNotInteger = "ERR value is not an integer or out of range";
constexpr const char* kOverflow = "ERR increment or decrement would overflow";

const char* mode_name(Mode m) { return m == Mode::Script ? "Script" : "Commands"; }

class FixedWindowTest : public ::testing::TestWithParam<Mode> {
 protected:
  std::shared_ptr<ManualClock> clock_ = std::make_shared<ManualClock>(kT0);
  std::shared_ptr<MemoryStore> store_ = rctest::memory_store(clock_);

  FixedWindowOptions options(const std::string& name = "pv") const {
    FixedWindowOptions o;
    o.name = name;
    o.window_ms = kWindow;
    o.grace_ms = kGrace;
    o.mode = GetParam();
    return o;
  }
  std::unique_ptr<FixedWindowCounter> counter(const FixedWindowOptions& o) {
    return std::make_unique<FixedWindowCounter>(store_, o);
  }
  std::unique_ptr<FixedWindowCounter> counter() { return counter(options()); }

  Reply cmd(std::vector<std::string> args) { return rctest::run(*store_, std::move(args)); }
  std::int64_t pttl(const std::string& storage_key) { return cmd({"PTTL", storage_key}).as_integer(); }
  // The deadline every write must leave on the current window's key.
  std::int64_t expected_pttl() const {
    const std::int64_t now = clock_->now_ms();
    const std::int64_t end = (now / kWindow + 1) * kWindow;
    return end + kGrace - now;
  }
};

INSTANTIATE_TEST_SUITE_P(Modes, FixedWindowTest, ::testing::Values(Mode::Script, Mode::Commands),
                         [](const ::testing::TestParamInfo<Mode>& i) { return std::string(mode_name(i.param)); });

TEST_P(FixedWindowTest, IncrReturnsRunningCounts) {
  auto c = counter();
  EXPECT_EQ(c->incr("user:1", 1), 1);
  EXPECT_EQ(c->incr("user:1", 1), 2);
  EXPECT_EQ(c->incr("user:1", 5), 7);
  EXPECT_EQ(c->incr("user:2", 3), 3);
  EXPECT_EQ(c->get("user:1"), 7);
  EXPECT_EQ(c->get("user:2"), 3);
  EXPECT_EQ(c->get("nobody"), 0);
  EXPECT_EQ(c->get_many({"user:2", "nobody", "user:1"}), (std::vector<std::int64_t>{3, 0, 7}));
  EXPECT_EQ(cmd({"DBSIZE"}).integer, 2);
}

TEST_P(FixedWindowTest, StorageKeyLayout) {
  auto c = counter();
  const std::string expected = rctest::cat("redcount:pv:{user:42}:60000:", kT0 / kWindow);
  EXPECT_EQ(c->storage_key("user:42"), expected);
  c->incr("user:42", 1);
  EXPECT_EQ(rctest::keys(*store_), std::vector<std::string>{expected});
  EXPECT_EQ(cmd({"GET", expected}).str, "1");
  FixedWindowOptions o = options("views");
  o.prefix = "app";
  EXPECT_EQ(counter(o)->storage_key("k"), rctest::cat("app:views:{k}:60000:", kT0 / kWindow));
  const WindowPos pos = c->window("user:42");
  EXPECT_EQ(pos.start_ms, kT0);
  EXPECT_EQ(pos.end_ms, kT0 + kWindow);
  EXPECT_EQ(pos.expire_at_ms, kT0 + kWindow + kGrace);
}

TEST_P(FixedWindowTest, WindowTurnoverResetsTheCount) {
  auto c = counter();
  clock_->set(kT0 + kWindow - 1);
  EXPECT_EQ(c->incr("k", 2), 2);
  EXPECT_EQ(c->incr("k", 2), 4);
  const std::string old_key = c->storage_key("k");
  clock_->set(kT0 + kWindow);  // the next window starts exactly here
  EXPECT_EQ(c->get("k"), 0);
  EXPECT_NE(c->storage_key("k"), old_key);
  EXPECT_EQ(c->incr("k", 1), 1);
  EXPECT_EQ(c->get("k"), 1);
  // The old window's key lives on for exactly `grace`, then it is gone.
  clock_->set(kT0 + kWindow + kGrace - 1);
  EXPECT_EQ(cmd({"GET", old_key}).str, "4");
  clock_->set(kT0 + kWindow + kGrace);
  EXPECT_TRUE(cmd({"GET", old_key}).is_nil());
  EXPECT_EQ(c->get("k"), 1);
}

TEST_P(FixedWindowTest, PttlAfterIncrIsWindowEndPlusGrace) {
  auto c = counter();
  clock_->set(kT0 + 12'345);
  c->incr("k", 1);
  EXPECT_EQ(c->pttl("k"), kT0 + kWindow + kGrace - (kT0 + 12'345));
  EXPECT_EQ(pttl(c->storage_key("k")), 48'655);
  // A later increment keeps the same deadline.
  clock_->set(kT0 + 20'000);
  c->incr("k", 1);
  EXPECT_EQ(c->pttl("k"), 41'000);
  // A late first write does not stretch the key past its window.
  clock_->set(kT0 + 59'000);
  c->incr("late", 1);
  EXPECT_EQ(c->pttl("late"), 2'000);
  EXPECT_EQ(c->pttl("never"), -2);
}

TEST_P(FixedWindowTest, PersistThenIncrRestoresTheTtl) {
  auto c = counter();
  clock_->set(kT0 + 1'000);
  c->incr("k", 1);
  const std::string key = c->storage_key("k");
  EXPECT_EQ(cmd({"PERSIST", key}).integer, 1);
  EXPECT_EQ(pttl(key), -1);
  clock_->set(kT0 + 30'000);
  EXPECT_EQ(c->incr("k", 1), 2);
  EXPECT_EQ(pttl(key), expected_pttl());
  EXPECT_EQ(pttl(key), kT0 + kWindow + kGrace - (kT0 + 30'000));
}

TEST_P(FixedWindowTest, ForeignSetWithoutTtlIsRepaired) {
  auto c = counter();
  clock_->set(kT0 + 5'000);
  const std::string key = c->storage_key("k");
  cmd({"SET", key, "41"});
  EXPECT_EQ(pttl(key), -1);
  EXPECT_EQ(c->incr("k", 1), 42);
  EXPECT_EQ(pttl(key), expected_pttl());
  // A foreign "0" makes the next result equal the amount: still one deadline, the right one.
  cmd({"SET", key, "0"});
  EXPECT_EQ(c->incr("k", 3), 3);
  EXPECT_EQ(pttl(key), expected_pttl());
}

TEST_P(FixedWindowTest, IncrManyCounts) {
  auto c = counter();
  EXPECT_TRUE(c->incr_many({}).empty());
  EXPECT_EQ(cmd({"DBSIZE"}).integer, 0);
  const auto counts = c->incr_many({{"a", 1}, {"b", 2}, {"a", 3}, {"c", 10}});
  EXPECT_EQ(counts, (std::vector<std::int64_t>{1, 2, 4, 10}));
  EXPECT_EQ(c->get_many({"a", "b", "c"}), (std::vector<std::int64_t>{4, 2, 10}));
  for (const auto& k : {"a", "b", "c"}) EXPECT_EQ(c->pttl(k), expected_pttl()) << k;
}

TEST_P(FixedWindowTest, IncrManySplitsLargeBatchesCorrectly) {
  FixedWindowOptions o = options();
  o.max_script_batch = 7;  // many script calls per batch
  auto c = counter(o);
  std::vector<std::pair<std::string, std::int64_t>> items;
  for (int i = 0; i < 300; ++i) items.emplace_back(rctest::cat("k", i % 37), 1 + i % 3);
  const auto counts = c->incr_many(items);
  ASSERT_EQ(counts.size(), items.size());
  std::vector<std::int64_t> running(37, 0);
  for (std::size_t i = 0; i < items.size(); ++i) {
    running[i % 37] += items[i].second;
    EXPECT_EQ(counts[i], running[i % 37]) << i;
  }
  for (int k = 0; k < 37; ++k) EXPECT_EQ(c->get(rctest::cat("k", k)), running[static_cast<std::size_t>(k)]);
  EXPECT_EQ(cmd({"DBSIZE"}).integer, 37);
}

TEST_P(FixedWindowTest, InvalidInputsThrowAndChangeNothing) {
  auto c = counter();
  c->incr("existing", 3);
  const rctest::Snapshot before = rctest::snapshot(*store_);
  auto invalid = [&](auto&& f) { rctest::error_of<InvalidArgument>(f); };
  invalid([&] { c->incr("", 1); });
  invalid([&] { c->incr("k", 0); });
  invalid([&] { c->incr("k", -1); });
  invalid([&] { c->incr("existing", std::numeric_limits<std::int64_t>::min()); });
  invalid([&] { c->incr(std::string(1025, 'x'), 1); });
  invalid([&] { c->incr("\xC0\xAF", 1); });
  invalid([&] { c->incr("k", 1, std::string(257, 'r')); });
  invalid([&] { c->incr("k", 1, "\xFF"); });
  // incr_many validates every item before anything is sent.
  invalid([&] { c->incr_many({{"ok", 1}, {"existing", 1}, {"", 1}}); });
  invalid([&] { c->incr_many({{"ok", 1}, {"also-ok", 0}}); });
  invalid([&] { c->storage_key(""); });
  invalid([&] { c->get(""); });
  if (GetParam() == Mode::Commands) {
    const std::string msg = rctest::error_of<InvalidArgument>([&] { c->incr("existing", 1, "req-1"); });
    EXPECT_TRUE(contains(msg, "request_id")) << msg;
  }
  EXPECT_EQ(rctest::snapshot(*store_), before);
  EXPECT_EQ(rctest::keys(*store_), std::vector<std::string>{c->storage_key("existing")});
  EXPECT_EQ(cmd({"DBSIZE"}).integer, 1);
  EXPECT_EQ(c->get("existing"), 3);
}

TEST_P(FixedWindowTest, NonIntegerValueGivesReplyErrorAndStaysUnchanged) {
  auto c = counter();
  const std::string key = c->storage_key("k");
  cmd({"SET", key, "not-a-number"});
  const rctest::Snapshot before = rctest::snapshot(*store_);
  const std::string msg = rctest::error_of<ReplyError>([&] { c->incr("k", 1); });
  EXPECT_EQ(msg, kNotInteger);
  // The value stays; the key gets its window's deadline, so it goes with the window
  // instead of living for ever.
  EXPECT_EQ(rctest::snapshot(*store_).at(key).first, before.at(key).first);
  EXPECT_EQ(pttl(key), c->window("k").expire_at_ms - kT0);
  EXPECT_EQ(cmd({"GET", key}).str, "not-a-number");
}

TEST_P(FixedWindowTest, OverflowGivesReplyErrorAndLeavesTheCountUnchanged) {
  auto c = counter();
  const std::string key = c->storage_key("k");
  const std::string deadline = std::to_string(kT0 + kWindow + kGrace);
  cmd({"SET", key, std::to_string(kMax - 3), "PXAT", deadline});
  EXPECT_EQ(c->incr("k", 3), kMax);  // right up to the edge is fine
  const rctest::Snapshot before = rctest::snapshot(*store_);
  EXPECT_EQ(rctest::error_of<ReplyError>([&] { c->incr("k", 1); }), kOverflow);
  EXPECT_EQ(rctest::error_of<ReplyError>([&] { c->incr("k", kMax); }), kOverflow);
  EXPECT_EQ(rctest::snapshot(*store_), before);
  EXPECT_EQ(c->get("k"), kMax);
}

TEST_P(FixedWindowTest, CountsPast2To53AreExact) {
  auto c = counter();
  const std::string key = c->storage_key("k");
  cmd({"SET", key, "9007199254740993", "PXAT", std::to_string(kT0 + kWindow + kGrace)});  // 2^53 + 1
  EXPECT_EQ(c->incr("k", 1), 9007199254740994);
  EXPECT_EQ(c->incr("k", 2), 9007199254740996);
}

TEST_P(FixedWindowTest, IncrManyReportsFailedItemsAndAppliesTheOthers) {
  auto c = counter();
  cmd({"SET", c->storage_key("bad"), "x"});
  const std::string msg =
      rctest::error_of<ReplyError>([&] { c->incr_many({{"good", 1}, {"bad", 1}, {"other", 2}}); });
  EXPECT_TRUE(contains(msg, "1 of 3")) << msg;
  EXPECT_TRUE(contains(msg, "'bad'")) << msg;
  EXPECT_EQ(c->get("good"), 1);
  EXPECT_EQ(c->get("other"), 2);
  EXPECT_EQ(cmd({"GET", c->storage_key("bad")}).str, "x");
}

TEST_P(FixedWindowTest, StaggerSpreadsWindowBoundaries) {
  FixedWindowOptions o = options();
  o.window_ms = 3'600'000;
  o.stagger = true;
  auto c = counter(o);
  // Two keys whose windows turn over at different instants.
  std::string a = "user:0", b;
  for (int i = 1; b.empty(); ++i) {
    const std::string k = rctest::cat("user:", i);
    if (stagger_offset(k, o.window_ms) != stagger_offset(a, o.window_ms)) b = k;
  }
  WindowPos pa = c->window(a), pb = c->window(b);
  EXPECT_EQ(((pa.start_ms % o.window_ms) + o.window_ms) % o.window_ms, stagger_offset(a, o.window_ms));
  EXPECT_EQ(((pb.start_ms % o.window_ms) + o.window_ms) % o.window_ms, stagger_offset(b, o.window_ms));
  ASSERT_NE(pa.end_ms, pb.end_ms);
  if (pb.end_ms < pa.end_ms) {
    std::swap(a, b);
    std::swap(pa, pb);
  }
  EXPECT_EQ(c->incr(a, 1), 1);
  EXPECT_EQ(c->incr(b, 1), 1);
  EXPECT_EQ(c->pttl(a), pa.expire_at_ms - kT0);
  EXPECT_EQ(c->pttl(b), pb.expire_at_ms - kT0);
  clock_->set(pa.end_ms);  // a's window is over, b's is not
  EXPECT_EQ(c->incr(a, 1), 1);
  EXPECT_EQ(c->incr(b, 1), 2);
  clock_->set(pb.end_ms);
  EXPECT_EQ(c->incr(b, 1), 1);
  EXPECT_EQ(c->get(a), 1);
  // The key spread: of 200 keys, nearly all reset at a different millisecond.
  std::set<std::int64_t> ends;
  for (int i = 0; i < 200; ++i) ends.insert(c->window(rctest::cat("k", i)).end_ms);
  EXPECT_GE(ends.size(), 190u);
}

TEST_P(FixedWindowTest, ConcurrentIncrementsGiveTheExactTotal) {
  auto c = counter();
  constexpr int kThreads = 4;
  constexpr int kIters = 1500;
  std::vector<std::thread> threads;
  std::atomic<int> bad{0};
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      std::int64_t last = 0;
      for (int i = 0; i < kIters; ++i) {
        const std::int64_t n = c->incr("hot", 1);
        if (n <= last) ++bad;  // counts seen by one thread only grow
        last = n;
        if (i % 100 == 0) c->incr_many({{"hot", 2}, {"side", 1}});
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(bad.load(), 0);
  EXPECT_EQ(c->get("hot"), kThreads * (kIters + 2 * (kIters / 100)));
  EXPECT_EQ(c->get("side"), kThreads * (kIters / 100));
  EXPECT_EQ(c->pttl("hot"), expected_pttl());
}

TEST_P(FixedWindowTest, ClosedCounterRefusesIncrements) {
  auto c = counter();
  c->incr("k", 1);
  EXPECT_EQ(c->close(milliseconds(0)), 0u);
  rctest::error_of<Error>([&] { c->incr("k", 1); });
  rctest::error_of<Error>([&] { c->incr_many({{"k", 1}}); });
  EXPECT_EQ(cmd({"GET", c->storage_key("k")}).str, "1");
}

// ---- request ids (mode Script) ------------------------------------------------------

class RequestIdTest : public ::testing::Test {
 protected:
  std::shared_ptr<ManualClock> clock_ = std::make_shared<ManualClock>(kT0);
  std::shared_ptr<MemoryStore> store_ = rctest::memory_store(clock_);
  std::unique_ptr<FixedWindowCounter> c_ = [this] {
    FixedWindowOptions o;
    o.name = "pv";
    o.window_ms = kWindow;
    o.grace_ms = kGrace;
    return std::make_unique<FixedWindowCounter>(store_, o);
  }();
  Reply cmd(std::vector<std::string> args) { return rctest::run(*store_, std::move(args)); }
};

TEST_F(RequestIdTest, SameIdIsCountedOnce) {
  EXPECT_EQ(c_->incr("k", 1, "req-1"), 1);
  EXPECT_EQ(c_->incr("k", 1, "req-1"), 1);  // a repeat counts nothing, returns the current count
  EXPECT_EQ(c_->incr("k", 1, "req-2"), 2);
  EXPECT_EQ(c_->incr("k", 5, "req-1"), 2);
  EXPECT_EQ(c_->incr("k", 4), 6);            // no id: always counted
  EXPECT_EQ(c_->incr("k", 1, "req-2"), 6);
  EXPECT_EQ(c_->get("k"), 6);
}

TEST_F(RequestIdTest, IdsAreScopedToKeyAndWindowAndCarryTheWindowDeadline) {
  clock_->set(kT0 + 10'000);
  EXPECT_EQ(c_->incr("a", 1, "req"), 1);
  EXPECT_EQ(c_->incr("b", 1, "req"), 1);  // same id, other key: counted
  const std::string rid = request_id_key(c_->storage_key("a"), "req");
  EXPECT_EQ(rid, c_->storage_key("a") + ":rid:req");
  EXPECT_EQ(cmd({"GET", rid}).str, "1");
  EXPECT_EQ(cmd({"PTTL", rid}).integer, kT0 + kWindow + kGrace - (kT0 + 10'000));
  EXPECT_EQ(rctest::keys(*store_, "*:rid:*").size(), 2u);
  clock_->set(kT0 + kWindow);  // next window: the id counts again
  EXPECT_EQ(c_->incr("a", 1, "req"), 1);
  EXPECT_EQ(c_->incr("a", 1, "req"), 1);
}

TEST_F(RequestIdTest, RepeatStillRepairsALostTtl) {
  c_->incr("k", 1, "req");
  const std::string key = c_->storage_key("k");
  cmd({"PERSIST", key});
  clock_->set(kT0 + 7'000);
  EXPECT_EQ(c_->incr("k", 1, "req"), 1);
  EXPECT_EQ(cmd({"PTTL", key}).integer, kT0 + kWindow + kGrace - (kT0 + 7'000));
}

TEST_F(RequestIdTest, RepeatOfADeletedCounterReturnsZero) {
  c_->incr("k", 1, "req");
  cmd({"DEL", c_->storage_key("k")});
  EXPECT_EQ(c_->incr("k", 1, "req"), 0);
  EXPECT_EQ(c_->get("k"), 0);
}

TEST_F(RequestIdTest, FailedIncrementDoesNotRecordTheId) {
  const std::string key = c_->storage_key("k");
  cmd({"SET", key, "junk"});
  const rctest::Snapshot before = rctest::snapshot(*store_);
  EXPECT_EQ(rctest::error_of<ReplyError>([&] { c_->incr("k", 1, "req"); }), kNotInteger);
  EXPECT_EQ(rctest::keys(*store_), std::vector<std::string>{key});  // no rid key left behind
  EXPECT_EQ(rctest::snapshot(*store_).at(key).first, before.at(key).first);
  cmd({"SET", key, "10"});
  EXPECT_EQ(c_->incr("k", 1, "req"), 11);  // so a retry of the same id counts
}

// ---- construction ---------------------------------------------------------------------

TEST(FixedWindowOptionsValidation, ConstructorRejectsBadOptions) {
  auto store = rctest::memory_store(std::make_shared<ManualClock>(kT0));
  auto make = [&](auto&& tweak) {
    FixedWindowOptions o;
    o.name = "pv";
    o.window_ms = kWindow;
    tweak(o);
    return rctest::error_of<InvalidArgument>([&] { FixedWindowCounter c(store, o); });
  };
  EXPECT_TRUE(contains(make([](FixedWindowOptions& o) { o.name = ""; }), "name"));
  EXPECT_TRUE(contains(make([](FixedWindowOptions& o) { o.name = "a{b}"; }), "'{' or '}'"));
  EXPECT_TRUE(contains(make([](FixedWindowOptions& o) { o.prefix = "}"; }), "prefix"));
  EXPECT_TRUE(contains(make([](FixedWindowOptions& o) { o.window_ms = 0; }), "window"));
  EXPECT_TRUE(contains(make([](FixedWindowOptions& o) { o.grace_ms = -1; }), "grace"));
  make([](FixedWindowOptions& o) { o.queue_capacity = 0; });
  make([](FixedWindowOptions& o) { o.retry_backoff_min = milliseconds(0); });
  make([](FixedWindowOptions& o) { o.retry_backoff_max = milliseconds(1); });
  FixedWindowOptions o;
  o.name = "pv";
  o.window_ms = kWindow;
  rctest::error_of<InvalidArgument>([&] { FixedWindowCounter c(nullptr, o); });
  FixedWindowCounter ok(store, o);
  EXPECT_EQ(ok.options().grace_ms, 1000);  // the default grace
}

// ---- retry queue ----------------------------------------------------------------------

// A store that can be switched into failing, transiently, while the test runs.
class FlakyStore final : public Store {
 public:
  enum class Fault { None, Refused, Loading };
  explicit FlakyStore(std::shared_ptr<MemoryStore> inner) : inner_(std::move(inner)) {}
  std::vector<Reply> execute(const std::vector<Request>& batch) override {
    ++calls;
    switch (fault.load()) {
      case Fault::Refused:
        throw ConnectionError("connection refused (simulated)");
      case Fault::Loading:
        return std::vector<Reply>(batch.size(), Reply::of_error("LOADING Redis is loading the dataset in memory"));
      case Fault::None:
        break;
    }
    return inner_->execute(batch);
  }
  std::int64_t now_ms() const override { return inner_->now_ms(); }
  std::string describe() const override { return "flaky+" + inner_->describe(); }
  bool is_memory() const noexcept override { return false; }
  void close() override { inner_->close(); }

  std::atomic<Fault> fault{Fault::None};
  std::atomic<int> calls{0};

 private:
  std::shared_ptr<MemoryStore> inner_;
};

class RetryQueueTest : public ::testing::TestWithParam<Mode> {
 protected:
  std::shared_ptr<ManualClock> clock_ = std::make_shared<ManualClock>(kT0);
  std::shared_ptr<MemoryStore> mem_ = rctest::memory_store(clock_);
  std::shared_ptr<FlakyStore> flaky_ = std::make_shared<FlakyStore>(mem_);

  FixedWindowOptions options(OnError on_error) const {
    FixedWindowOptions o;
    o.name = "pv";
    o.window_ms = kWindow;
    o.grace_ms = kGrace;
    o.mode = GetParam();
    o.on_error = on_error;
    o.retry_backoff_min = milliseconds(1);
    o.retry_backoff_max = milliseconds(4);
    return o;
  }
};

INSTANTIATE_TEST_SUITE_P(Modes, RetryQueueTest, ::testing::Values(Mode::Script, Mode::Commands),
                         [](const ::testing::TestParamInfo<Mode>& i) { return std::string(mode_name(i.param)); });

constexpr milliseconds kFlushLimit{30'000};  // a bound, never a speed expectation

TEST_P(RetryQueueTest, RaiseModeThrowsAndStoresNothing) {
  FixedWindowCounter c(flaky_, options(OnError::Raise));
  flaky_->fault = FlakyStore::Fault::Refused;
  rctest::error_of<ConnectionError>([&] { c.incr("k", 1); });
  flaky_->fault = FlakyStore::Fault::Loading;
  const std::string msg = rctest::error_of<ReplyError>([&] { c.incr("k", 1); });
  EXPECT_TRUE(contains(msg, "LOADING")) << msg;
  EXPECT_EQ(c.pending(), 0u);
  EXPECT_EQ(rctest::run(*mem_, {"DBSIZE"}).integer, 0);
}

TEST_P(RetryQueueTest, TransientFailuresAreQueuedAndDeliveredLater) {
  FixedWindowCounter c(flaky_, options(OnError::Queue));
  flaky_->fault = FlakyStore::Fault::Refused;
  EXPECT_EQ(c.incr("k", 2), 0);
  flaky_->fault = FlakyStore::Fault::Loading;
  EXPECT_EQ(c.incr("k", 3), 0);
  EXPECT_EQ(c.incr_many({{"k", 1}, {"j", 4}}), (std::vector<std::int64_t>{0, 0}));
  RetryStats s = c.stats();
  EXPECT_EQ(s.queued, 4u);
  EXPECT_FALSE(s.last_error.empty());
  flaky_->fault = FlakyStore::Fault::None;
  EXPECT_EQ(c.flush(kFlushLimit), 0u);
  s = c.stats();
  EXPECT_EQ(s.delivered, 4u);
  EXPECT_EQ(s.pending, 0u);
  EXPECT_EQ(s.dropped, 0u);
  EXPECT_EQ(s.failed, 0u);
  EXPECT_EQ(c.get("k"), 6);
  EXPECT_EQ(c.get("j"), 4);
  EXPECT_EQ(rctest::run(*mem_, {"PTTL", c.storage_key("k")}).integer, kWindow + kGrace);
  EXPECT_EQ(c.incr("k", 1), 7);  // and the counter works normally again
}

TEST_P(RetryQueueTest, QueuedIncrementsOfAnEndedWindowAreDropped) {
  FixedWindowCounter c(flaky_, options(OnError::Queue));
  flaky_->fault = FlakyStore::Fault::Refused;
  EXPECT_EQ(c.incr("k", 1), 0);
  clock_->set(kT0 + kWindow + kGrace);  // that window plus grace is over
  flaky_->fault = FlakyStore::Fault::None;
  EXPECT_EQ(c.flush(kFlushLimit), 0u);
  const RetryStats s = c.stats();
  EXPECT_EQ(s.dropped, 1u);
  EXPECT_EQ(s.delivered, 0u);
  EXPECT_EQ(rctest::run(*mem_, {"DBSIZE"}).integer, 0);  // never counted in a later window
}

TEST_P(RetryQueueTest, FullQueueRaisesAndCloseCountsWhatIsLeft) {
  FixedWindowOptions o = options(OnError::Queue);
  o.queue_capacity = 2;
  FixedWindowCounter c(flaky_, o);
  flaky_->fault = FlakyStore::Fault::Refused;
  EXPECT_EQ(c.incr("a", 1), 0);
  EXPECT_EQ(c.incr("b", 1), 0);
  rctest::error_of<RetryQueueFull>([&] { c.incr("c", 1); });
  EXPECT_EQ(c.stats().overflowed, 1u);
  // close(0) reports what is still pending; the retry thread, woken by its flush, may end an
  // attempt while close() waits out its (zero) timeout, and then counts those increments as
  // failed itself. Either way none is lost silently: both end up failed.
  EXPECT_LE(c.close(milliseconds(0)), 2u);
  // An attempt the retry thread had in flight when close(0) returned is counted as failed
  // when it ends (the thread is not waited for): poll for it, bounded.
  RetryStats s = c.stats();
  for (int i = 0; i < 500 && (s.failed != 2u || s.pending != 0u); ++i) {
    std::this_thread::sleep_for(milliseconds(10));
    s = c.stats();
  }
  EXPECT_EQ(s.failed, 2u);
  EXPECT_EQ(s.pending, 0u);
  rctest::error_of<Error>([&] { c.incr("a", 1); });
}

TEST_P(RetryQueueTest, NonTransientErrorsAreRaisedNotQueued) {
  FixedWindowCounter c(flaky_, options(OnError::Queue));
  rctest::run(*mem_, {"SET", c.storage_key("k"), "junk"});
  EXPECT_EQ(rctest::error_of<ReplyError>([&] { c.incr("k", 1); }), kNotInteger);
  EXPECT_EQ(c.pending(), 0u);
  EXPECT_EQ(c.stats().queued, 0u);
}

// ---- a real Redis, only when REDCOUNT_TEST_REDIS_URL is set: see test_redis_store.cpp --

}  // namespace
