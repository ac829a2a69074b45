// Redis Cluster support: hash slots, key positions, the cut of a batch into units and
// children (ASKING placement), redirect parsing, the cluster URL; and, against a real
// cluster named by REDCOUNT_TEST_CLUSTER_URL (redis+cluster://host:port,...), the split
// and reassembly, ASK during a slot's migration (also inside MULTI), MOVED after it, the
// refusals, and replies that arrive after their call timed out.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <functional>
#include <mutex>

#include <cstdlib>
#include <future>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "redcount/common/slot.h"
#include "redcount/common/util.h"
#include "redcount/common/errors.h"
#include "redcount/common/options.h"
#include "redcount/redis/topology/cluster.h"
#include "redcount/redis/topology/command_keys.h"
#include "redcount/redis/redis_store.h"
#include "redcount/store/store.h"

namespace redcount {
namespace {

using redis::build_child;
using redis::kAnySlot;
using redis::parse_cluster_slots;
using redis::parse_redirect;
using redis::route_units;
using redis::Unit;

Request cmd(std::vector<std::string> args) { return Command{std::move(args)}; }

TEST(Slot, Crc16AndHashTags) {
  EXPECT_EQ(crc16("123456789"), 0x31C3);
  EXPECT_EQ(key_slot("foo"), 12182u);
  EXPECT_EQ(key_slot("{user1000}.following"), 3443u);
  EXPECT_EQ(key_slot("{user1000}.followers"), 3443u);
  EXPECT_EQ(key_slot("foo{}{bar}"), 8363u);   // an empty tag: the whole key is hashed
  EXPECT_EQ(key_slot("foo{{bar}}"), 4015u);   // the tag is "{bar"
  EXPECT_EQ(key_slot("foo{bar}{zap}"), key_slot("bar"));
  EXPECT_EQ(hash_tag("a{b}c"), "b");
  EXPECT_EQ(hash_tag("a{b"), "a{b");
  EXPECT_EQ(key_slot(""), 0u);
}

std::vector<std::string> keys_for(std::vector<std::string> args) {
  const Request r = cmd(std::move(args));
  std::vector<std::string_view> views;
  redis::keys_of(r, views);
  return {views.begin(), views.end()};
}

redis::KeyRole role_of(std::vector<std::string> args) {
  std::vector<std::string_view> views;
  return redis::keys_of(cmd(std::move(args)), views);
}

using Keys = std::vector<std::string>;

TEST(CommandKeys, Positions) {
  EXPECT_EQ(role_of({"INCRBY", "k", "1"}), redis::KeyRole::Keyed);
  EXPECT_EQ(keys_for({"INCRBY", "k", "1"}), Keys{"k"});
  EXPECT_EQ(keys_for({"MSET", "a", "1", "b", "2"}), (Keys{"a", "b"}));
  EXPECT_EQ(keys_for({"EVAL", "return 1", "2", "x", "y", "argv"}), (Keys{"x", "y"}));
  EXPECT_EQ(keys_for({"XREADGROUP", "GROUP", "g", "c", "COUNT", "10", "STREAMS", "s1", "s2", ">", ">"}),
            (Keys{"s1", "s2"}));
  EXPECT_EQ(keys_for({"XGROUP", "CREATE", "stream", "g", "$", "MKSTREAM"}), Keys{"stream"});
  EXPECT_EQ(keys_for({"XAUTOCLAIM", "s", "g", "c", "0", "0-0"}), Keys{"s"});
  EXPECT_EQ(keys_for({"XPENDING", "s", "g"}), Keys{"s"});
  EXPECT_EQ(keys_for({"ZUNIONSTORE", "d", "2", "a", "b"}), (Keys{"d", "a", "b"}));
  EXPECT_EQ(role_of({"time"}), redis::KeyRole::JoinAfter);
  EXPECT_EQ(role_of({"WAIT", "1", "0"}), redis::KeyRole::JoinBefore);
  EXPECT_EQ(role_of({"KEYS", "*"}), redis::KeyRole::NodeOnly);
  EXPECT_EQ(role_of({"FROBNICATE", "x"}), redis::KeyRole::Unknown);
}

TEST(CommandKeys, KeylessCommandsAttachToNeighbours) {
  // [TIME, INCR a, WAIT, PING, INCR b, MULTI, INCR {b}x, EXEC, WAIT]
  std::vector<Request> batch{cmd({"TIME"}),         cmd({"INCR", "a"}), cmd({"WAIT", "1", "0"}),
                             cmd({"PING"}),         cmd({"INCR", "b"}), cmd({"MULTI"}),
                             cmd({"INCR", "{b}x"}), cmd({"EXEC"}),      cmd({"WAIT", "1", "0"})};
  auto units = route_units(batch);
  ASSERT_EQ(units.size(), 3u);
  EXPECT_EQ(units[0].begin, 0u);  // TIME joins the write after it
  EXPECT_EQ(units[0].end, 4u);    // WAIT and PING join the write before them
  EXPECT_EQ(units[0].ask_at, 1u);
  EXPECT_EQ(units[0].slot, static_cast<std::int32_t>(key_slot("a")));
  EXPECT_EQ(units[1].begin, 4u);
  EXPECT_EQ(units[1].end, 5u);
  EXPECT_EQ(units[2].begin, 5u);  // the transaction, with the WAIT after it
  EXPECT_EQ(units[2].end, 9u);
  EXPECT_EQ(units[2].ask_at, 5u);  // ASKING goes before MULTI
  EXPECT_TRUE(units[2].transaction);
  EXPECT_EQ(units[2].slot, static_cast<std::int32_t>(key_slot("b")));

  // Names in any case; the slot of a key repeated by the next request is the same slot.
  auto mixed = route_units({cmd({"multi"}), cmd({"IncrBy", "k", "1"}), cmd({"pexpireat", "k", "9", "LT"}),
                            cmd({"Exec"}), cmd({"get", "other"}), cmd({"EvalSha", "x", "1", "k"})});
  ASSERT_EQ(mixed.size(), 3u);
  EXPECT_TRUE(mixed[0].transaction);
  EXPECT_EQ(mixed[0].end, 4u);
  EXPECT_EQ(mixed[0].slot, static_cast<std::int32_t>(key_slot("k")));
  EXPECT_EQ(mixed[1].slot, static_cast<std::int32_t>(key_slot("other")));
  EXPECT_EQ(mixed[2].slot, static_cast<std::int32_t>(key_slot("k")));
  EXPECT_THROW(route_units({cmd({"Multi"}), cmd({"INCR", "a"}), cmd({"INCR", "b"}), cmd({"exec"})}), InvalidArgument);

  auto keyless = route_units({cmd({"PING"}), cmd({"TIME"})});
  ASSERT_EQ(keyless.size(), 1u);
  EXPECT_EQ(keyless[0].slot, kAnySlot);
  EXPECT_EQ(keyless[0].end, 2u);
}

TEST(CommandKeys, RefusalsNameKeysSlotsAndCommands) {
  static const Script s{"two_keys", "return 1", "0000000000000000000000000000000000000000", nullptr};
  try {
    route_units({ScriptCall{&s, {"foo", "bar"}, {}}});
    FAIL() << "a cross-slot script call was accepted";
  } catch (const InvalidArgument& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("two_keys"), std::string::npos) << m;
    EXPECT_NE(m.find("'foo' -> slot 12182"), std::string::npos) << m;
    EXPECT_NE(m.find("'bar' -> slot 5061"), std::string::npos) << m;
  }
  EXPECT_NO_THROW(route_units({ScriptCall{&s, {"{t}foo", "{t}bar"}, {}}}));
  EXPECT_THROW(route_units({cmd({"MULTI"}), cmd({"INCR", "foo"}), cmd({"INCR", "bar"}), cmd({"EXEC"})}),
               InvalidArgument);
  EXPECT_THROW(route_units({cmd({"MGET", "foo", "bar"})}), InvalidArgument);
  try {
    route_units({cmd({"FROBNICATE", "x"})});
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("FROBNICATE"), std::string::npos);
  }
  for (const char* c : {"KEYS", "SCAN", "DBSIZE", "FLUSHALL", "INFO"}) {
    try {
      route_units({cmd({c, "0"})});
      FAIL() << c;
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("nodes()"), std::string::npos) << e.what();
    }
  }
}

TEST(CommandKeys, AskingIsWrittenImmediatelyBeforeTheRedirectedRequest) {
  std::vector<Request> batch{cmd({"TIME"}), cmd({"INCR", "a"}), cmd({"INCR", "b"}), cmd({"MULTI"}),
                             cmd({"INCR", "a"}), cmd({"EXEC"})};
  auto units = route_units(batch);
  ASSERT_EQ(units.size(), 3u);
  // Units 0 (TIME, INCR a) and 2 (the transaction) were redirected by ASK; unit 1 was not.
  auto child = build_child(batch, units, {0, 1, 2}, {1, 0, 1});
  std::vector<std::string> names;
  for (const auto& r : child.requests) names.push_back(std::get<Command>(r).args[0]);
  EXPECT_EQ(names, (std::vector<std::string>{"TIME", "ASKING", "INCR", "INCR", "ASKING", "MULTI", "INCR", "EXEC"}));
  EXPECT_EQ(child.origin, (std::vector<std::int32_t>{0, -1, 1, 2, -1, 3, 4, 5}));
}

TEST(Redirects, Parse) {
  auto m = parse_redirect(Reply::of_error("MOVED 3999 127.0.0.1:6381"));
  ASSERT_TRUE(m);
  EXPECT_FALSE(m->ask);
  EXPECT_EQ(m->slot, 3999u);
  EXPECT_EQ(m->to.host, "127.0.0.1");
  EXPECT_EQ(m->to.port, 6381);
  auto a = parse_redirect(Reply::of_error("ASK 12182 [::1]:7002"));
  ASSERT_TRUE(a);
  EXPECT_TRUE(a->ask);
  EXPECT_EQ(a->to.host, "::1");
  EXPECT_FALSE(parse_redirect(Reply::of_error("ERR nope")));
  EXPECT_FALSE(parse_redirect(Reply::of_error("MOVED x y")));
  // A bare word (found by the RESP fuzzer: it threw std::out_of_range), or a slot without
  // an address, is no redirect.
  EXPECT_FALSE(parse_redirect(Reply::of_error("MOVED")));
  EXPECT_FALSE(parse_redirect(Reply::of_error("ASK")));
  EXPECT_FALSE(parse_redirect(Reply::of_error("MOVED ")));
  EXPECT_FALSE(parse_redirect(Reply::of_error("ASK 12")));

  auto node = [](std::string host, std::int64_t port) {
    return Reply::of_array({Reply::of_string(std::move(host)), Reply::of_integer(port), Reply::of_string("id")});
  };
  Reply slots = Reply::of_array({
      Reply::of_array({Reply::of_integer(0), Reply::of_integer(5460), node("10.0.0.1", 7000), node("10.0.0.4", 7003)}),
      Reply::of_array({Reply::of_integer(5461), Reply::of_integer(16383), node("", 7001)}),
  });
  auto ranges = parse_cluster_slots(slots, "10.0.0.9");
  ASSERT_EQ(ranges.size(), 2u);
  EXPECT_EQ(ranges[0].master.host, "10.0.0.1");  // the master, never the replica
  EXPECT_EQ(ranges[1].master.host, "10.0.0.9");  // "" = the node asked
  EXPECT_EQ(ranges[1].last, 16383u);
  ASSERT_EQ(ranges[0].replicas.size(), 1u);  // kept aside: asked for the table when the master fails
  EXPECT_EQ(ranges[0].replicas[0].text(), "10.0.0.4:7003");
  EXPECT_TRUE(ranges[1].replicas.empty());
  EXPECT_THROW(parse_cluster_slots(Reply::of_integer(1), "x"), ProtocolError);
}

TEST(ClusterUrl, Parse) {
  auto o = parse_url("redis+cluster://u:p%40ss@10.0.0.1:7000,10.0.0.2:7001,[::1]:7002");
  EXPECT_TRUE(o.cluster);
  EXPECT_FALSE(o.tls);
  ASSERT_EQ(o.seeds.size(), 3u);
  EXPECT_EQ(o.seeds[1].host, "10.0.0.2");
  EXPECT_EQ(o.seeds[2].host, "::1");
  EXPECT_EQ(o.seeds[2].port, 7002);
  EXPECT_EQ(o.username, "u");
  EXPECT_EQ(o.password, "p@ss");
  EXPECT_EQ(o.host, "10.0.0.1");
  auto t = parse_url("rediss+cluster://h:7000/0?ssl_check_hostname=false");
  EXPECT_TRUE(t.cluster);
  EXPECT_TRUE(t.tls);
  EXPECT_FALSE(t.ssl_check_hostname);
  // A database other than 0 is the server's to refuse (Redis) or serve (Valkey 9, cluster-databases).
  EXPECT_EQ(parse_url("redis+cluster://h:7000/2").db, 2);
  EXPECT_THROW(parse_url("redis://a:1,b:2"), InvalidArgument);
  EXPECT_FALSE(parse_url("redis://h:1").cluster);
  RedisStore s(parse_url("redis+cluster://127.0.0.1:1,127.0.0.1:2"));  // connects at the first call
  EXPECT_EQ(s.describe(), "redis+cluster://127.0.0.1:1,127.0.0.1:2/0");
  EXPECT_EQ(RedisStore(parse_url("redis+cluster://127.0.0.1:1/3")).describe(), "redis+cluster://127.0.0.1:1/3");
  EXPECT_EQ(s.shard_of("foo"), 12182u);
}


// ----------------------------------------------------------------------------- scripted node

// A loopback server that speaks enough RESP to be a cluster node whose answers a test
// scripts: it answers the connection handshake itself (SCRIPT LOAD refused, which the
// handshake tolerates), CLUSTER SLOTS with itself owning every slot, and logs every
// other command with the connection it came on.
class ScriptedNode {
 public:
  struct Conn {
    bool asking = false;  // the previous command was ASKING
    bool multi = false;
    bool asked_multi = false;  // ASKING came before this MULTI
    bool abort = false;
    std::vector<std::string> queued_replies;
  };
  using Handler = std::function<std::string(const std::vector<std::string>& cmd, Conn& conn)>;

  explicit ScriptedNode(Handler handler) : handler_(std::move(handler)) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    const int one = 1;
    ::setsockopt(fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(fd_, 16) != 0) {
      throw std::runtime_error("cannot listen");
    }
    socklen_t len = sizeof a;
    ::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
    acceptor_ = std::thread([this] {
      for (;;) {
        const int c = ::accept(fd_, nullptr, nullptr);
        if (c < 0) return;
        std::lock_guard<std::mutex> lock(mu_);
        if (stop_) {
          ::close(c);
          return;
        }
        conns_.push_back(c);
        threads_.emplace_back([this, c] { serve(c); });
      }
    });
  }
  ~ScriptedNode() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
      for (int c : conns_) ::shutdown(c, SHUT_RDWR);
    }
    ::shutdown(fd_, SHUT_RDWR);
    ::close(fd_);
    acceptor_.join();
    for (auto& t : threads_) t.join();
    for (int c : conns_) ::close(c);
  }
  int port() const { return port_; }
  // CLUSTER SLOTS from now on: every slot on the node at `master_port`, with replicas at
  // `replica_ports` (by default: this node owns every slot, without replicas).
  void set_slots(int master_port, std::vector<int> replica_ports = {}) {
    std::lock_guard<std::mutex> lock(mu_);
    slots_master_ = master_port;
    slots_replicas_ = std::move(replica_ports);
  }
  std::string url() const { return "redis+cluster://127.0.0.1:" + std::to_string(port_); }
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }
  // Commands received after the handshakes, each prefixed by its connection's number.
  std::vector<std::string> log() {
    std::lock_guard<std::mutex> lock(mu_);
    return log_;
  }
  int script_loads() {
    std::lock_guard<std::mutex> lock(mu_);
    return script_loads_;
  }
  int count(const std::string& name) {
    std::lock_guard<std::mutex> lock(mu_);
    int n = 0;
    for (const auto& l : log_) n += l == name ? 1 : 0;
    return n;
  }

  static std::string error(const std::string& text) { return "-" + text + "\r\n"; }
  static std::string integer(long long v) { return ":" + std::to_string(v) + "\r\n"; }

 private:
  void serve(int c) {
    std::string buf;
    Conn conn;
    char chunk[4096];
    for (;;) {
      const ssize_t n = ::read(c, chunk, sizeof chunk);
      if (n <= 0) return;
      buf.append(chunk, static_cast<std::size_t>(n));
      std::string out;
      for (;;) {
        std::vector<std::string> cmd;
        std::size_t used = parse(buf, cmd);
        if (used == 0) break;
        buf.erase(0, used);
        out += answer(cmd, conn);
      }
      if (!out.empty() && ::write(c, out.data(), out.size()) < 0) return;
    }
  }
  // One array of bulk strings from the front of `buf`; 0 when incomplete.
  static std::size_t parse(const std::string& buf, std::vector<std::string>& cmd) {
    if (buf.empty() || buf[0] != '*') return 0;
    std::size_t pos = buf.find("\r\n");
    if (pos == std::string::npos) return 0;
    const long n = std::stol(buf.substr(1, pos - 1));
    pos += 2;
    for (long i = 0; i < n; ++i) {
      const std::size_t eol = buf.find("\r\n", pos);
      if (eol == std::string::npos || buf[pos] != '$') return 0;
      const std::size_t len = std::stoul(buf.substr(pos + 1, eol - pos - 1));
      if (buf.size() < eol + 2 + len + 2) return 0;
      cmd.push_back(buf.substr(eol + 2, len));
      pos = eol + 2 + len + 2;
    }
    return pos;
  }
  std::string answer(const std::vector<std::string>& cmd, Conn& conn) {
    const std::string& name = cmd.at(0);
    if (name == "CLIENT") return "+OK\r\n";
    if (name == "INFO") {
      const std::string info = "redis_version:7.0.0\r\n";
      return "$" + std::to_string(info.size()) + "\r\n" + info + "\r\n";
    }
    if (name == "SCRIPT") {
      // One script is known, "return 1" (the handshake's loads of the others are refused,
      // which it tolerates): a test can flush it and watch the reload.
      if (cmd.size() == 3 && ascii_lower(cmd[1]) == "load" && cmd[2] == "return 1") {
        std::lock_guard<std::mutex> lock(mu_);
        ++script_loads_;
        return "$40\r\ne0e1f9fabfc9d4800c877a703b823ac0578ff8db\r\n";
      }
      return error("ERR no scripts here");
    }
    if (name == "CLUSTER") {
      const std::string host = "127.0.0.1";
      int master = port_;
      std::vector<int> replicas;
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (slots_master_ != 0) master = slots_master_;
        replicas = slots_replicas_;
      }
      auto node = [&](int port) {
        return "*3\r\n$" + std::to_string(host.size()) + "\r\n" + host + "\r\n:" + std::to_string(port) +
               "\r\n$2\r\nid\r\n";
      };
      std::string r = "*1\r\n*" + std::to_string(3 + replicas.size()) + "\r\n:0\r\n:16383\r\n" + node(master);
      for (int p : replicas) r += node(p);
      return r;
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      log_.push_back(name);
    }
    if (name == "ASKING") {
      conn.asking = true;
      return "+OK\r\n";
    }
    std::string r = handler_(cmd, conn);
    if (!conn.multi) conn.asking = false;
    return r;
  }

  Handler handler_;
  int fd_ = -1;
  int port_ = 0;
  std::thread acceptor_;
  std::mutex mu_;
  bool stop_ = false;
  std::vector<int> conns_;
  std::vector<std::thread> threads_;
  std::vector<std::string> log_;
  int script_loads_ = 0;
  int slots_master_ = 0;
  std::vector<int> slots_replicas_;
};

std::shared_ptr<RedisStore> store_for(const ScriptedNode& node, int timeout_ms = 2000) {
  auto o = parse_url(node.url());
  o.command_timeout = std::chrono::milliseconds(timeout_ms);
  return std::make_shared<RedisStore>(o);
}

TEST(ScriptedCluster, MovedIsFollowedAtMostFiveTimes) {
  int port = 0;
  ScriptedNode node([&](const std::vector<std::string>& cmd, ScriptedNode::Conn&) {
    if (cmd[0] == "GET") return ScriptedNode::error("MOVED 12182 127.0.0.1:" + std::to_string(port));
    return ScriptedNode::integer(7);
  });
  port = node.port();
  auto store = store_for(node);
  const Reply r = store->execute_one(Command{{"GET", "foo"}});
  ASSERT_TRUE(r.is_error());
  EXPECT_EQ(r.str.rfind("MOVED 12182", 0), 0u);  // after 5 redirects the caller gets the reply
  EXPECT_EQ(node.count("GET"), 6);                // the first send and 5 resends
  EXPECT_EQ(store->execute_one(Command{{"INCR", "foo"}}).as_integer(), 7);
}

TEST(ScriptedCluster, AskingIsWrittenBeforeEachRedirectedRequestOnly) {
  int port = 0;
  ScriptedNode node([&](const std::vector<std::string>& cmd, ScriptedNode::Conn& c) -> std::string {
    const std::string ask = "ASK " + std::to_string(key_slot("moving")) + " 127.0.0.1:" + std::to_string(port);
    if (cmd[0] == "MULTI") {
      c.multi = true;
      c.asked_multi = c.asking;
      c.abort = false;
      return "+OK\r\n";
    }
    if (cmd[0] == "EXEC") {
      c.multi = false;
      c.asking = false;
      if (c.abort) return ScriptedNode::error("EXECABORT Transaction discarded because of previous errors.");
      return "*1\r\n:1\r\n";
    }
    const bool moving = cmd.size() > 1 && cmd[1] == "moving";
    if (moving && !c.asking) {
      if (c.multi) c.abort = true;
      return ScriptedNode::error(ask);
    }
    if (c.multi) return "+QUEUED\r\n";
    return ScriptedNode::integer(moving ? 1 : 2);
  });
  port = node.port();
  auto store = store_for(node);
  auto r = store->execute({cmd({"INCR", "moving"}), cmd({"INCR", "stays"})});
  EXPECT_EQ(r[0].as_integer(), 1);
  EXPECT_EQ(r[1].as_integer(), 2);
  EXPECT_EQ(node.log(), (std::vector<std::string>{"INCR", "INCR", "ASKING", "INCR"}));
  // A transaction redirected by ASK: resent whole, with one ASKING before MULTI.
  auto t = store->execute({cmd({"MULTI"}), cmd({"INCR", "moving"}), cmd({"EXEC"})});
  ASSERT_EQ(t[2].type, Reply::Type::Array) << t[2].str;
  EXPECT_EQ(t[2].elements.at(0).as_integer(), 1);
  const auto log = node.log();
  EXPECT_EQ(std::vector<std::string>(log.begin() + 4, log.end()),
            (std::vector<std::string>{"MULTI", "INCR", "EXEC", "ASKING", "MULTI", "INCR", "EXEC"}));
}

TEST(ScriptedCluster, ScriptReloadAfterAskKeepsTheAsking) {
  // The importing node has no script (flushed): the first EVALSHA after ASKING meets
  // NOSCRIPT. Like Redis, it answers a command without ASKING for the migrating slot with
  // MOVED back to the source, so the rerun must carry ASKING again.
  static const Script s{"one", "return 1", "e0e1f9fabfc9d4800c877a703b823ac0578ff8db", nullptr};
  int port = 0;
  std::atomic<bool> loaded{false};
  ScriptedNode node([&](const std::vector<std::string>& cmd, ScriptedNode::Conn& c) -> std::string {
    const std::string slot = std::to_string(key_slot("moving"));
    if (cmd[0] != "EVALSHA") return ScriptedNode::integer(0);
    if (!c.asking) {
      // The first send: the source says ASK. Later (no ASKING on a rerun): MOVED.
      if (!loaded.load()) return ScriptedNode::error("ASK " + slot + " 127.0.0.1:" + std::to_string(port));
      return ScriptedNode::error("MOVED " + slot + " 127.0.0.1:" + std::to_string(port));
    }
    if (!loaded.exchange(true)) return ScriptedNode::error("NOSCRIPT No matching script. Please use EVAL.");
    return ScriptedNode::integer(1);
  });
  port = node.port();
  auto store = store_for(node);
  const int loads_before = node.script_loads();
  const Reply r = store->execute_one(ScriptCall{&s, {"moving"}, {}});
  ASSERT_FALSE(r.is_error()) << r.str;
  EXPECT_EQ(r.as_integer(), 1);
  EXPECT_EQ(node.script_loads(), loads_before + 1);  // SCRIPT LOAD written before the rerun
  EXPECT_EQ(node.log(), (std::vector<std::string>{"EVALSHA", "ASKING", "EVALSHA", "ASKING", "EVALSHA"}));
  EXPECT_EQ(store->cluster_stats().moved, 0u);
}

TEST(ScriptedCluster, TryAgainBacksOffUntilServedOrTheDeadline) {
  std::atomic<int> refusals{3};
  ScriptedNode node([&](const std::vector<std::string>& cmd, ScriptedNode::Conn&) {
    if (cmd[0] == "INCR" && refusals.fetch_sub(1) > 0) {
      return ScriptedNode::error("TRYAGAIN Multiple keys request during rehashing of slot");
    }
    if (cmd[0] == "GET") return ScriptedNode::error("TRYAGAIN Multiple keys request during rehashing of slot");
    return ScriptedNode::integer(5);
  });
  auto store = store_for(node, 400);
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(store->execute_one(Command{{"INCR", "k"}}).as_integer(), 5);
  EXPECT_EQ(node.count("INCR"), 4);  // three refusals, then served
  // Backoffs of 5, 10 and 20 ms (jittered down to half) came between the sends.
  EXPECT_GE(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(17));
  const Reply r = store->execute_one(Command{{"GET", "k"}});  // never served: the rejection at the deadline
  ASSERT_TRUE(r.is_error());
  EXPECT_EQ(r.str.rfind("TRYAGAIN", 0), 0u);
  EXPECT_GE(node.count("GET"), 3);
}

TEST(ScriptedCluster, ABatchWaitingOutClusterDownIsSentOnceToTheNewOwner) {
  // The owner answers CLUSTERDOWN (a failover under way) a few times, then its table names
  // another node. The waiting call goes there (woken by the refresh that changed the
  // table, or at the end of its backoff, whichever comes first), and only once.
  ScriptedNode next([](const std::vector<std::string>& cmd, ScriptedNode::Conn&) {
    return ScriptedNode::integer(cmd[0] == "INCR" ? 42 : 0);
  });
  std::atomic<int> refusals{0};
  int next_port = next.port();
  ScriptedNode* self = nullptr;
  ScriptedNode old([&](const std::vector<std::string>& cmd, ScriptedNode::Conn&) {
    if (cmd[0] != "INCR") return ScriptedNode::integer(0);
    if (++refusals == 6) self->set_slots(next_port);  // backoffs of 5..160 ms so far
    return ScriptedNode::error("CLUSTERDOWN The cluster is down");
  });
  self = &old;
  auto store = store_for(old, 5000);
  const Reply r = store->execute_one(Command{{"INCR", "k"}});
  EXPECT_EQ(r.as_integer(), 42) << r.str;
  EXPECT_EQ(next.count("INCR"), 1);  // one send to the new owner, whatever woke the call
  EXPECT_GE(refusals.load(), 6);
  EXPECT_EQ(store->execute_one(Command{{"INCR", "k"}}).as_integer(), 42);
  EXPECT_EQ(next.count("INCR"), 2);
}

TEST(ScriptedCluster, AFailedMastersReplicaIsAskedForTheTable) {
  // The master dies; its replica (listed by CLUSTER SLOTS) is promoted. Nothing else is
  // left to ask: the router finds the new table on the replica and sends the call there.
  auto replica = std::make_unique<ScriptedNode>([](const std::vector<std::string>& cmd, ScriptedNode::Conn&) {
    return ScriptedNode::integer(cmd[0] == "INCR" ? 7 : 0);
  });
  auto master = std::make_unique<ScriptedNode>([](const std::vector<std::string>& cmd, ScriptedNode::Conn&) {
    return ScriptedNode::integer(cmd[0] == "INCR" ? 1 : 0);
  });
  master->set_slots(master->port(), {replica->port()});
  replica->set_slots(master->port(), {replica->port()});
  auto store = store_for(*master, 5000);
  EXPECT_EQ(store->execute_one(Command{{"INCR", "k"}}).as_integer(), 1);
  replica->set_slots(replica->port());  // promoted
  master.reset();                       // SIGKILL: connections reset, the port refuses
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  Reply r;
  for (int attempt = 0; attempt < 2; ++attempt) {  // a write on the dying connection may be "maybe applied"
    try {
      r = store->execute_one(Command{{"INCR", "k"}});
      break;
    } catch (const ConnectionError& e) {
      ASSERT_TRUE(e.maybe_applied()) << e.what();  // one never sent is resent by the router
    }
  }
  EXPECT_EQ(r.as_integer(), 7) << r.str;
  EXPECT_GE(replica->count("INCR"), 1);
}

// ----------------------------------------------------------------------------- real cluster

const char* cluster_url() { return std::getenv("REDCOUNT_TEST_CLUSTER_URL"); }

#define REQUIRE_CLUSTER()                                                             \
  if (cluster_url() == nullptr) GTEST_SKIP() << "REDCOUNT_TEST_CLUSTER_URL is not set"

std::shared_ptr<RedisStore> cluster_store() {
  auto o = parse_url(cluster_url());
  o.command_timeout = std::chrono::milliseconds(3000);
  return std::make_shared<RedisStore>(o);
}

std::string node_id(Store& node) {
  return node.execute_one(Command{{"CLUSTER", "MYID"}}).as_string().value();
}

TEST(RealCluster, SplitAndReassembleInOrder) {
  REQUIRE_CLUSTER();
  auto store = cluster_store();
  const std::string p = "rc:test:split:" + std::to_string(::getpid()) + ":";
  std::vector<Request> batch;
  for (int i = 0; i < 300; ++i) batch.push_back(cmd({"INCRBY", p + std::to_string(i), std::to_string(i + 1)}));
  auto replies = store->execute(batch);
  ASSERT_EQ(replies.size(), 300u);
  for (int i = 0; i < 300; ++i) EXPECT_EQ(replies[static_cast<std::size_t>(i)].as_integer(), i + 1);
  auto nodes = store->nodes();
  EXPECT_GE(nodes.size(), 2u);
  bool all_seven = true;  // has_expire_options() only when every master is Redis >= 7.0
  for (auto& n : nodes) {
    const std::string info = n->execute_one(Command{{"INFO", "server"}}).as_string().value();
    const auto at = info.find("redis_version:");
    all_seven = all_seven && at != std::string::npos && std::stoi(info.substr(at + 14)) >= 7;
  }
  EXPECT_EQ(store->has_expire_options(), all_seven);
  std::int64_t total = 0;
  for (auto& n : nodes) total += n->execute_one(Command{{"DBSIZE"}}).as_integer();
  EXPECT_GE(total, 300);
  // The same through submit, with a transaction and keyless requests among them.
  std::promise<std::vector<Reply>> done;
  std::vector<Request> mixed{cmd({"TIME"}), cmd({"GET", p + "1"}), cmd({"MULTI"}), cmd({"INCR", p + "2"}),
                             cmd({"EXEC"}), cmd({"PING"}), cmd({"GET", p + "250"})};
  store->submit(mixed, [&](std::vector<Reply>&& r, std::exception_ptr e) {
    if (e) return done.set_exception(e);
    done.set_value(std::move(r));
  });
  auto r = done.get_future().get();
  ASSERT_EQ(r.size(), 7u);
  EXPECT_EQ(r[0].type, Reply::Type::Array);
  EXPECT_EQ(r[1].as_integer(), 2);
  EXPECT_EQ(r[4].elements.at(0).as_integer(), 4);
  EXPECT_EQ(r[5].str, "PONG");
  EXPECT_EQ(r[6].as_integer(), 251);
  EXPECT_THROW(store->execute_one(Command{{"KEYS", "*"}}), InvalidArgument);
  for (int i = 0; i < 300; ++i) store->execute_one(Command{{"DEL", p + std::to_string(i)}});
}

// Moves `key`'s slot from its owner to another master the way redis-cli --cluster
// reshard does, in steps, so the test sees ASK (importing/migrating) and then MOVED.
struct Migration {
  std::shared_ptr<Store> from, to;
  std::string from_id, to_id, slot;
};

Migration begin_migration(RedisStore& store, const std::string& key) {
  Migration m;
  m.slot = std::to_string(key_slot(key));
  store.execute_one(Command{{"SET", key, "x"}}).check();
  for (auto& n : store.nodes()) {
    const bool owner = n->execute_one(Command{{"CLUSTER", "COUNTKEYSINSLOT", m.slot}}).as_integer() > 0;
    if (owner) {
      m.from = n;
    } else if (!m.to) {
      m.to = n;
    }
  }
  m.from_id = node_id(*m.from);
  m.to_id = node_id(*m.to);
  m.to->execute_one(Command{{"CLUSTER", "SETSLOT", m.slot, "IMPORTING", m.from_id}}).check();
  m.from->execute_one(Command{{"CLUSTER", "SETSLOT", m.slot, "MIGRATING", m.to_id}}).check();
  return m;
}

void end_migration(const Migration& m) {
  // Moves the keys still on the source, then gives the slot to the target on both.
  auto keys = m.from->execute_one(Command{{"CLUSTER", "GETKEYSINSLOT", m.slot, "1000"}});
  const std::string addr = m.to->describe();  // redis://host:port/0
  const std::string hp = addr.substr(addr.find("//") + 2, addr.rfind('/') - addr.find("//") - 2);
  if (!keys.elements.empty()) {
    std::vector<std::string> args{"MIGRATE", hp.substr(0, hp.rfind(':')), hp.substr(hp.rfind(':') + 1), "", "0",
                                  "5000", "KEYS"};
    for (const auto& k : keys.elements) args.push_back(k.str);
    m.from->execute_one(Command{args}).check();
  }
  m.to->execute_one(Command{{"CLUSTER", "SETSLOT", m.slot, "NODE", m.to_id}}).check();
  m.from->execute_one(Command{{"CLUSTER", "SETSLOT", m.slot, "NODE", m.to_id}}).check();
}

TEST(RealCluster, AskDuringMigrationThenMoved) {
  REQUIRE_CLUSTER();
  auto store = cluster_store();
  const std::string tag = "{rc:mig:" + std::to_string(::getpid()) + "}";
  const std::string old_key = tag + "old", new_key = tag + "new";
  Migration m = begin_migration(*store, old_key);
  // A key that is not on the source is served by the target after ASK (with ASKING).
  EXPECT_EQ(store->execute_one(Command{{"INCRBY", new_key, "5"}}).as_integer(), 5);
  EXPECT_EQ(m.to->execute_one(Command{{"CLUSTER", "COUNTKEYSINSLOT", m.slot}}).as_integer(), 1);
  // A transaction redirected by ASK is resent whole with one ASKING before MULTI.
  auto r = store->execute({cmd({"MULTI"}), cmd({"INCRBY", tag + "tx", "2"}), cmd({"INCRBY", tag + "tx", "3"}),
                           cmd({"EXEC"})});
  ASSERT_EQ(r[3].type, Reply::Type::Array) << r[3].str;
  EXPECT_EQ(r[3].elements.at(1).as_integer(), 5);
  // The key still on the source is served there.
  EXPECT_EQ(store->execute_one(Command{{"GET", old_key}}).as_string(), "x");
  end_migration(m);
  // The table still names the source: MOVED, patched, and a refresh asked for.
  const auto before = store->execute_one(Command{{"GET", new_key}});
  EXPECT_EQ(before.as_integer(), 5);
  EXPECT_EQ(store->execute_one(Command{{"GET", old_key}}).as_string(), "x");
  store->execute_one(Command{{"DEL", old_key}});
  store->execute_one(Command{{"DEL", new_key}});
  store->execute_one(Command{{"DEL", tag + "tx"}});
}

TEST(RealCluster, TryAgainIsRetriedWithinTheDeadlineAndReRouted) {
  REQUIRE_CLUSTER();
  auto o = parse_url(cluster_url());
  o.command_timeout = std::chrono::milliseconds(300);
  auto quick = std::make_shared<RedisStore>(o);
  auto store = cluster_store();
  const std::string tag = "{rc:try:" + std::to_string(::getpid()) + "}";
  Migration m = begin_migration(*store, tag + "old");
  // One key on the source, one not: the source answers TRYAGAIN while the slot migrates.
  const std::vector<Request> mget{cmd({"MGET", tag + "old", tag + "new"})};
  const auto t0 = std::chrono::steady_clock::now();
  auto r = quick->execute(mget);
  const auto waited = std::chrono::steady_clock::now() - t0;
  ASSERT_TRUE(r[0].is_error());
  EXPECT_EQ(r[0].str.rfind("TRYAGAIN", 0), 0u) << r[0].str;  // past the deadline: the rejection itself
  // Retried with backoff until the deadline, not refused at the first TRYAGAIN: several
  // TRYAGAIN replies were absorbed (counted, not timed: the backoff is jittered).
  EXPECT_GE(quick->cluster_stats().tryagain, 3u);
  EXPECT_LE(waited, std::chrono::milliseconds(300) + std::chrono::milliseconds(2000));
  // The migration ends while a call waits: it is routed again and served by the new owner.
  std::thread finisher([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    end_migration(m);
  });
  auto ok = store->execute(mget);
  finisher.join();
  ASSERT_EQ(ok[0].type, Reply::Type::Array) << ok[0].str;
  EXPECT_EQ(ok[0].elements.at(0).as_string(), "x");
  EXPECT_TRUE(ok[0].elements.at(1).is_nil());
  store->execute_one(Command{{"DEL", tag + "old"}});
}

TEST(RealCluster, RefreshesAreCoalescedAndRateLimited) {
  REQUIRE_CLUSTER();
  auto c = std::make_shared<redis::Cluster>(parse_url(cluster_url()));
  ASSERT_TRUE(c->refresh_now(std::chrono::milliseconds(3000)));
  ASSERT_TRUE(c->master_of(key_slot("foo")).has_value());
  EXPECT_GE(c->masters().size(), 2u);
  const auto before = c->refreshes();
  const auto t0 = std::chrono::steady_clock::now();
  int asked = 0;
  while (std::chrono::steady_clock::now() - t0 < std::chrono::milliseconds(500)) {
    c->request_refresh();  // a storm of MOVED replies would ask this often
    ++asked;
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  const auto started = c->refreshes() - before;
  EXPECT_GT(asked, 100);
  EXPECT_GE(started, 2u);
  EXPECT_LE(started, 7u);  // one per 100 ms at most (+ the one that may be under way)
  c->close();
}

TEST(RealCluster, ThreadsAndSubmittersShareTheRouter) {
  REQUIRE_CLUSTER();
  auto o = parse_url(cluster_url());
  o.max_connections = 4;  // thread connections per node for the synchronous callers
  auto store = std::make_shared<RedisStore>(o);
  const std::string p = "rc:test:threads:" + std::to_string(::getpid()) + ":";
  constexpr int kThreads = 6, kRounds = 150, kKeys = 12;
  std::atomic<int> async_done{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int r = 0; r < kRounds; ++r) {
        std::vector<Request> batch;
        for (int k = 0; k < kKeys; ++k) batch.push_back(cmd({"INCR", p + std::to_string(k)}));
        if (t % 2 == 0) {
          store->execute(batch);
        } else {
          std::promise<void> done;
          store->submit(batch, [&](std::vector<Reply>&& replies, std::exception_ptr e) {
            if (!e && replies.size() == kKeys) async_done.fetch_add(1);
            done.set_value();
          });
          done.get_future().wait();
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(async_done.load(), kThreads / 2 * kRounds);
  for (int k = 0; k < kKeys; ++k) {
    EXPECT_EQ(store->execute_one(Command{{"GET", p + std::to_string(k)}}).as_integer(), kThreads * kRounds);
    store->execute_one(Command{{"DEL", p + std::to_string(k)}});
  }
}

// A reply that arrives after its call timed out is discarded, and the node's connection
// stays in step, on both paths of the router: the synchronous one (a borrowed connection,
// handed to the reactor at the timeout) and submit (the node's reactor). CLIENT PAUSE ...
// WRITE on every master holds the SETs past command_timeout; their replies come when the
// pause ends.
TEST(RealCluster, LateRepliesAreDiscardedAndTheStoreKeepsServing) {
  REQUIRE_CLUSTER();
  auto o = parse_url(cluster_url());
  o.command_timeout = std::chrono::milliseconds(300);
  auto quick = std::make_shared<RedisStore>(o);
  auto admin = cluster_store();
  const std::string p = "rc:test:late:" + std::to_string(::getpid()) + ":";
  const std::vector<std::string> keys{p + "a", p + "b", p + "c", p + "d"};
  for (const auto& k : keys) quick->execute_one(Command{{"SET", k, "before"}}).check();  // connections open
  auto pause_all = [&] {
    for (auto& n : admin->nodes()) n->execute_one(Command{{"CLIENT", "PAUSE", "700", "WRITE"}}).check();
  };
  auto expect_maybe_timeout = [](std::exception_ptr e) {
    ASSERT_TRUE(e);
    try {
      std::rethrow_exception(e);
    } catch (const TimeoutError& t) {
      EXPECT_TRUE(t.maybe_applied()) << t.what();
    } catch (const std::exception& x) {
      ADD_FAILURE() << "expected TimeoutError, got " << x.what();
    }
  };
  auto catch_sync = [](auto&& call) {
    std::exception_ptr e;
    try {
      call();
    } catch (...) {
      e = std::current_exception();
    }
    return e;
  };
  // The synchronous path: one key (one node), then a batch over every node.
  pause_all();
  expect_maybe_timeout(catch_sync([&] { quick->execute_one(Command{{"SET", keys[0], "late"}}); }));
  std::vector<Request> spread;
  for (const auto& k : keys) spread.push_back(cmd({"SET", k, "late"}));
  expect_maybe_timeout(catch_sync([&] { quick->execute(spread); }));
  std::this_thread::sleep_for(std::chrono::milliseconds(900));  // the pause is over: the late replies arrive
  for (int round = 0; round < 3; ++round) {
    std::vector<Request> check;
    for (const auto& k : keys) check.push_back(cmd({"INCR", k + ":n"}));
    check.push_back(cmd({"GET", keys[0]}));
    auto r = quick->execute(check);
    ASSERT_EQ(r.size(), keys.size() + 1);
    for (std::size_t i = 0; i < keys.size(); ++i) EXPECT_EQ(r[i].as_integer(), round + 1) << r[i].str;
    EXPECT_EQ(r[keys.size()].as_string(), "late");  // the SETs ran: the pause only held them
  }
  // submit: the nodes' reactors time the children out.
  pause_all();
  std::promise<std::exception_ptr> timed_out;
  quick->submit(spread, [&](std::vector<Reply>&&, std::exception_ptr e) { timed_out.set_value(e); });
  expect_maybe_timeout(timed_out.get_future().get());
  std::this_thread::sleep_for(std::chrono::milliseconds(900));
  for (int round = 0; round < 3; ++round) {
    std::vector<Request> check;
    for (const auto& k : keys) check.push_back(cmd({"INCR", k + ":m"}));
    std::promise<std::vector<Reply>> done;
    quick->submit(check, [&](std::vector<Reply>&& r, std::exception_ptr e) {
      if (e) return done.set_exception(e);
      done.set_value(std::move(r));
    });
    auto r = done.get_future().get();
    ASSERT_EQ(r.size(), keys.size());
    for (std::size_t i = 0; i < keys.size(); ++i) EXPECT_EQ(r[i].as_integer(), round + 1) << r[i].str;
  }
  EXPECT_EQ(quick->execute_one(Command{{"PING"}}).str, "PONG");
  for (const auto& k : keys) {
    for (const auto& s : {std::string(), std::string(":n"), std::string(":m")}) {
      admin->execute_one(Command{{"DEL", k + s}});
    }
  }
}

TEST(RealCluster, CrossSlotScriptRefusedBeforeSending) {
  REQUIRE_CLUSTER();
  auto store = cluster_store();
  static const Script s{"cross", "return 1", "e0e1f9fabfc9d4800c877a703b823ac0578ff8db", nullptr};
  EXPECT_THROW(store->execute({ScriptCall{&s, {"foo", "bar"}, {}}}), InvalidArgument);
  EXPECT_THROW(store->execute_one(Command{{"FLUSHALL"}}), InvalidArgument);
}

}  // namespace
}  // namespace redcount
