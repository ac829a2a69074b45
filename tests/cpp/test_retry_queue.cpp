// RetryQueue on its own: backoff, capacity, outcomes, stats and close(timeout) with an
// attempt that never ends by itself. Attempts run through the synchronous driver on a
// memory store, so what they deliver is read back from the store.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <map>
#include <mutex>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "redcount/common/errors.h"
#include "redcount/store/retry_queue.h"
#include "test_support.h"

namespace {

using namespace std::chrono_literals;
using redcount::Command;
using redcount::Reply;
using redcount::Request;
using redcount::RetryQueue;
using redcount::RetryQueueOptions;
using Outcome = RetryQueue::Outcome;

struct Item final : RetryQueue::Entry {
  explicit Item(std::string k, bool count = true) : key(std::move(k)) { counted = count; }
  std::string key;
};

std::vector<std::unique_ptr<RetryQueue::Entry>> items(std::initializer_list<const char*> keys) {
  std::vector<std::unique_ptr<RetryQueue::Entry>> out;
  for (const char* k : keys) out.push_back(std::make_unique<Item>(k));
  return out;
}

// What the test's attempts do, decided per attempt by the test.
struct Script {
  std::atomic<int> attempts{0};
  int transient_replies = 0;              // each key's first N tries get a transient error reply
  std::mutex mu;
  std::map<std::string, int> tries;       // per key
  std::atomic<int> transient_throws{0};   // the first N attempts fail whole (a ConnectionError)
  std::atomic<bool> fail_hard{false};     // error replies that are not transient
  std::string drop;                       // entries with this key are dropped unsent
  std::shared_future<void> gate;          // when valid, attempts wait for it in prepare()
};

// INCR of each entry's key, or what `script` says instead.
class TestAttempt final : public RetryQueue::Attempt {
 public:
  TestAttempt(Script& s, const std::vector<const RetryQueue::Entry*>& entries) : s_(s) {
    n_ = ++s_.attempts;
    for (const auto* e : entries) {
      const auto& item = static_cast<const Item&>(*e);
      const bool dropped = !s_.drop.empty() && item.key == s_.drop;
      outcomes.push_back(dropped ? Outcome::Dropped : Outcome::Sent);
      if (!dropped) keys_.push_back(item.key);
    }
  }
  std::vector<Request> prepare() override {
    if (s_.gate.valid()) s_.gate.wait();
    std::vector<Request> batch;
    for (const auto& k : keys_) batch.emplace_back(Command{{"INCR", k}});
    return batch;
  }
  std::vector<Request> finish(std::vector<Reply> replies) override {
    if (n_ <= s_.transient_throws) throw redcount::ConnectionError("connection refused (test)");
    std::size_t r = 0;
    for (auto& o : outcomes) {
      if (o != Outcome::Sent) continue;
      int tries = 0;
      {
        std::lock_guard<std::mutex> lock(s_.mu);
        tries = ++s_.tries[keys_[r]];
      }
      ++r;
      if (tries <= s_.transient_replies) {
        last_error = "LOADING the server is loading (test)";
        o = Outcome::Again;
      } else if (s_.fail_hard) {
        last_error = "ERR wrong (test)";
        o = Outcome::Failed;
      } else {
        o = Outcome::Delivered;
      }
    }
    EXPECT_EQ(r, replies.size());
    return {};
  }

 private:
  Script& s_;
  int n_ = 0;
  std::vector<std::string> keys_;
};

struct Fixture {
  std::shared_ptr<redcount::MemoryStore> store = std::make_shared<redcount::MemoryStore>();
  std::shared_ptr<Script> script = std::make_shared<Script>();
  std::shared_ptr<RetryQueue> queue;

  explicit Fixture(RetryQueueOptions o = {100, 1ms, 4ms}) {
    queue = RetryQueue::create(store, o, [s = script](const std::vector<const RetryQueue::Entry*>& entries) {
      return std::make_shared<TestAttempt>(*s, entries);
    });
  }
  std::int64_t value(const std::string& key) {
    auto v = rctest::run(*store, {"GET", key}).as_string();
    return v ? std::stoll(*v) : 0;
  }
};

TEST(RetryQueue, DeliversAfterTransientFailuresThroughTheDriver) {
  Fixture f;
  f.script->transient_replies = 2;
  f.script->transient_throws = 0;
  f.queue->enqueue(items({"a", "b"}), "LOADING first");
  EXPECT_EQ(f.queue->flush(std::nullopt), 0u);
  EXPECT_EQ(f.value("a"), 3);  // the store saw every attempt; the queue delivered once
  EXPECT_EQ(f.value("b"), 3);
  const auto s = f.queue->stats();
  EXPECT_EQ(s.queued, 2u);
  EXPECT_EQ(s.retried, 6u);
  EXPECT_EQ(s.delivered, 2u);
  EXPECT_EQ(s.failed, 0u);
  EXPECT_EQ(s.pending, 0u);
  EXPECT_NE(s.last_error.find("LOADING"), std::string::npos);
  EXPECT_EQ(f.queue->close(1s), 0u);
}

TEST(RetryQueue, AWholeAttemptThatFailsTransientlyIsRetried) {
  Fixture f;
  f.script->transient_throws = 3;
  f.queue->enqueue(items({"a"}), "refused");
  EXPECT_EQ(f.queue->flush(std::nullopt), 0u);
  const auto s = f.queue->stats();
  EXPECT_EQ(s.retried, 4u);
  EXPECT_EQ(s.delivered, 1u);
  EXPECT_NE(s.last_error.find("connection refused"), std::string::npos);
}

TEST(RetryQueue, NonTransientFailuresAndDropsAreCountedNotRetried) {
  Fixture f;
  f.script->fail_hard = true;
  f.script->drop = "gone";
  f.queue->enqueue(items({"a", "gone"}), "LOADING");
  EXPECT_EQ(f.queue->flush(std::nullopt), 0u);
  const auto s = f.queue->stats();
  EXPECT_EQ(s.failed, 1u);
  EXPECT_EQ(s.dropped, 1u);
  EXPECT_EQ(s.retried, 1u);  // the dropped entry was never sent
  EXPECT_EQ(f.value("gone"), 0);
}

TEST(RetryQueue, UncountedEntriesStayOutOfTheIncrementCounts) {
  Fixture f;
  std::vector<std::unique_ptr<RetryQueue::Entry>> e;
  e.push_back(std::make_unique<Item>("repair", false));
  f.queue->enqueue(std::move(e), "LOADING");
  EXPECT_EQ(f.queue->flush(std::nullopt), 0u);
  const auto s = f.queue->stats();
  EXPECT_EQ(s.queued, 0u);
  EXPECT_EQ(s.delivered, 0u);
  EXPECT_EQ(f.value("repair"), 1);
}

TEST(RetryQueue, CapacityBoundsQueuedAndInFlight) {
  std::promise<void> release;  // close()'s flush may start an attempt: it waits here
  Fixture f({2, 1h, 1h});
  f.script->gate = release.get_future().share();
  f.queue->enqueue(items({"a"}), "LOADING");
  EXPECT_THROW(f.queue->enqueue(items({"b", "c"}), "LOADING"), redcount::RetryQueueFull);
  f.queue->enqueue(items({"b"}), "LOADING");
  EXPECT_THROW(f.queue->enqueue(items({"c"}), "LOADING"), redcount::RetryQueueFull);
  const auto s = f.queue->stats();
  EXPECT_EQ(s.queued, 2u);
  EXPECT_EQ(s.overflowed, 3u);
  EXPECT_EQ(s.pending, 2u);
  EXPECT_EQ(f.queue->close(0ms), 2u);  // given up: counted as failed
  EXPECT_EQ(f.queue->stats().failed, 2u);
  EXPECT_THROW(f.queue->enqueue(items({"d"}), "LOADING"), redcount::Error);
  release.set_value();
}

TEST(RetryQueue, CloseDetachesAStuckAttemptAndCountsItsEntries) {
  std::promise<void> release;
  Fixture f;
  f.script->gate = release.get_future().share();
  f.queue->enqueue(items({"a"}), "LOADING");
  while (f.script->attempts == 0) std::this_thread::sleep_for(1ms);  // the attempt is stuck in prepare()
  const auto started = std::chrono::steady_clock::now();
  EXPECT_EQ(f.queue->close(50ms), 1u);
  // A liveness bound far above the timeout, not a speed assertion: it must not wait for the attempt.
  EXPECT_LT(std::chrono::steady_clock::now() - started, 30s);
  auto s = f.queue->stats();
  EXPECT_EQ(s.failed, 1u);
  EXPECT_EQ(s.pending, 0u);
  std::weak_ptr<RetryQueue> weak = f.queue;
  f.queue.reset();  // the detached thread keeps the queue alive until its attempt ends
  EXPECT_FALSE(weak.expired());
  release.set_value();
  while (!weak.expired()) std::this_thread::sleep_for(1ms);
  EXPECT_EQ(f.value("a"), 1);  // it landed, but close() had already given it up: not counted twice
}

TEST(RetryQueue, CloseWithoutTimeoutWaitsForTheAttempt) {
  Fixture f({100, 1ms, 1ms});
  f.script->transient_replies = 1;
  f.queue->enqueue(items({"a"}), "LOADING");
  EXPECT_EQ(f.queue->close(std::nullopt), 0u);
  EXPECT_EQ(f.queue->stats().delivered, 1u);
}

TEST(RetryQueue, OptionsAreCheckedInTheCore) {
  auto message = [](RetryQueueOptions o) -> std::string {
    try {
      redcount::validate(o);
    } catch (const redcount::InvalidArgument& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_EQ(message({0, 50ms, 50ms}), "queue_capacity must be >= 1, got 0");
  EXPECT_EQ(message({-3, 50ms, 50ms}), "queue_capacity must be >= 1, got -3");
  EXPECT_NE(message({1, 0ms, 50ms}).find("retry_backoff must be"), std::string::npos);
  EXPECT_EQ(message({1, 60ms, 50ms}), "retry_backoff_max must be >= retry_backoff");
  EXPECT_EQ(message({1, 50ms, 50ms}), "");
}

}  // namespace
