// The script table (cpp/src/memory/twins/script_table.cpp) against the Lua files CMake
// embeds (every cpp/lua/*.lua): one row per file, each with its file's text and SHA1 and a
// native twin the memory store runs. With REDCOUNT_TEST_REDIS_URL set, Redis confirms
// every SHA1 (SCRIPT LOAD answers it).
#include <gtest/gtest.h>

#include <cstdlib>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "redcount/common/options.h"
#include "redcount/lua_scripts.h"
#include "redcount/memory/memory_store.h"
#include "redcount/redis/redis_store.h"
#include "redcount/store/scripts.h"
#include "test_support.h"

namespace {

using redcount::all_scripts;
using redcount::Script;

const Script* row_of(std::string_view name) {
  for (const Script* s : all_scripts()) {
    if (s->name == name) return s;
  }
  return nullptr;
}

TEST(ScriptTable, EveryLuaFileHasExactlyOneRow) {
  std::set<std::string_view> files, rows, shas;
  for (const auto& f : redcount::lua::all_files) files.insert(f.name);
  for (const Script* s : all_scripts()) {
    EXPECT_TRUE(rows.insert(s->name).second) << "two rows named " << s->name;
    EXPECT_TRUE(shas.insert(s->sha1).second) << "two rows with the SHA1 of " << s->name;
  }
  EXPECT_EQ(rows, files) << "cpp/lua and the script table list different scripts";
}

TEST(ScriptTable, EveryRowCarriesItsFilesTextAndSha1) {
  for (const auto& f : redcount::lua::all_files) {
    SCOPED_TRACE(std::string(f.name));
    const Script* s = row_of(f.name);
    ASSERT_NE(s, nullptr);
    EXPECT_EQ(s->source, f.source);
    EXPECT_EQ(s->sha1, f.sha1);
    EXPECT_EQ(s->sha1.size(), 40u);
  }
}

TEST(ScriptTable, TheMemoryStoreRunsEveryRowsTwin) {
  auto store = std::make_shared<redcount::MemoryStore>();
  for (const Script* s : all_scripts()) {
    SCOPED_TRACE(std::string(s->name));
    ASSERT_NE(s->native, nullptr);
    // Arguments no strategy sends: the twin must answer (an error reply at most), never crash.
    std::vector<redcount::Request> batch;
    batch.emplace_back(redcount::ScriptCall{s, {"rctest:scripts:k"}, {"x"}});
    std::vector<redcount::Reply> replies = store->execute(batch);
    ASSERT_EQ(replies.size(), 1u);
  }
}

// Found by the memory-store fuzzer: a request-id lifetime near 2^63 overflowed now + ttl in
// the twins (undefined behaviour; UBSan aborts), and quota amounts outside +-(2^53 - 1)
// could overflow value - amount. Each is an error reply now, as on Redis, where the
// script's SET ... PXAT fails for such a deadline.
TEST(ScriptTable, TwinsRefuseDeadlinesAndAmountsThatOverflow) {
  auto store = std::make_shared<redcount::MemoryStore>();
  const std::string huge = "9223372036854775553";
  const std::string most = "-9223372036854775808";
  std::vector<redcount::Request> batch;
  batch.emplace_back(redcount::ScriptCall{&redcount::kShardedClaimScript, {"rctest:{s}:id"}, {huge}});
  batch.emplace_back(redcount::ScriptCall{&redcount::kShardedIncrScript,
                                          {"rctest:{s}:v", "rctest:{s}:log", "rctest:{s}:id2"},
                                          {"1", huge, "10", "2", "5", "rid"}});
  batch.emplace_back(redcount::ScriptCall{
      &redcount::kQuotaScript, {"rctest:{q}", "rctest:{q}:id"}, {"give", "1", "0", "10", huge}});
  batch.emplace_back(redcount::ScriptCall{&redcount::kQuotaScript, {"rctest:{q}"}, {"take", most, "0", "10", "1000"}});
  const std::vector<redcount::Reply> replies = store->execute(batch);
  ASSERT_EQ(replies.size(), batch.size());
  for (const auto& r : replies) EXPECT_TRUE(r.is_error()) << r.str;
  EXPECT_EQ(store->execute_one(redcount::Command{{"GET", "rctest:{q}"}}).type, redcount::Reply::Type::Nil);
}

TEST(ScriptTable, RedisAgreesWithEverySha1) {
  const char* url = std::getenv("REDCOUNT_TEST_REDIS_URL");
  if (url == nullptr || *url == '\0') GTEST_SKIP() << "REDCOUNT_TEST_REDIS_URL is not set";
  auto redis = std::make_shared<redcount::RedisStore>(redcount::parse_url(url));
  for (const Script* s : all_scripts()) {
    SCOPED_TRACE(std::string(s->name));
    redcount::Reply r = rctest::run(*redis, {"SCRIPT", "LOAD", std::string(s->source)});
    EXPECT_EQ(r.str, s->sha1);
  }
  redis->close();
}

}  // namespace
