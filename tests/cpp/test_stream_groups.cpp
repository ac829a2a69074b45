// The memory store's stream consumer groups (XGROUP, XREADGROUP, XACK, XPENDING, XAUTOCLAIM):
// one script of commands, whose replies are checked on the memory store and, when
// REDCOUNT_TEST_REDIS_URL is set, compared reply by reply with a real Redis 7.
#include <gtest/gtest.h>

#include <cstdlib>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "redcount/common/clock.h"
#include "redcount/memory/memory_store.h"
#include "redcount/common/options.h"
#include "redcount/redis/redis_store.h"
#include "test_support.h"

namespace {

using namespace redcount;
using rctest::kT0;
using rctest::run;

// A reply as text, nested arrays in brackets, so that two stores' replies compare as strings
// and a mismatch prints readably.
std::string render(const Reply& r) {
  switch (r.type) {
    case Reply::Type::Nil: return "nil";
    case Reply::Type::Integer: return std::string(":").append(std::to_string(r.integer));
    case Reply::Type::String: return std::string("\"").append(r.str).append("\"");
    case Reply::Type::Status: return std::string("+").append(r.str);
    case Reply::Type::Error: return std::string("-").append(r.str);
    case Reply::Type::Array: {
      // Appends only: GCC 12 at -O3 warns (-Wrestrict, a false positive) on "x" + string.
      std::string out = "[";
      for (std::size_t i = 0; i < r.elements.size(); ++i) {
        if (i > 0) out.push_back(',');
        out.append(render(r.elements[i]));
      }
      out.push_back(']');
      return out;
    }
  }
  return "?";
}

struct Step {
  std::vector<std::string> command;
  std::string expected;  // the reply on the memory store, rendered
};

// Fixed ids (never '*') and idle thresholds of 0 or an hour, so that the replies do not
// depend on either store's clock.
const std::vector<Step>& script() {
  static const std::vector<Step> steps = {
      {{"XGROUP", "CREATE", "sg", "g", "$"},
       "-ERR The XGROUP subcommand requires the key to exist. Note that for CREATE you may want to use the "
       "MKSTREAM option to create an empty stream automatically."},
      {{"XGROUP", "CREATE", "sg", "g", "$", "MKSTREAM"}, "+OK"},
      {{"XGROUP", "CREATE", "sg", "g", "$"}, "-BUSYGROUP Consumer Group name already exists"},
      {{"XADD", "sg", "1-1", "f", "a"}, "\"1-1\""},
      {{"XADD", "sg", "1-2", "f", "b"}, "\"1-2\""},
      {{"XADD", "sg", "2-0", "f", "c"}, "\"2-0\""},
      {{"XREADGROUP", "GROUP", "g", "c1", "COUNT", "2", "STREAMS", "sg", ">"},
       "[[\"sg\",[[\"1-1\",[\"f\",\"a\"]],[\"1-2\",[\"f\",\"b\"]]]]]"},
      {{"XREADGROUP", "GROUP", "g", "c2", "STREAMS", "sg", ">"}, "[[\"sg\",[[\"2-0\",[\"f\",\"c\"]]]]]"},
      {{"XREADGROUP", "GROUP", "g", "c2", "STREAMS", "sg", ">"}, "nil"},
      {{"XPENDING", "sg", "g"}, "[:3,\"1-1\",\"2-0\",[[\"c1\",\"2\"],[\"c2\",\"1\"]]]"},
      {{"XREADGROUP", "GROUP", "g", "c1", "STREAMS", "sg", "0"},
       "[[\"sg\",[[\"1-1\",[\"f\",\"a\"]],[\"1-2\",[\"f\",\"b\"]]]]]"},
      {{"XREADGROUP", "GROUP", "g", "c1", "COUNT", "1", "STREAMS", "sg", "1-1"},
       "[[\"sg\",[[\"1-2\",[\"f\",\"b\"]]]]]"},
      {{"XREADGROUP", "GROUP", "g", "c3", "STREAMS", "sg", "0"}, "[[\"sg\",[]]]"},
      {{"XACK", "sg", "g", "1-1", "9-9"}, ":1"},
      {{"XACK", "sg", "g", "1-1"}, ":0"},
      {{"XACK", "sg", "nog", "1-2"}, ":0"},
      {{"XACK", "missing", "g", "1-2"}, ":0"},
      {{"XACK", "sg", "g", "bad"}, "-ERR Invalid stream ID specified as stream command argument"},
      {{"XADD", "sg", "MAXLEN", "1", "3-0", "f", "d"}, "\"3-0\""},
      {{"XREADGROUP", "GROUP", "g", "c1", "STREAMS", "sg", "0"}, "[[\"sg\",[[\"1-2\",nil]]]]"},
      {{"XAUTOCLAIM", "sg", "g", "c3", "0", "0", "COUNT", "10"}, "[\"0-0\",[],[\"1-2\",\"2-0\"]]"},
      {{"XPENDING", "sg", "g"}, "[:0,nil,nil,nil]"},
      {{"XADD", "sg", "4-0", "f", "e"}, "\"4-0\""},
      {{"XADD", "sg", "5-0", "f", "g"}, "\"5-0\""},
      {{"XREADGROUP", "GROUP", "g", "c1", "STREAMS", "sg", ">"},
       "[[\"sg\",[[\"3-0\",[\"f\",\"d\"]],[\"4-0\",[\"f\",\"e\"]],[\"5-0\",[\"f\",\"g\"]]]]]"},
      {{"XAUTOCLAIM", "sg", "g", "c3", "3600000", "-"}, "[\"0-0\",[],[]]"},
      {{"XAUTOCLAIM", "sg", "g", "c3", "0", "-", "COUNT", "1"}, "[\"4-0\",[[\"3-0\",[\"f\",\"d\"]]],[]]"},
      {{"XAUTOCLAIM", "sg", "g", "c3", "0", "4-0", "JUSTID"}, "[\"0-0\",[\"4-0\",\"5-0\"],[]]"},
      {{"XPENDING", "sg", "g"}, "[:3,\"3-0\",\"5-0\",[[\"c3\",\"3\"]]]"},
      {{"XPENDING", "sg", "g", "IDLE", "3600000", "-", "+", "10"}, "[]"},
      {{"XPENDING", "sg", "g", "-", "+", "0"}, "[]"},
      {{"XPENDING", "sg", "nog"}, "-NOGROUP No such key 'sg' or consumer group 'nog'"},
      {{"XREADGROUP", "GROUP", "nog", "c", "STREAMS", "sg", ">"},
       "-NOGROUP No such key 'sg' or consumer group 'nog' in XREADGROUP with GROUP option"},
      {{"XREADGROUP", "GROUP", "g", "c", "STREAMS", "missing", ">"},
       "-NOGROUP No such key 'missing' or consumer group 'g' in XREADGROUP with GROUP option"},
      {{"XREADGROUP", "GROUP", "g", "c", "STREAMS", "sg", "sg", ">"},
       "-ERR Unbalanced XREAD list of streams: for each stream key an ID or '$' must be specified."},
      {{"XREADGROUP", "GROUP", "g", "c", "STREAMS", "sg", "x-y"},
       "-ERR Invalid stream ID specified as stream command argument"},
      {{"XAUTOCLAIM", "sg", "g", "c3", "x", "0"}, "-ERR Invalid min-idle-time argument for XAUTOCLAIM"},
      {{"XAUTOCLAIM", "sg", "g", "c3", "0", "0", "COUNT", "0"}, "-ERR COUNT must be > 0"},
      {{"XAUTOCLAIM", "sg", "nog", "c3", "0", "0"}, "-NOGROUP No such key 'sg' or consumer group 'nog'"},
      {{"XGROUP", "CREATE", "sg", "g2", "0"}, "+OK"},
      {{"XREADGROUP", "GROUP", "g2", "c", "NOACK", "STREAMS", "sg", ">"},
       "[[\"sg\",[[\"3-0\",[\"f\",\"d\"]],[\"4-0\",[\"f\",\"e\"]],[\"5-0\",[\"f\",\"g\"]]]]]"},
      {{"XPENDING", "sg", "g2"}, "[:0,nil,nil,nil]"},
      {{"XGROUP", "CREATE", "sg", "g3", "4-0"}, "+OK"},
      {{"XREADGROUP", "GROUP", "g3", "c", "STREAMS", "sg", ">"}, "[[\"sg\",[[\"5-0\",[\"f\",\"g\"]]]]]"},
      {{"XGROUP", "DESTROY", "sg", "g"}, ":1"},
      {{"XGROUP", "DESTROY", "sg", "g"}, ":0"},
      {{"XGROUP", "DESTROY", "missing", "g"},
       "-ERR The XGROUP subcommand requires the key to exist. Note that for CREATE you may want to use the "
       "MKSTREAM option to create an empty stream automatically."},
      {{"XDEL", "sg", "4-0", "9-9"}, ":1"},
      {{"XDEL", "sg", "4-0"}, ":0"},
      {{"XDEL", "sg", "5-0", "bad"}, "-ERR Invalid stream ID specified as stream command argument"},
      {{"XDEL", "missing", "1-0"}, ":0"},
      {{"XRANGE", "sg", "-", "+"}, "[[\"3-0\",[\"f\",\"d\"]],[\"5-0\",[\"f\",\"g\"]]]"},
      {{"XDEL", "sg", "3"}, ":1"},
      {{"XLEN", "sg"}, ":1"},
      // The read counters the flusher relies on (Redis 7: entries-read, lag; XGROUP ... ENTRIESREAD)
      // and XTRIM: across entries trimmed before the group read them, Redis adds one per entry
      // delivered, so the lag shows the gap until SETID ... ENTRIESREAD puts the count right.
      {{"XGROUP", "CREATE", "tr", "g", "0", "MKSTREAM", "ENTRIESREAD", "0"}, "+OK"},
      {{"XADD", "tr", "MAXLEN", "2", "1-0", "f", "a"}, "\"1-0\""},
      {{"XADD", "tr", "MAXLEN", "2", "2-0", "f", "b"}, "\"2-0\""},
      {{"XADD", "tr", "MAXLEN", "2", "3-0", "f", "c"}, "\"3-0\""},
      {{"XINFO", "GROUPS", "tr"},
       "[[\"name\",\"g\",\"consumers\",:0,\"pending\",:0,\"last-delivered-id\",\"0-0\",\"entries-read\",:0,"
       "\"lag\",:3]]"},
      {{"XREADGROUP", "GROUP", "g", "c", "STREAMS", "tr", ">"},
       "[[\"tr\",[[\"2-0\",[\"f\",\"b\"]],[\"3-0\",[\"f\",\"c\"]]]]]"},
      {{"XINFO", "GROUPS", "tr"},
       "[[\"name\",\"g\",\"consumers\",:1,\"pending\",:2,\"last-delivered-id\",\"3-0\",\"entries-read\",:2,"
       "\"lag\",:1]]"},
      {{"XGROUP", "SETID", "tr", "g", "3-0", "ENTRIESREAD", "3"}, "+OK"},
      {{"XINFO", "GROUPS", "tr"},
       "[[\"name\",\"g\",\"consumers\",:1,\"pending\",:2,\"last-delivered-id\",\"3-0\",\"entries-read\",:3,"
       "\"lag\",:0]]"},
      {{"XGROUP", "SETID", "tr", "g", "3-0", "ENTRIESREAD", "-2"}, "-ERR value for ENTRIESREAD must be positive or -1"},
      {{"XGROUP", "SETID", "tr", "g", "3-0", "FOO", "1"},
       "-ERR unknown subcommand or wrong number of arguments for 'SETID'. Try XGROUP HELP."},
      {{"XGROUP", "SETID", "tr", "nog", "$"}, "-NOGROUP No such consumer group 'nog' for key name 'tr'"},
      {{"XGROUP", "CREATE", "tr", "late", "$"}, "+OK"},
      {{"XTRIM", "tr", "MINID", "3-0"}, ":1"},
      {{"XTRIM", "tr", "MINID", "bad"}, "-ERR Invalid stream ID specified as stream command argument"},
      {{"XTRIM", "tr", "LEN", "0"}, "-ERR syntax error"},
      {{"XTRIM", "tr", "MAXLEN", "0", "LIMIT", "5"}, "-ERR syntax error, LIMIT cannot be used without the special ~ option"},
      {{"XTRIM", "missing", "MAXLEN", "0"}, ":0"},
      {{"XTRIM", "tr", "MAXLEN", "=", "0"}, ":1"},
      {{"XLEN", "tr"}, ":0"},
      {{"XINFO", "GROUPS", "missing"}, "-ERR no such key"},
      {{"SET", "str", "x"}, "+OK"},
      {{"XGROUP", "CREATE", "str", "g", "$"}, "-WRONGTYPE Operation against a key holding the wrong kind of value"},
      {{"XREADGROUP", "GROUP", "g", "c", "STREAMS", "str", ">"},
       "-WRONGTYPE Operation against a key holding the wrong kind of value"},
      {{"XDEL", "str", "1-0"}, "-WRONGTYPE Operation against a key holding the wrong kind of value"},
  };
  return steps;
}

TEST(StreamGroups, TheMemoryStoreAnswersAsRedis7) {
  auto store = rctest::memory_store(std::make_shared<ManualClock>(kT0));
  for (const Step& step : script()) {
    EXPECT_EQ(render(run(*store, step.command)), step.expected) << "command: " << step.command[0] << " "
                                                                   << (step.command.size() > 1 ? step.command[1] : "");
  }
}

TEST(StreamGroups, RealRedisGivesTheSameReplies) {
  const char* url = std::getenv("REDCOUNT_TEST_REDIS_URL");
  if (url == nullptr || *url == '\0') GTEST_SKIP() << "REDCOUNT_TEST_REDIS_URL is not set";
  RedisStore redis(parse_url(url));
  run(redis, {"FLUSHDB"});
  for (const Step& step : script()) {
    EXPECT_EQ(render(run(redis, step.command)), step.expected) << "command: " << step.command[0] << " "
                                                                   << (step.command.size() > 1 ? step.command[1] : "");
  }
  run(redis, {"FLUSHDB"});
  redis.close();
}

// Idle times and delivery counts follow the store's clock, which real Redis cannot be given.
TEST(StreamGroups, IdleTimesAndDeliveryCountsFollowTheClock) {
  auto clock = std::make_shared<ManualClock>(kT0);
  auto s = rctest::memory_store(clock);
  ASSERT_EQ(render(run(*s, {"XGROUP", "CREATE", "st", "g", "0", "MKSTREAM"})), "+OK");
  run(*s, {"XADD", "st", "1-0", "f", "a"});
  run(*s, {"XADD", "st", "2-0", "f", "b"});
  run(*s, {"XREADGROUP", "GROUP", "g", "dead", "STREAMS", "st", ">"});
  clock->set(kT0 + 1500);
  EXPECT_EQ(render(run(*s, {"XPENDING", "st", "g", "-", "+", "10"})),
            "[[\"1-0\",\"dead\",:1500,:1],[\"2-0\",\"dead\",:1500,:1]]");
  // Not idle long enough: nothing claimed.
  EXPECT_EQ(render(run(*s, {"XAUTOCLAIM", "st", "g", "alive", "2000", "0"})), "[\"0-0\",[],[]]");
  clock->set(kT0 + 2500);
  EXPECT_EQ(render(run(*s, {"XAUTOCLAIM", "st", "g", "alive", "2000", "0", "COUNT", "1"})),
            "[\"2-0\",[[\"1-0\",[\"f\",\"a\"]]],[]]");
  clock->set(kT0 + 2600);
  EXPECT_EQ(render(run(*s, {"XPENDING", "st", "g", "IDLE", "50", "-", "+", "10"})),
            "[[\"1-0\",\"alive\",:100,:2],[\"2-0\",\"dead\",:2600,:1]]");
  EXPECT_EQ(render(run(*s, {"XPENDING", "st", "g", "-", "+", "10", "dead"})), "[[\"2-0\",\"dead\",:2600,:1]]");
  // Reading history counts as a delivery too.
  run(*s, {"XREADGROUP", "GROUP", "g", "alive", "STREAMS", "st", "0"});
  EXPECT_EQ(render(run(*s, {"XPENDING", "st", "g", "-", "1-0", "1"})), "[[\"1-0\",\"alive\",:0,:3]]");
  // BLOCK never waits here (RedisStore refuses it: it would stall a shared connection).
  EXPECT_EQ(render(run(*s, {"XREADGROUP", "GROUP", "g", "c", "BLOCK", "100000", "STREAMS", "st", ">"})), "nil");
  EXPECT_EQ(render(run(*s, {"XREADGROUP", "GROUP", "g", "c", "BLOCK", "-1", "STREAMS", "st", ">"})),
            "-ERR timeout is negative");
  EXPECT_EQ(render(run(*s, {"XACK", "st", "g", "1-0", "2-0"})), ":2");
  EXPECT_EQ(render(run(*s, {"XPENDING", "st", "g"})), "[:0,nil,nil,nil]");
}

}  // namespace
