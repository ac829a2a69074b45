// Redis Cluster support: hash slots, key positions, the cut of a batch into units and
// children (ASKING placement), redirect parsing, the cluster URL; and, against a real
// cluster named by REDCOUNT_TEST_CLUSTER_URL (redis+cluster://host:port,...), the split
// and reassembly, ASK during a slot's migration (also inside MULTI), MOVED after it, and
// the refusals.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdlib>
#include <future>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "redcount/common/slot.h"
#include "redcount/errors.h"
#include "redcount/options.h"
#include "redcount/redis/cluster.h"
#include "redcount/redis/command_keys.h"
#include "redcount/redis_store.h"
#include "redcount/store.h"

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
  EXPECT_THROW(parse_url("redis+cluster://h:7000/2"), InvalidArgument);
  EXPECT_THROW(parse_url("redis://a:1,b:2"), InvalidArgument);
  EXPECT_FALSE(parse_url("redis://h:1").cluster);
  RedisStore s(parse_url("redis+cluster://127.0.0.1:1,127.0.0.1:2"));  // connects at the first call
  EXPECT_EQ(s.describe(), "redis+cluster://127.0.0.1:1,127.0.0.1:2/0");
  EXPECT_EQ(s.shard_of("foo"), 12182u);
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
  EXPECT_GE(waited, std::chrono::milliseconds(200));
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

TEST(RealCluster, CrossSlotScriptRefusedBeforeSending) {
  REQUIRE_CLUSTER();
  auto store = cluster_store();
  static const Script s{"cross", "return 1", "e0e1f9fabfc9d4800c877a703b823ac0578ff8db", nullptr};
  EXPECT_THROW(store->execute({ScriptCall{&s, {"foo", "bar"}, {}}}), InvalidArgument);
  EXPECT_THROW(store->execute_one(Command{{"FLUSHALL"}}), InvalidArgument);
}

}  // namespace
}  // namespace redcount
