// Sentinel: the pure helpers (ROLE and +switch-master parsing), and the resolver and the
// watcher against real processes this file starts (test_servers.h): a redis-server master
// and replica and three `redis-server --sentinel` processes on free loopback ports, with
// configurations generated in a temporary directory. Readiness is polled, never slept
// for; every process is killed and the directory removed when a test ends. The live tests
// are skipped, by name, only when redis-server is not installed.
//
//   build/test-asan/redcount_tests --gtest_filter='Sentinel*'
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "redcount/common/errors.h"
#include "redcount/common/options.h"
#include "redcount/redis/topology/sentinel.h"
#include "redcount/redis/redis_store.h"
#include "test_servers.h"
#include "test_support.h"

using namespace redcount;
using namespace redcount::redis;
using rctest::contains;
using rctest::free_port;
using rctest::have_redis_server;
using rctest::ServerProcess;
namespace fs = std::filesystem;
using std::chrono::milliseconds;
using std::chrono::seconds;

// --- the pure helpers -------------------------------------------------------------------------

TEST(SentinelRole, ParsesRoleReplies) {
  const Reply master = Reply::of_array({Reply::of_string("master"), Reply::of_integer(0), Reply::of_array({})});
  const Reply replica = Reply::of_array({Reply::of_string("slave"), Reply::of_string("127.0.0.1"),
                                         Reply::of_integer(6379), Reply::of_string("connected"),
                                         Reply::of_integer(10)});
  const Reply sentinel = Reply::of_array({Reply::of_string("sentinel"), Reply::of_array({})});
  EXPECT_EQ(parse_role(master), Role::Master);
  EXPECT_EQ(parse_role(replica), Role::Replica);
  EXPECT_EQ(parse_role(sentinel), Role::Sentinel);
  EXPECT_EQ(parse_role(Reply::nil()), Role::Unknown);
  EXPECT_EQ(parse_role(Reply::of_error("NOPERM no")), Role::Unknown);
  EXPECT_NO_THROW(expect_master(master, "m:1"));
  try {
    expect_master(replica, "10.0.0.9:6379");
    FAIL();
  } catch (const ConnectionError& e) {
    EXPECT_FALSE(e.maybe_applied());
    EXPECT_TRUE(contains(e.what(), "10.0.0.9:6379 is not the master (ROLE says replica)")) << e.what();
  }
  EXPECT_THROW(expect_master(Reply::of_error("NOPERM this user has no permissions to run the 'role' command"), "x"),
               AuthenticationError);
  EXPECT_EQ(role_command().args, std::vector<std::string>{"ROLE"});
}

TEST(SentinelRole, RecheckSchedule) {
  RoleRecheck r;
  EXPECT_EQ(r.interval(), milliseconds(5000));
  const TimePoint t0 = SteadyClock::now();
  EXPECT_TRUE(r.due(t0));
  r.sent(t0);
  EXPECT_FALSE(r.due(t0 + milliseconds(4999)));
  EXPECT_TRUE(r.due(t0 + milliseconds(5000)));
}

TEST(SentinelParse, SwitchMasterPayloadAndMasterReply) {
  EXPECT_EQ(SwitchMasterWatcher::parse_switch("svc 127.0.0.1 6379 127.0.0.1 6380", "svc"),
            (Address{"127.0.0.1", 6380}));
  EXPECT_EQ(SwitchMasterWatcher::parse_switch("other 127.0.0.1 6379 127.0.0.1 6380", "svc"), std::nullopt);
  EXPECT_EQ(SwitchMasterWatcher::parse_switch("svc 127.0.0.1 6379 127.0.0.1", "svc"), std::nullopt);
  EXPECT_EQ(SwitchMasterWatcher::parse_switch("svc a 1 b 0", "svc"), std::nullopt);

  EXPECT_EQ(SentinelResolver::parse_master_reply(Reply::nil()), std::nullopt);
  EXPECT_EQ(SentinelResolver::parse_master_reply(
                Reply::of_array({Reply::of_string("10.1.2.3"), Reply::of_string("6390")})),
            (Address{"10.1.2.3", 6390}));
  EXPECT_THROW(SentinelResolver::parse_master_reply(Reply::of_integer(1)), ProtocolError);
  EXPECT_THROW(SentinelResolver::parse_master_reply(
                   Reply::of_array({Reply::of_string("h"), Reply::of_string("port")})),
               ProtocolError);
}

TEST(SentinelParse, FailoverEvents) {
  const auto sel = SwitchMasterWatcher::parse_selected("slave 10.0.0.2:6380 10.0.0.2 6380 @ svc 10.0.0.1 6379", "svc");
  ASSERT_TRUE(sel.has_value());
  EXPECT_EQ(sel->replica, (Address{"10.0.0.2", 6380}));
  EXPECT_EQ(sel->master, (Address{"10.0.0.1", 6379}));
  EXPECT_FALSE(SwitchMasterWatcher::parse_selected("slave 10.0.0.2:6380 10.0.0.2 6380 @ other 10.0.0.1 6379", "svc"));
  EXPECT_FALSE(SwitchMasterWatcher::parse_selected("slave 10.0.0.2:6380 10.0.0.2 0 @ svc 10.0.0.1 6379", "svc"));
  EXPECT_FALSE(SwitchMasterWatcher::parse_selected("slave 10.0.0.2:6380 10.0.0.2 6380 svc 10.0.0.1 6379", "svc"));
  EXPECT_FALSE(SwitchMasterWatcher::parse_selected("master svc 10.0.0.1 6379", "svc"));
  EXPECT_FALSE(SwitchMasterWatcher::parse_selected("", "svc"));

  EXPECT_TRUE(SwitchMasterWatcher::is_abort_of("master svc 10.0.0.1 6379", "svc"));
  EXPECT_FALSE(SwitchMasterWatcher::is_abort_of("master other 10.0.0.1 6379", "svc"));
  EXPECT_FALSE(SwitchMasterWatcher::is_abort_of("slave 10.0.0.2:6380 10.0.0.2 6380 @ svc 10.0.0.1 6379", "svc"));
  const auto& ch = SwitchMasterWatcher::channels();
  EXPECT_NE(std::find(ch.begin(), ch.end(), "+selected-slave"), ch.end());
  EXPECT_NE(std::find(ch.begin(), ch.end(), "-failover-abort-slave-timeout"), ch.end());
}

TEST(SentinelResolverOptions, RefusesAnIncompleteConfiguration) {
  SentinelOptions o;
  o.service = "svc";
  EXPECT_THROW(SentinelResolver{o}, InvalidArgument);
  o.sentinels = {{"127.0.0.1", 26379}};
  o.service.clear();
  EXPECT_THROW(SentinelResolver{o}, InvalidArgument);
  o.service = "svc";
  o.sentinels = {{"127.0.0.1", 0}};
  EXPECT_THROW(SentinelResolver{o}, InvalidArgument);
  o.sentinels = {{"", 1}};
  EXPECT_THROW(SentinelResolver{o}, InvalidArgument);
}

// --- real processes ---------------------------------------------------------------------------

namespace {

#define REQUIRE_REDIS_SERVER()                                                                        \
  do {                                                                                                \
    if (!have_redis_server()) GTEST_SKIP() << "redis-server is not on PATH: live Sentinel tests skipped"; \
  } while (0)

LinkOptions test_link() {
  LinkOptions o;
  // Generous for a sanitizer build on a busy 2-core machine; the tests never time these.
  o.connect_timeout = milliseconds(2000);
  o.command_timeout = milliseconds(2000);
  return o;
}

// Polls `done` every 20 ms until it holds or `limit` passes; true when it held.
bool eventually(const std::function<bool()>& done, std::chrono::steady_clock::duration limit = seconds(30)) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  for (;;) {
    try {
      if (done()) return true;
    } catch (const Error&) {
      // not up yet
    }
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(milliseconds(20));  // a readiness poll, not a wait for an event
  }
}

Reply ask(int port, const std::vector<std::string>& args) {
  ControlLink link({"127.0.0.1", port}, test_link());
  return link.call(args);
}

std::string reply_text(const Reply& r) {
  std::string out;
  if (r.type == Reply::Type::Array) {
    for (const auto& e : r.elements) out += reply_text(e) + " ";
  } else if (r.type == Reply::Type::Integer) {
    out += std::to_string(r.integer);
  } else {
    out += r.str;
  }
  return out;
}

class TempDir {
 public:
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "redcount-sentinel-XXXXXX").string();
    if (::mkdtemp(tmpl.data())) path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ignored;
    if (!path_.empty()) fs::remove_all(path_, ignored);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

// A master, one replica and three sentinels monitoring them as service "mymaster".
class Topology {
 public:
  static constexpr const char* kService = "mymaster";

  Topology() {
    if (dir_.path().empty()) {
      error_ = "mkdtemp failed";
      return;
    }
    master_ = start_data_node({});
    if (!master_) return;
    replica_ = start_data_node({"--replicaof", "127.0.0.1", std::to_string(master_->port())});
    if (!replica_) return;
    if (!eventually([&] { return contains(ask(replica_->port(), {"INFO", "replication"}).str, "master_link_status:up"); })) {
      error_ = "the replica did not sync with the master:\n" + replica_->log();
      return;
    }
    for (int i = 0; i < 3; ++i) {
      if (!start_sentinel()) return;
    }
    // Each sentinel knows the replica (so a failover has a candidate) and the other two
    // (so a switch one of them makes reaches the others).
    for (auto& s : sentinels_) {
      const int port = s->port();
      const bool ok = eventually([&] {
        const Reply replicas = ask(port, {"SENTINEL", "REPLICAS", kService});
        const Reply others = ask(port, {"SENTINEL", "SENTINELS", kService});
        return replicas.type == Reply::Type::Array && replicas.elements.size() == 1 &&
               others.type == Reply::Type::Array && others.elements.size() == 2;
      });
      if (!ok) {
        error_ = "sentinel " + std::to_string(port) + " did not discover the replica and its peers:\n" + s->log();
        return;
      }
    }
  }

  bool ok() const { return error_.empty(); }
  const std::string& error() const { return error_; }
  ServerProcess& master() { return *master_; }
  ServerProcess& replica() { return *replica_; }
  ServerProcess& sentinel(std::size_t i) { return *sentinels_.at(i); }
  std::vector<Address> sentinel_addresses() const {
    std::vector<Address> out;
    for (const auto& s : sentinels_) out.push_back(s->address());
    return out;
  }
  SentinelOptions options() const {
    SentinelOptions o;
    o.sentinels = sentinel_addresses();
    o.service = kService;
    o.link = test_link();
    return o;
  }

  // An extra sentinel with requirepass, monitoring the same master (not part of the trio).
  std::unique_ptr<ServerProcess> start_password_sentinel(const std::string& password) {
    return start_sentinel_process([&](int) { return std::vector<std::string>{"requirepass " + password}; },
                                  test_link());
  }

  // An extra sentinel that accepts TLS only (certificates from make_certs.sh in `certs`),
  // monitoring the same (plain) master. `probe`: how to reach it to see it is up.
  std::unique_ptr<ServerProcess> start_tls_sentinel(const fs::path& certs, const LinkOptions& probe) {
    return start_sentinel_process(
        [&](int port) {
          return std::vector<std::string>{"port 0",
                                          "tls-port " + std::to_string(port),
                                          "tls-cert-file " + (certs / "server.pem").string(),
                                          "tls-key-file " + (certs / "server.key").string(),
                                          "tls-ca-cert-file " + (certs / "ca.pem").string(),
                                          "tls-auth-clients no"};
        },
        probe);
  }

  // An extra sentinel for service kService. `monitored_port`: the data node it is told is
  // the master (0: the topology's master); `extra`: more configuration lines (a
  // `sentinel config-epoch`, say).
  std::unique_ptr<ServerProcess> start_extra_sentinel(int monitored_port = 0, std::vector<std::string> extra = {}) {
    return start_sentinel_process([&](int) { return extra; }, test_link(), monitored_port);
  }

  // A standalone server outside the group.
  std::unique_ptr<ServerProcess> start_lone_server() { return start_data_node({}); }

  const fs::path& dir() const { return dir_.path(); }

 private:
  std::unique_ptr<ServerProcess> start_data_node(std::vector<std::string> extra) {
    for (int attempt = 0; attempt < 3; ++attempt) {
      const int port = free_port();
      const fs::path log = dir_.path() / ("redis-" + std::to_string(port) + ".log");
      std::vector<std::string> args = {"redis-server", "--port", std::to_string(port), "--bind", "127.0.0.1",
                                       "--save", "", "--appendonly", "no", "--dir", dir_.path().string(),
                                       "--dbfilename", "dump-" + std::to_string(port) + ".rdb",
                                       "--repl-diskless-sync-delay", "0", "--logfile", log.string()};
      args.insert(args.end(), extra.begin(), extra.end());
      auto p = std::make_unique<ServerProcess>(std::move(args), port, log);
      if (ready(*p)) return p;
      error_ = "redis-server did not start on port " + std::to_string(port) + ":\n" + p->log();
    }
    return nullptr;
  }

  std::unique_ptr<ServerProcess> start_sentinel_process(const std::function<std::vector<std::string>(int)>& extra_config,
                                                  const LinkOptions& probe, int monitored_port = 0) {
    if (monitored_port == 0) monitored_port = master_->port();
    for (int attempt = 0; attempt < 3; ++attempt) {
      const int port = free_port();
      const fs::path conf = dir_.path() / ("sentinel-" + std::to_string(port) + ".conf");
      const fs::path log = dir_.path() / ("sentinel-" + std::to_string(port) + ".log");
      {
        std::ofstream out(conf);
        out << "port " << port << "\nbind 127.0.0.1\ndir " << dir_.path().string() << "\nlogfile "
            << log.string() << "\nsentinel monitor " << kService << " 127.0.0.1 " << monitored_port
            << " 2\nsentinel down-after-milliseconds " << kService << " 2000\nsentinel failover-timeout "
            << kService << " 10000\n";
        for (const auto& line : extra_config(port)) out << line << "\n";
      }
      auto p = std::make_unique<ServerProcess>(
          std::vector<std::string>{"redis-server", conf.string(), "--sentinel"}, port, log);
      if (ready(*p, probe)) return p;
      error_ = "redis-server --sentinel did not start on port " + std::to_string(port) + ":\n" + p->log();
    }
    return nullptr;
  }

  bool start_sentinel() {
    auto p = start_sentinel_process([](int) { return std::vector<std::string>{}; }, test_link());
    if (!p) return false;
    sentinels_.push_back(std::move(p));
    return true;
  }

  // Ready when it accepts a connection (PING may need AUTH: any reply will do).
  bool ready(ServerProcess& p, const LinkOptions& probe = test_link()) {
    return eventually(
        [&] {
          if (p.exited()) throw std::runtime_error("exited");
          ControlLink(p.address(), probe).call({"PING"});
          return true;
        },
        seconds(10));
  }

  TempDir dir_;
  std::string error_;
  std::unique_ptr<ServerProcess> master_, replica_;
  std::vector<std::unique_ptr<ServerProcess>> sentinels_;
};

#define REQUIRE_TOPOLOGY(t)            \
  do {                                 \
    if (!(t).ok()) FAIL() << (t).error(); \
  } while (0)

// Collects the watcher's callbacks.
class Switches {
 public:
  SwitchMasterWatcher::Callback callback() {
    return [this](const Address& a) {
      std::lock_guard lock(mu_);
      seen_.push_back(a);
      cv_.notify_all();
    };
  }
  // Waits (bounded) until `a` has been reported.
  bool wait_for(const Address& a, seconds limit = seconds(40)) {
    std::unique_lock lock(mu_);
    return cv_.wait_for(lock, limit, [&] { return std::find(seen_.begin(), seen_.end(), a) != seen_.end(); });
  }
  std::vector<Address> seen() {
    std::lock_guard lock(mu_);
    return seen_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Address> seen_;
};

// Forces a failover through `sentinel_port`, retrying while Sentinel has no replica it
// considers good yet (NOGOODSLAVE) or a previous failover is still in progress (INPROG).
std::string force_failover(int sentinel_port) {
  std::string last;
  const bool ok = eventually([&] {
    const Reply r = ask(sentinel_port, {"SENTINEL", "FAILOVER", Topology::kService});
    last = r.str;
    return !r.is_error();
  });
  return ok ? "" : last;
}

}  // namespace

TEST(Sentinel, ResolvesTheMasterAndChecksRoles) {
  REQUIRE_REDIS_SERVER();
  Topology t;
  REQUIRE_TOPOLOGY(t);
  SentinelResolver resolver(t.options());
  EXPECT_EQ(resolver.resolve(), t.master().address());
  EXPECT_EQ(resolver.sentinels(), t.sentinel_addresses());  // the first answered: order unchanged

  EXPECT_EQ(probe_role(t.master().address(), test_link()), Role::Master);
  EXPECT_EQ(probe_role(t.replica().address(), test_link()), Role::Replica);
  EXPECT_EQ(probe_role(t.sentinel(0).address(), test_link()), Role::Sentinel);

  // The handshake form: ROLE on a connected socket, then expect_master().
  ControlLink master(t.master().address(), test_link());
  EXPECT_NO_THROW(expect_master(master.call(role_command().args), t.master().address().text()));
  ControlLink replica(t.replica().address(), test_link());
  EXPECT_THROW(expect_master(replica.call(role_command().args), t.replica().address().text()),
               ConnectionError);
}

TEST(Sentinel, UnknownServiceAndSentinelPasswords) {
  REQUIRE_REDIS_SERVER();
  Topology t;
  REQUIRE_TOPOLOGY(t);
  SentinelOptions o = t.options();
  o.service = "no-such-service";
  try {
    SentinelResolver(o).resolve();
    FAIL() << "resolved an unknown service";
  } catch (const AuthenticationError& e) {
    FAIL() << e.what();
  } catch (const ConnectionError& e) {
    EXPECT_FALSE(e.maybe_applied());
    EXPECT_TRUE(contains(e.what(), "knows no master named 'no-such-service'")) << e.what();
  }

  auto guarded = t.start_password_sentinel("s3cret-pw");
  ASSERT_TRUE(guarded) << t.error();
  SentinelOptions p = t.options();
  p.sentinels = {guarded->address()};
  p.link.password = "wrong-pw";
  try {
    SentinelResolver(p).resolve();
    FAIL() << "resolved with a wrong sentinel password";
  } catch (const AuthenticationError& e) {
    EXPECT_FALSE(contains(e.what(), "wrong-pw")) << e.what();
    EXPECT_TRUE(contains(e.what(), guarded->address().text())) << e.what();
  }
  p.link.password = "s3cret-pw";
  EXPECT_EQ(SentinelResolver(p).resolve(), t.master().address());
}

TEST(Sentinel, SkipsDeadSentinelsAndMovesTheAnswererToTheFront) {
  REQUIRE_REDIS_SERVER();
  Topology t;
  REQUIRE_TOPOLOGY(t);
  const std::vector<Address> trio = t.sentinel_addresses();

  // Nothing listens on the first address: the second answers and goes to the front.
  SentinelOptions o = t.options();
  const Address nobody{"127.0.0.1", free_port()};
  o.sentinels = {nobody, trio[0], trio[1]};
  SentinelResolver resolver(o);
  EXPECT_EQ(resolver.resolve(), t.master().address());
  EXPECT_EQ(resolver.sentinels(), (std::vector<Address>{trio[0], nobody, trio[1]}));

  // Now the front one dies too: the last answers and is moved to the front.
  t.sentinel(0).kill();
  EXPECT_EQ(resolver.resolve(), t.master().address());
  EXPECT_EQ(resolver.sentinels(), (std::vector<Address>{trio[1], trio[0], nobody}));

  // None answers: one ConnectionError naming every sentinel.
  t.sentinel(1).kill();
  try {
    resolver.resolve();
    FAIL();
  } catch (const ConnectionError& e) {
    for (const auto& a : {nobody, trio[0], trio[1]}) EXPECT_TRUE(contains(e.what(), a.text())) << e.what();
  }
}

// Clients of the sentinel at `port` subscribed to the watcher's channels (CLIENT LIST's
// sub=N, N the number of channels).
int subscribers(int port) {
  const std::string list = reply_text(ask(port, {"CLIENT", "LIST"}));
  const std::string field = " sub=" + std::to_string(SwitchMasterWatcher::channels().size()) + " ";
  int n = 0;
  for (std::size_t at = list.find(field); at != std::string::npos; at = list.find(field, at + 1)) ++n;
  return n;
}

TEST(Sentinel, WatcherSubscribesOnEverySentinelAndFollowsWhenOneDies) {
  REQUIRE_REDIS_SERVER();
  Topology t;
  REQUIRE_TOPOLOGY(t);
  auto resolver = std::make_shared<SentinelResolver>(t.options());
  const Address old_master = resolver->resolve();
  ASSERT_EQ(old_master, t.master().address());

  Switches switches;
  SwitchMasterWatcher watcher(resolver, switches.callback(), milliseconds(200));
  watcher.start(old_master);
  ASSERT_TRUE(eventually([&] { return watcher.subscriptions() == 3; })) << "the watcher did not subscribe on all three";
  EXPECT_EQ(watcher.subscribed(), t.sentinel_addresses());
  EXPECT_EQ(watcher.subscribed_to(), t.sentinel(0).address());
  // Each sentinel sees the subscriber.
  for (std::size_t i = 0; i < 3; ++i) EXPECT_EQ(subscribers(t.sentinel(i).port()), 1) << "sentinel " << i;
  EXPECT_TRUE(switches.seen().empty()) << "the known master was reported again";

  // A sentinel dies: the other two links keep serving; the first live one is promoted.
  t.sentinel(0).kill();
  ASSERT_TRUE(eventually([&] {
    return watcher.subscribed() == std::vector<Address>{t.sentinel(1).address(), t.sentinel(2).address()};
  })) << "the lost link was not noticed";
  EXPECT_EQ(watcher.subscribed_to(), t.sentinel(1).address());
  EXPECT_EQ(resolver->sentinels().front(), t.sentinel(1).address());

  // A forced failover: the callback gets the promoted replica's address (from the failover
  // hold's probe, before the sentinels announce it), once although two sentinels announce it
  // afterwards, on the links already held (no new subscription).
  const std::string refused = force_failover(t.sentinel(1).port());
  ASSERT_EQ(refused, "") << "SENTINEL FAILOVER kept failing";
  ASSERT_TRUE(switches.wait_for(t.replica().address())) << "no switch callback";
  EXPECT_EQ(watcher.subscriptions(), 3u);
  EXPECT_TRUE(eventually([&] { return resolver->resolve() == t.replica().address(); }));

  // ROLE after the switch: the promoted replica says master. (Sentinel demotes the old
  // master only at its next INFO poll, about 10 s later; the refusal of a replica by
  // expect_master() is covered above, so the suite does not wait for it.)
  EXPECT_EQ(probe_role(t.replica().address(), test_link()), Role::Master);
  ControlLink promoted(t.replica().address(), test_link());
  EXPECT_NO_THROW(expect_master(promoted.call(role_command().args), t.replica().address().text()));
  // Both live sentinels have announced the switch by now (the leader last, once it moved
  // the replicas: there are none left to move).
  EXPECT_TRUE(eventually([&] {
    return reply_text(ask(t.sentinel(2).port(), {"SENTINEL", "get-master-addr-by-name", Topology::kService})) ==
           reply_text(ask(t.sentinel(1).port(), {"SENTINEL", "get-master-addr-by-name", Topology::kService}));
  }));

  watcher.stop();
  EXPECT_EQ(switches.seen(), std::vector<Address>{t.replica().address()});
  EXPECT_EQ(watcher.subscribed_to(), std::nullopt);
  EXPECT_TRUE(watcher.subscribed().empty());
}

// The failover hold: on Sentinel's `+selected-slave` the watcher holds, probes the replica's
// ROLE and reports it the moment it is master, before any sentinel announces the switch; a
// re-resolution asked for right then (the sentinels still name the old master until the
// failover ends) does not move it back.
TEST(Sentinel, WatcherHoldsFromTheSelectionAndFollowsThePromotedReplicaFirst) {
  REQUIRE_REDIS_SERVER();
  Topology t;
  REQUIRE_TOPOLOGY(t);
  auto resolver = std::make_shared<SentinelResolver>(t.options());
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::string> events;
  std::string named_at_switch;  // what a sentinel said the master was when the watcher switched
  const auto record = [&](std::string e) {
    std::lock_guard lock(mu);
    events.push_back(std::move(e));
    cv.notify_all();
  };
  SwitchMasterWatcher watcher(
      resolver,
      [&](const Address& a) {
        named_at_switch = reply_text(ask(t.sentinel(0).port(), {"SENTINEL", "get-master-addr-by-name", Topology::kService}));
        record("switch " + a.text());
      },
      milliseconds(200), [&](bool on) { record(on ? "hold" : "release"); });
  watcher.start(t.master().address());
  ASSERT_TRUE(eventually([&] { return watcher.subscriptions() == 3; }));

  ASSERT_EQ(force_failover(t.sentinel(0).port()), "") << "SENTINEL FAILOVER kept failing";
  {
    std::unique_lock lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, seconds(20), [&] { return events.size() >= 3; })) << events.size();
  }
  EXPECT_EQ(events, (std::vector<std::string>{"hold", "switch " + t.replica().address().text(), "release"}));
  EXPECT_EQ(watcher.holds(), 1u);
  EXPECT_EQ(watcher.early_switches(), 1u);
  // Reported before the sentinel that ran the failover (it announces last) named the replica.
  EXPECT_TRUE(contains(named_at_switch, std::to_string(t.master().port()))) << named_at_switch;

  // Asked now, the sentinels still name the old master: that answer is not followed.
  watcher.request_resolve();
  ASSERT_TRUE(eventually([&] {
    return reply_text(ask(t.sentinel(0).port(), {"SENTINEL", "get-master-addr-by-name", Topology::kService})) ==
           reply_text(ask(t.sentinel(2).port(), {"SENTINEL", "get-master-addr-by-name", Topology::kService})) &&
           contains(reply_text(ask(t.sentinel(0).port(), {"SENTINEL", "get-master-addr-by-name", Topology::kService})),
                    std::to_string(t.replica().port()));
  })) << "the sentinels did not finish the failover";
  watcher.request_resolve();  // and once they name the new master, a resolution is a no-op
  std::this_thread::sleep_for(milliseconds(300));
  watcher.stop();
  std::lock_guard lock(mu);
  EXPECT_EQ(events, (std::vector<std::string>{"hold", "switch " + t.replica().address().text(), "release"}));
}

TEST(Sentinel, WatcherHoldsFiveSubscriptionsAndFallsBackToTheNextSentinel) {
  REQUIRE_REDIS_SERVER();
  Topology t;
  REQUIRE_TOPOLOGY(t);
  static_assert(SwitchMasterWatcher::kMaxLinks == 5);
  std::vector<std::unique_ptr<ServerProcess>> extra;  // the 4th, 5th and 6th sentinels
  SentinelOptions o = t.options();
  for (int i = 0; i < 3; ++i) {
    extra.push_back(t.start_extra_sentinel());
    ASSERT_TRUE(extra.back()) << t.error();
    o.sentinels.push_back(extra.back()->address());
  }
  auto resolver = std::make_shared<SentinelResolver>(o);
  Switches switches;
  SwitchMasterWatcher watcher(resolver, switches.callback(), milliseconds(200));
  watcher.start(t.master().address());
  ASSERT_TRUE(eventually([&] { return watcher.subscriptions() == SwitchMasterWatcher::kMaxLinks; }));
  std::vector<Address> five = t.sentinel_addresses();
  five.push_back(extra[0]->address());
  five.push_back(extra[1]->address());
  EXPECT_EQ(watcher.subscribed(), five);
  EXPECT_EQ(subscribers(extra[2]->port()), 0);

  // One of the five dies: the sixth takes its place.
  t.sentinel(1).kill();
  ASSERT_TRUE(eventually([&] {
    return watcher.subscribed() == std::vector<Address>{t.sentinel(0).address(), t.sentinel(2).address(),
                                                        extra[0]->address(), extra[1]->address(),
                                                        extra[2]->address()};
  })) << "the fallback sentinel was not subscribed";
  EXPECT_EQ(watcher.subscriptions(), 6u);
  EXPECT_EQ(subscribers(extra[2]->port()), 1);
  watcher.stop();
  EXPECT_TRUE(switches.seen().empty());
  EXPECT_EQ(subscribers(extra[2]->port()), 0);
}

TEST(Sentinel, WatcherIgnoresALaggingSentinelsOlderMaster) {
  REQUIRE_REDIS_SERVER();
  Topology t;
  REQUIRE_TOPOLOGY(t);
  // A sentinel that says the master is elsewhere, at config epoch 0 (as one that missed a
  // failover would), and one that names the real master at epoch 7.
  auto elsewhere = t.start_lone_server();
  ASSERT_TRUE(elsewhere) << t.error();
  auto lagging = t.start_extra_sentinel(elsewhere->port());
  ASSERT_TRUE(lagging) << t.error();
  auto current = t.start_extra_sentinel(0, {std::string("sentinel config-epoch ") + Topology::kService + " 7"});
  ASSERT_TRUE(current) << t.error();
  ASSERT_TRUE(eventually([&] {
    const Reply r = ask(current->port(), {"SENTINEL", "MASTER", Topology::kService});
    return contains(reply_text(r), "config-epoch 7 ");
  })) << "the epoch-7 sentinel did not take its configured epoch";

  {  // Alone, the lagging sentinel moves the watcher: nothing newer is known.
    SentinelOptions o = t.options();
    o.sentinels = {lagging->address()};
    Switches switches;
    SwitchMasterWatcher watcher(std::make_shared<SentinelResolver>(o), switches.callback());
    watcher.start(t.master().address());
    EXPECT_TRUE(switches.wait_for(elsewhere->address()));
  }
  // Subscribed to the current one first (epoch 7): the lagging one's answer (epoch 0) is
  // ignored, whichever link comes up later.
  SentinelOptions o = t.options();
  o.sentinels = {current->address(), lagging->address()};
  Switches switches;
  SwitchMasterWatcher watcher(std::make_shared<SentinelResolver>(o), switches.callback());
  watcher.start(t.master().address());
  ASSERT_TRUE(eventually([&] { return watcher.subscriptions() == 2; }));
  EXPECT_EQ(watcher.subscribed(), o.sentinels);
  watcher.stop();
  EXPECT_TRUE(switches.seen().empty()) << "moved to " << switches.seen().front().text();
}

TEST(Sentinel, WatcherReportsASwitchItMissedWhileDisconnected) {
  REQUIRE_REDIS_SERVER();
  Topology t;
  REQUIRE_TOPOLOGY(t);
  auto resolver = std::make_shared<SentinelResolver>(t.options());
  // Told of a stale master (as if it had been down during a switch): the first thing it
  // reports is the master the sentinels know.
  Switches switches;
  SwitchMasterWatcher watcher(resolver, switches.callback());
  watcher.start(Address{"127.0.0.1", 1});
  EXPECT_TRUE(switches.wait_for(t.master().address()));
  watcher.stop();
  watcher.stop();  // idempotent
}

TEST(Sentinel, ResolvesOverTls) {
  REQUIRE_REDIS_SERVER();
  Topology t;
  REQUIRE_TOPOLOGY(t);
  // __FILE__ is this source's absolute path (CMake passes absolute paths to the compiler).
  const fs::path script = fs::path(__FILE__).parent_path().parent_path() / "tls" / "make_certs.sh";
  const fs::path certs = t.dir() / "certs";
  const std::string cmd = "bash '" + script.string() + "' '" + certs.string() + "' > '" +
                          (t.dir() / "make_certs.log").string() + "' 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << "tests/tls/make_certs.sh failed (is the openssl CLI installed?)";

  StoreOptions tls_store;
  tls_store.kind = StoreOptions::Kind::Tcp;
  tls_store.tls = true;
  tls_store.ssl_ca_certs = (certs / "ca.pem").string();
  LinkOptions link = test_link();
  link.tls = make_tls_context(tls_store);
  auto sentinel = t.start_tls_sentinel(certs, link);
  ASSERT_TRUE(sentinel) << t.error();

  SentinelOptions o = t.options();
  o.sentinels = {sentinel->address()};
  o.link = link;
  EXPECT_EQ(SentinelResolver(o).resolve(), t.master().address());

  // A certificate from a CA the client does not trust: refused, and said so.
  StoreOptions other = tls_store;
  other.ssl_ca_certs = (certs / "other-ca.pem").string();
  o.link.tls = make_tls_context(other);
  try {
    SentinelResolver(o).resolve();
    FAIL() << "trusted a certificate from an unknown CA";
  } catch (const ConnectionError& e) {
    EXPECT_TRUE(contains(e.what(), sentinel->address().text())) << e.what();
  }
  // And a plain client is not answered by the TLS port.
  o.link = test_link();
  o.link.connect_timeout = o.link.command_timeout = milliseconds(300);
  EXPECT_THROW(SentinelResolver(o).resolve(), ConnectionError);
}

TEST(Sentinel, WatcherReResolvesOnRequest) {
  REQUIRE_REDIS_SERVER();
  Topology t;
  REQUIRE_TOPOLOGY(t);
  SentinelOptions o = t.options();
  o.sentinels = {t.sentinel(0).address()};
  auto resolver = std::make_shared<SentinelResolver>(o);
  Switches switches;
  SwitchMasterWatcher watcher(resolver, switches.callback());
  watcher.start(t.master().address());
  ASSERT_TRUE(eventually([&] { return watcher.subscriptions() == 1; })) << "the watcher never subscribed";

  // The sentinel is re-pointed at the replica without a failover, so no +switch-master is
  // published (as for an event lost in transit): only a re-resolve finds the change.
  ASSERT_FALSE(ask(t.sentinel(0).port(), {"SENTINEL", "REMOVE", Topology::kService}).is_error());
  ASSERT_FALSE(ask(t.sentinel(0).port(), {"SENTINEL", "MONITOR", Topology::kService, "127.0.0.1",
                                          std::to_string(t.replica().port()), "2"})
                   .is_error());
  watcher.request_resolve();
  watcher.request_resolve();  // coalesced with the first
  ASSERT_TRUE(switches.wait_for(t.replica().address())) << "the requested re-resolve reported nothing";
  watcher.request_resolve();  // the same master again: not reported twice
  EXPECT_TRUE(eventually([&] { return resolver->resolve() == t.replica().address(); }));
  watcher.stop();
  EXPECT_EQ(switches.seen(), std::vector<Address>{t.replica().address()});
}

TEST(Sentinel, StoreFollowsAForcedFailover) {
  REQUIRE_REDIS_SERVER();
  Topology t;
  REQUIRE_TOPOLOGY(t);
  std::string url = "redis+sentinel://";
  for (const auto& a : t.sentinel_addresses()) url += a.text() + ",";
  url.back() = '/';
  url += Topology::kService;
  RedisStore store(parse_url(url));
  EXPECT_TRUE(store.is_sentinel());
  EXPECT_EQ(store.sentinel_master(), "");  // nothing asked before the first call

  const Command incr{{"INCR", "followed"}};
  EXPECT_EQ(store.execute_one(incr).integer, 1);
  EXPECT_EQ(store.sentinel_master(), t.master().address().text());
  EXPECT_EQ(store.sentinel_switches(), 0u);

  const std::string refused = force_failover(t.sentinel(0).port());
  ASSERT_EQ(refused, "") << "SENTINEL FAILOVER kept failing";
  // The store's watcher follows +switch-master; new calls go to the promoted replica, which
  // has the count (replicated) and its own copy of the scripts (loaded in the handshake).
  ASSERT_TRUE(eventually([&] { return store.sentinel_switches() == 1; })) << "the store did not follow";
  EXPECT_EQ(store.sentinel_master(), t.replica().address().text());
  EXPECT_EQ(store.execute_one(incr).integer, 2);
  EXPECT_EQ(reply_text(ask(t.replica().port(), {"GET", "followed"})), "2");
  // The old engine had no call inside it: its connection is closed, only the new one is open.
  EXPECT_TRUE(eventually([&] { return store.open_connections() == 1; }));
  store.close();
  EXPECT_THROW(store.execute_one(incr), StoreClosed);
}
