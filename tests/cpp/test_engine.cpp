// The I/O engine under RedisStore, against a real redis-server (REDCOUNT_TEST_REDIS_URL;
// skipped otherwise): synchronous calls and submit() callbacks from many threads with exact
// totals, callbacks that submit again from the engine's thread, a cancelled batch that is
// never written, refused connection-state commands, close() from many threads, requests
// larger than the socket buffer on the synchronous fast path, and a blocking WAIT kept off
// the shared connection.
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "redcount/common/errors.h"
#include "redcount/common/options.h"
#include "redcount/redis/io/pipeline.h"
#include "redcount/redis/io/resolver.h"
#include "redcount/sharded/quota.h"
#include "redcount/store/scripts.h"
#include "redcount/redis/io/transport.h"
#include "redcount/redis/redis_store.h"
#include "test_support.h"

using namespace redcount;

namespace {

class EngineTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* url = std::getenv("REDCOUNT_TEST_REDIS_URL");
    if (url == nullptr || *url == '\0') GTEST_SKIP() << "REDCOUNT_TEST_REDIS_URL is not set";
    options_ = parse_url(url);
    static int run = 0;
    prefix_ = rctest::cat("rcengine", ::getpid(), "x", ++run, ":");
    admin_ = std::make_shared<RedisStore>(options_);
  }
  void TearDown() override {
    if (!admin_) return;
    Reply keys = rctest::run(*admin_, {"KEYS", prefix_ + "*"});
    for (const auto& k : keys.elements) rctest::run(*admin_, {"DEL", k.str});
    admin_->close();
  }
  std::int64_t get(const std::string& key) {
    auto v = rctest::run(*admin_, {"GET", key}).as_string();
    return v ? std::stoll(*v) : 0;
  }

  StoreOptions options_;
  std::string prefix_;
  std::shared_ptr<RedisStore> admin_;
};

// Waits for a number of callbacks.
struct Latch {
  std::mutex m;
  std::condition_variable cv;
  int left;
  explicit Latch(int n) : left(n) {}
  void count_down() {
    std::lock_guard<std::mutex> lock(m);
    if (--left == 0) cv.notify_all();
  }
  bool wait_for(std::chrono::seconds s) {
    std::unique_lock<std::mutex> lock(m);
    return cv.wait_for(lock, s, [this] { return left == 0; });
  }
};

std::int64_t blocked_clients(Store& store) {
  const std::string info = *rctest::run(store, {"INFO", "clients"}).as_string();
  const auto at = info.find("blocked_clients:");
  return at == std::string::npos ? -1 : std::stoll(info.substr(at + 16));
}

TEST_F(EngineTest, ADurableWaitNeverHoldsTheSharedConnection) {
  // One shared connection and no thread connections: before, the WAIT sat on it and every
  // other call waited behind it, past its command timeout.
  StoreOptions o = options_;
  o.command_timeout = std::chrono::milliseconds(400);
  o.connections = 1;
  o.max_connections = 1;
  auto store = std::make_shared<RedisStore>(o);
  QuotaOptions q;
  q.prefix = prefix_.substr(0, prefix_.size() - 1);  // keys under prefix_, deleted by TearDown
  q.name = "durable";
  q.durable = 1;  // the test server has no replica: every WAIT runs its whole timeout
  q.durable_timeout = std::chrono::milliseconds(1000);  // above command_timeout
  Quota quota(store, q);
  ASSERT_EQ(rctest::run(*store, {"PING"}).str, "PONG");

  std::atomic<bool> finished{false};
  QuotaResult result;
  std::exception_ptr error;
  std::chrono::steady_clock::duration took{};
  std::thread durable([&] {
    const auto t0 = std::chrono::steady_clock::now();
    try {
      result = quota.give(5, "g-1");
    } catch (...) {
      error = std::current_exception();
    }
    took = std::chrono::steady_clock::now() - t0;
    finished = true;
  });
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(1);
  while (blocked_clients(*admin_) < 1 && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  ASSERT_GE(blocked_clients(*admin_), 1) << "the durable call's WAIT never blocked";
  // Synchronous calls and submitted batches on the same store, answered while it blocks.
  for (int i = 0; i < 10; ++i) {
    EXPECT_NO_THROW(rctest::run(*store, {"INCRBY", prefix_ + "other", "1"}));
  }
  Latch latch(10);
  std::atomic<int> ok{0};
  for (int i = 0; i < 10; ++i) {
    store->submit({Command{{"INCRBY", prefix_ + "other", "1"}}}, [&](std::vector<Reply>&& r, std::exception_ptr e) {
      if (!e && r.size() == 1 && !r[0].is_error()) ++ok;
      latch.count_down();
    });
  }
  EXPECT_TRUE(latch.wait_for(std::chrono::seconds(5)));
  EXPECT_EQ(ok.load(), 10);
  EXPECT_FALSE(finished.load()) << "the WAIT ended before the other calls did: nothing was shown";
  durable.join();
  ASSERT_FALSE(error) << "too few replicas is a result, not an error";
  EXPECT_TRUE(result.applied);
  EXPECT_EQ(result.value, 5);
  EXPECT_EQ(result.replicas, 0);
  EXPECT_FALSE(result.durable_ok);
  EXPECT_GE(took, std::chrono::milliseconds(950));
  EXPECT_EQ(get(prefix_ + "other"), 20);
  EXPECT_EQ(quota.value(), 5);
  store->close();
}

TEST(PipelineRounds, AWaitAfterAResentWriteGoesAgainAfterIt) {
  // WAIT counts the replicas that have its connection's last write: when the write before
  // it is sent again (NOSCRIPT, or a "did not run" rejection), its first answer is stale.
  auto batch = [] {
    std::vector<Request> b;
    b.emplace_back(ScriptCall{&kQuotaScript, {"q"}, {"give", "1", "0", "10", "1000"}});
    Command wait{{"WAIT", "1", "100"}};
    wait.blocks_for = std::chrono::milliseconds(100);
    b.emplace_back(std::move(wait));
    return b;
  };
  const auto now = redis::SteadyClock::now();
  auto job = redis::make_job(batch(), nullptr, nullptr, now + std::chrono::seconds(5));
  job->replies[0] = Reply::of_error("NOSCRIPT No matching script.");
  job->replies[1] = Reply::of_integer(1);
  EXPECT_EQ(redis::after_round(*job, now, std::chrono::milliseconds(5), std::chrono::milliseconds(200)),
            redis::Next::Again);
  EXPECT_EQ(job->todo, (std::vector<std::uint32_t>{0, 1}));
  ASSERT_EQ(job->loads.size(), 1u);

  job = redis::make_job(batch(), nullptr, nullptr, now + std::chrono::seconds(5));
  job->replies[0] = Reply::of_error("READONLY You can't write against a read only replica.");
  job->replies[1] = Reply::of_integer(0);
  EXPECT_EQ(redis::after_round(*job, now, std::chrono::milliseconds(5), std::chrono::milliseconds(200)),
            redis::Next::Later);
  EXPECT_EQ(job->todo, (std::vector<std::uint32_t>{0, 1}));

  // A write that ran: the WAIT's answer stands.
  job = redis::make_job(batch(), nullptr, nullptr, now + std::chrono::seconds(5));
  job->replies[0] = Reply::of_array({Reply::of_integer(1), Reply::of_integer(1), Reply::of_integer(0)});
  job->replies[1] = Reply::of_integer(0);
  EXPECT_EQ(redis::after_round(*job, now, std::chrono::milliseconds(5), std::chrono::milliseconds(200)),
            redis::Next::Complete);
}

TEST_F(EngineTest, SyncAndSubmitFromManyThreadsExactTotals) {
  for (int connections : {1, 2}) {
    StoreOptions o = options_;
    o.connections = connections;
    o.max_connections = connections + 3;  // up to 3 thread connections for the blocking callers
    auto store = std::make_shared<RedisStore>(o);
    const std::string key = prefix_ + rctest::cat("k", connections);
    constexpr int kThreads = 8, kEach = 300;
    Latch latch(kThreads * kEach);
    std::atomic<int> errors{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t] {
        for (int i = 0; i < kEach; ++i) {
          if (t % 2 == 0) {
            if (rctest::run(*store, {"INCRBY", key, "2"}).is_error()) ++errors;
            latch.count_down();
          } else {
            store->submit({Command{{"INCRBY", key, "2"}}}, [&](std::vector<Reply>&& r, std::exception_ptr e) {
              if (e || r.size() != 1 || r[0].is_error()) ++errors;
              latch.count_down();
            });
          }
        }
      });
    }
    for (auto& t : threads) t.join();
    ASSERT_TRUE(latch.wait_for(std::chrono::seconds(30)));
    EXPECT_EQ(errors.load(), 0);
    EXPECT_EQ(get(key), 2 * kThreads * kEach);
    EXPECT_LE(store->open_connections(), o.max_connections);
    store->close();
  }
}

// Many threads calling at once on one multiplexed socket (where a waiting caller may read
// the replies of the others and hand the connection on) and with thread connections: every
// call completes, each thread's answered calls take effect in its order with their own
// replies, and a failure says truthfully whether its request may have run, through
// deadlines that expire while the server is paused (CLIENT PAUSE, twice).
TEST_F(EngineTest, ManyThreadsCompleteInOrderThroughDeadlinesAndAPausedServer) {
  for (int extra : {0, 12}) {
    StoreOptions o = options_;
    o.command_timeout = std::chrono::milliseconds(150);
    o.max_connections = 1 + extra;
    auto store = std::make_shared<RedisStore>(o);
    constexpr int kThreads = 12, kAtLeast = 40;
    std::atomic<bool> over{false};
    struct Seen {
      std::vector<std::pair<int, std::int64_t>> answered;  // (seq, list length in the reply)
      std::vector<int> maybe, not_sent;
      int calls = 0;
      std::string unexpected;
    };
    std::vector<Seen> seen(kThreads);
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t] {
        const std::string key = prefix_ + rctest::cat("order", extra, ":", t);
        for (int seq = 0; seq < kAtLeast || !over.load(); ++seq) {
          seen[t].calls = seq + 1;
          try {
            Reply r = rctest::run(*store, {"RPUSH", key, std::to_string(seq)});
            seen[t].answered.emplace_back(seq, r.integer);
          } catch (const ConnectionError& e) {  // TimeoutError too
            (e.maybe_applied() ? seen[t].maybe : seen[t].not_sent).push_back(seq);
          } catch (const std::exception& e) {
            seen[t].unexpected = e.what();
            return;
          }
        }
      });
    }
    auto pauser = std::make_shared<RedisStore>(options_);
    for (int k = 0; k < 2; ++k) {
      std::this_thread::sleep_for(std::chrono::milliseconds(40));
      rctest::run(*pauser, {"CLIENT", "PAUSE", "400"});  // longer than the deadline
      std::this_thread::sleep_for(std::chrono::milliseconds(450));
    }
    over = true;
    for (auto& th : threads) th.join();
    pauser->close();
    int timeouts = 0;
    for (int t = 0; t < kThreads; ++t) {
      const Seen& s = seen[t];
      ASSERT_EQ(s.unexpected, "") << "thread " << t;
      timeouts += static_cast<int>(s.maybe.size());
      EXPECT_EQ(static_cast<int>(s.answered.size() + s.maybe.size() + s.not_sent.size()), s.calls);
      Reply list = rctest::run(*admin_, {"LRANGE", prefix_ + rctest::cat("order", extra, ":", t), "0", "-1"});
      std::vector<int> applied;
      for (const auto& e : list.elements) applied.push_back(std::stoi(e.str));
      std::vector<int> sorted_applied = applied;
      std::sort(sorted_applied.begin(), sorted_applied.end());
      EXPECT_EQ(std::adjacent_find(sorted_applied.begin(), sorted_applied.end()), sorted_applied.end())
          << "thread " << t << ": a request ran twice";
      std::vector<int> answered_order;
      for (const auto& [seq, length] : s.answered) {
        const auto at = std::find(applied.begin(), applied.end(), seq);
        ASSERT_NE(at, applied.end()) << "thread " << t << ": answered call " << seq << " did not run";
        EXPECT_EQ(at - applied.begin() + 1, length) << "thread " << t << ": call " << seq << " got another reply";
      }
      for (int seq : applied) {
        if (std::any_of(s.answered.begin(), s.answered.end(), [&](const auto& a) { return a.first == seq; })) {
          answered_order.push_back(seq);
        } else {
          EXPECT_NE(std::find(s.maybe.begin(), s.maybe.end(), seq), s.maybe.end())
              << "thread " << t << ": call " << seq << " ran but was reported as not sent";
        }
      }
      EXPECT_TRUE(std::is_sorted(answered_order.begin(), answered_order.end())) << "thread " << t;
    }
    EXPECT_GT(timeouts, 0) << "no deadline expired while the server was paused: the test did not test it";
    store->close();
  }
}

// A lone synchronous caller writes an idle connection itself: a request bigger than the
// socket buffer must be written in full before it waits for the reply (it once waited for
// the reply after the first partial write, until command_timeout).
TEST_F(EngineTest, ALoneCallerWritesARequestLargerThanTheSocketBufferInFull) {
  // An engine that waited for a reply (or for readability) before the whole request was
  // out would never finish the write: the call would end in a timeout, not in the replies.
  // The timeout is generous so that a slow (sanitized, loaded) machine is not mistaken for it.
  StoreOptions o = options_;
  o.command_timeout = std::chrono::milliseconds(60'000);
  auto store = std::make_shared<RedisStore>(o);
  for (std::size_t size : {std::size_t{16} << 10, std::size_t{1} << 20, std::size_t{16} << 20}) {
    std::string value(size, '\0');
    for (std::size_t i = 0; i < size; ++i) value[i] = static_cast<char>('a' + (i * 7919) % 26);
    const std::string key = prefix_ + rctest::cat("big", size);
    EXPECT_EQ(rctest::run(*store, {"SET", key, value}).str, "OK") << size;
    EXPECT_EQ(rctest::run(*store, {"STRLEN", key}).integer, static_cast<std::int64_t>(size));
    const Reply got = rctest::run(*store, {"GET", key});
    EXPECT_TRUE(got.str == value) << size;  // not EXPECT_EQ: it would print 16 MB
  }
  store->close();
}

// A short write means "wait until the socket is writable", never "wait for a reply".
TEST(PlainTransport, AShortWriteAsksForWritability) {
  int fds[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, fds), 0);
  const int small = 16 * 1024;
  ::setsockopt(fds[0], SOL_SOCKET, SO_SNDBUF, &small, sizeof small);
  auto t = make_plain_transport(fds[0]);
  const std::string data(4 << 20, 'x');
  const std::size_t n = t->write(data.data(), data.size());
  ASSERT_LT(n, data.size());
  EXPECT_EQ(t->want(), Transport::Want::Write);
  // Drain the peer, then the rest goes out and the transport waits for replies again.
  std::size_t done = n;
  std::string sink(1 << 16, '\0');
  while (done < data.size()) {
    const ssize_t got = ::recv(fds[1], sink.data(), sink.size(), MSG_DONTWAIT);
    (void)got;
    done += t->write(data.data() + done, data.size() - done);
  }
  EXPECT_EQ(t->want(), Transport::Want::Read);
  ::close(fds[1]);
}

TEST_F(EngineTest, CallbacksMaySubmitAgainFromTheEngineThread) {
  auto store = std::make_shared<RedisStore>(options_);
  const std::string key = prefix_ + "chain";
  Latch latch(1);
  std::atomic<int> steps{0};
  std::function<void()> next;
  next = [&] {
    store->submit({Command{{"INCR", key}}}, [&](std::vector<Reply>&& r, std::exception_ptr e) {
      if (e || r[0].is_error()) return latch.count_down();
      // A blocking call here would deadlock the engine's thread: it is refused.
      if (steps == 0) {
        try {
          store->execute({Command{{"PING"}}});
        } catch (const Error&) {
          steps += 1000;
        }
      }
      if (++steps % 1000 == 200) return latch.count_down();
      next();
    });
  };
  next();
  ASSERT_TRUE(latch.wait_for(std::chrono::seconds(30)));
  EXPECT_EQ(steps.load(), 1200);  // the refusal was seen once, then 200 chained submits
  EXPECT_EQ(get(key), 200);
  store->close();
}

TEST_F(EngineTest, CancelledBatchIsNeverWritten) {
  const std::string key = prefix_ + "cancelled";
  auto flag = std::make_shared<std::atomic<bool>>(true);
  auto store = std::make_shared<RedisStore>(options_);
  std::exception_ptr got;
  store->submit({Command{{"INCR", key}}}, [&](std::vector<Reply>&&, std::exception_ptr e) { got = e; }, flag);
  ASSERT_TRUE(got);  // known at once
  EXPECT_THROW(std::rethrow_exception(got), Cancelled);

  // Cancelled while queued: the server pauses every client, so the new store's handshake
  // waits, and its batch with it; the flag is set before the pause ends.
  rctest::run(*admin_, {"CLIENT", "PAUSE", "300", "ALL"});
  flag->store(false);
  Latch latch(1);
  store->submit({Command{{"INCR", key}}}, [&](std::vector<Reply>&&, std::exception_ptr e) {
    got = e;
    latch.count_down();
  }, flag);
  flag->store(true);
  ASSERT_TRUE(latch.wait_for(std::chrono::seconds(10)));
  ASSERT_TRUE(got);
  EXPECT_THROW(std::rethrow_exception(got), Cancelled);
  EXPECT_EQ(get(key), 0);
  EXPECT_EQ(rctest::run(*store, {"INCR", key}).integer, 1);  // the store works on
  store->close();
}

// contended(): another thread waits in a synchronous call on a store that may open thread
// connections (each such call is a round trip of its own). Never for submitted batches, and
// never on a store whose sockets are all multiplexed (the calls share pipelined writes).
TEST_F(EngineTest, ContendedWhileAnotherThreadWaitsOnAStoreWithThreadConnections) {
  StoreOptions with_threads = options_;
  with_threads.connections = 1;
  with_threads.max_connections = 3;
  auto store = std::make_shared<RedisStore>(with_threads);
  StoreOptions shared_only = options_;
  shared_only.connections = 1;
  shared_only.max_connections = 1;
  auto shared = std::make_shared<RedisStore>(shared_only);
  const std::string key = prefix_ + "contended";
  rctest::run(*store, {"PING"});
  rctest::run(*shared, {"PING"});
  EXPECT_FALSE(store->contended());
  EXPECT_FALSE(shared->contended());

  // Writes wait while the server pauses them (reads and this admin connection go on).
  rctest::run(*admin_, {"CLIENT", "PAUSE", "300", "WRITE"});
  Latch latch(1);
  store->submit({Command{{"INCR", key}}}, [&](std::vector<Reply>&&, std::exception_ptr) { latch.count_down(); });
  EXPECT_FALSE(store->contended());  // a submitted batch is pipelined: not counted
  ASSERT_TRUE(latch.wait_for(std::chrono::seconds(10)));

  rctest::run(*admin_, {"CLIENT", "PAUSE", "300", "WRITE"});
  std::thread on_shared([&] { rctest::run(*shared, {"INCR", key}); });
  std::thread on_store([&] { rctest::run(*store, {"INCR", key}); });
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (!store->contended() && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_TRUE(store->contended());    // the other thread waits in execute()
  EXPECT_FALSE(shared->contended());  // one socket: its callers share pipelined writes
  on_store.join();
  on_shared.join();
  EXPECT_FALSE(store->contended());
  EXPECT_EQ(get(key), 3);
  store->close();
  shared->close();
}

TEST_F(EngineTest, ConnectionStateCommandsAreRefused) {
  for (std::vector<std::string> cmd : std::vector<std::vector<std::string>>{
           {"SELECT", "1"}, {"select", "1"}, {"WATCH", "k"}, {"SUBSCRIBE", "c"}, {"CLIENT", "REPLY", "OFF"},
           {"AUTH", "pw"}, {"HELLO", "3"}, {"RESET"}, {"BLPOP", "k", "0"}, {"MULTI"}, {"EXEC"}}) {
    EXPECT_THROW(rctest::run(*admin_, cmd), InvalidArgument) << cmd[0];
  }
  const std::string key = prefix_ + "tx";
  std::vector<Request> tx{Command{{"MULTI"}}, Command{{"INCRBY", key, "5"}}, Command{{"PEXPIRE", key, "60000"}},
                          Command{{"EXEC"}}};
  auto replies = admin_->execute(tx);
  ASSERT_EQ(replies.size(), 4u);
  ASSERT_EQ(replies[3].elements.size(), 2u);
  EXPECT_EQ(replies[3].elements[0].integer, 5);
  EXPECT_EQ(rctest::run(*admin_, {"PING"}).str, "PONG");  // still in step, still db 0
}

TEST_F(EngineTest, CloseFromManyThreadsThenCallsRaiseStoreClosed) {
  auto store = std::make_shared<RedisStore>(options_);
  EXPECT_EQ(rctest::run(*store, {"PING"}).str, "PONG");
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) threads.emplace_back([&] { store->close(); });
  for (auto& t : threads) t.join();
  try {
    rctest::run(*store, {"PING"});
    ADD_FAILURE() << "no error";
  } catch (const StoreClosed& e) {
    EXPECT_FALSE(is_transient(e));
    EXPECT_FALSE(e.maybe_applied());
  }
}

}  // namespace

namespace {

// Holds every name resolution open until release(), then answers with `answer`.
struct HeldResolver {
  std::mutex m;
  std::condition_variable cv;
  bool released = false;
  std::atomic<int> calls{0};
  redcount::redis::AddrList answer() {
    ++calls;
    std::unique_lock<std::mutex> lock(m);
    cv.wait(lock, [this] { return released; });
    redcount::redis::AddrList none;
    none.error = "Name or service not known";
    return none;
  }
  void release() {
    std::lock_guard<std::mutex> lock(m);
    released = true;
    cv.notify_all();
  }
};

}  // namespace

// getaddrinfo() can wait seconds on DNS; it must not stop the reactor: a request waiting
// for the connection still times out at its deadline while the name is being resolved.
TEST(EngineResolver, ResolvingAHostNameNeverBlocksTheReactor) {
  auto held = std::make_shared<HeldResolver>();
  redcount::redis::set_resolve_hook_for_tests([held](const std::string&, int) { return held->answer(); });
  StoreOptions o;
  o.kind = StoreOptions::Kind::Tcp;
  o.host = "cache.redcount-test.invalid";
  o.port = 6379;
  o.command_timeout = std::chrono::milliseconds(200);
  o.connect_timeout = std::chrono::milliseconds(60000);
  auto store = std::make_shared<RedisStore>(o);
  std::mutex m;
  std::condition_variable cv;
  std::exception_ptr error;
  bool done = false;
  store->submit({Command{{"PING"}}}, [&](std::vector<Reply>&&, std::exception_ptr e) {
    std::lock_guard<std::mutex> lock(m);
    error = e;
    done = true;
    cv.notify_all();
  });
  {
    std::unique_lock<std::mutex> lock(m);
    ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(30), [&] { return done; }));
  }
  // The deadline fired while the resolution was still held open.
  EXPECT_EQ(held->calls.load(), 1);
  ASSERT_TRUE(error);
  try {
    std::rethrow_exception(error);
  } catch (const TimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find("waiting for a connection"), std::string::npos) << e.what();
  }
  held->release();
  // The failed resolution is reported as such, naming the host (first, or as the reason
  // of the reconnect backoff).
  bool named = false;
  for (int i = 0; i < 100 && !named; ++i) {
    try {
      rctest::run(*store, {"PING"});
      ADD_FAILURE() << "PING went through to a host that does not resolve";
      break;
    } catch (const ConnectionError& e) {
      named = std::string(e.what()).find("cannot resolve host 'cache.redcount-test.invalid'") != std::string::npos;
      if (!named) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  EXPECT_TRUE(named);
  store->close();
  redcount::redis::set_resolve_hook_for_tests({});
}

// A connect_timeout that runs out while resolving says so.
TEST(EngineResolver, ConnectTimeoutWhileResolvingNamesTheHost) {
  auto held = std::make_shared<HeldResolver>();
  redcount::redis::set_resolve_hook_for_tests([held](const std::string&, int) { return held->answer(); });
  StoreOptions o;
  o.kind = StoreOptions::Kind::Tcp;
  o.host = "slow.redcount-test.invalid";
  o.port = 6379;
  o.command_timeout = std::chrono::milliseconds(5000);
  o.connect_timeout = std::chrono::milliseconds(100);
  auto store = std::make_shared<RedisStore>(o);
  std::string message;
  try {
    rctest::run(*store, {"PING"});
  } catch (const ConnectionError& e) {
    message = e.what();
  }
  EXPECT_NE(message.find("timed out resolving host 'slow.redcount-test.invalid'"), std::string::npos) << message;
  held->release();
  store->close();
  redcount::redis::set_resolve_hook_for_tests({});
}
