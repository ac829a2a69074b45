// libFuzzer target: the memory store's command interpreter and the native twins of the
// scripts, driven with random commands, options and arguments against one keyspace, with a
// manual clock that the input moves forward (keys expire and the sweep frees them).
//
// Every request must end in a reply (an error reply for a bad one, as Redis gives); an
// exception other than redcount's own errors, a sanitizer report or a broken invariant of
// the keyspace is a finding.
#include <fuzzer/FuzzedDataProvider.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "redcount/common/clock.h"
#include "redcount/common/errors.h"
#include "redcount/memory/memory_store.h"
#include "redcount/store/scripts.h"

using namespace redcount;

namespace {

constexpr std::array<std::string_view, 56> kCommands{
    "PING",  "TIME",     "GET",     "SET",     "INCR",      "DECR",        "INCRBY",     "DECRBY",
    "DEL",   "UNLINK",   "EXISTS",  "TYPE",    "PTTL",      "TTL",         "PEXPIREAT",  "PEXPIRE",
    "EXPIREAT", "EXPIRE", "PERSIST", "DBSIZE", "KEYS",      "WAIT",        "FLUSHALL",   "FLUSHDB",
    "ZADD",  "ZREM",     "ZCARD",   "ZSCORE",  "ZCOUNT",    "ZRANGE",      "ZRANGEBYSCORE", "ZREMRANGEBYSCORE",
    "HSET",  "HGET",     "HMGET",   "HGETALL", "HDEL",      "HLEN",        "HEXISTS",    "HINCRBY",
    "XADD",  "XLEN",     "XRANGE",  "XREVRANGE", "XDEL",    "XGROUP",      "XREADGROUP", "XACK",
    "XPENDING", "XAUTOCLAIM", "set", "zadd",   "xadd",      "Hset",        "NOSUCH",     "",
};

constexpr std::array<std::string_view, 14> kKeys{
    "k", "n", "z", "h", "s", "{t}a", "{t}b", "{t}:ids", "{t}:log", "g", "c", "k:1", "k:2", "*",
};

constexpr std::array<std::string_view, 72> kTokens{
    // numbers, including the edges of int64 and of doubles
    "0", "1", "2", "3", "10", "100", "-1", "-2", "1000", "60000", "1700000000000", "9007199254740991",
    "9007199254740992", "9223372036854775807", "-9223372036854775808", "9223372036854775808", "1.5", "-0.5",
    "1e308", "inf", "-inf", "+inf", "nan", "(1", "(-inf", "01", " 1", "",
    // options of the commands above
    "NX", "XX", "GT", "LT", "CH", "INCR", "EX", "PX", "EXAT", "PXAT", "KEEPTTL", "WITHSCORES", "LIMIT",
    "BYSCORE", "BYLEX", "REV", "COUNT", "MAXLEN", "MINID", "~", "=", "NOMKSTREAM", "MKSTREAM", "ENTRIESREAD",
    "CREATE", "DESTROY", "GROUP", "STREAMS", "BLOCK", "NOACK", "JUSTID", "IDLE",
    // stream ids and range ends
    "*", "$", ">", "-", "+", "0-0", "0-1", "1-*", "18446744073709551615-18446744073709551615", "1-18446744073709551615",
};

std::string token(FuzzedDataProvider& in) {
  switch (in.ConsumeIntegralInRange<int>(0, 5)) {
    case 0:
    case 1:
      return std::string(kKeys[in.ConsumeIntegralInRange<std::size_t>(0, kKeys.size() - 1)]);
    case 2:
      return in.ConsumeRandomLengthString(24);
    case 3:
      return std::to_string(in.ConsumeIntegral<std::int64_t>());
    default:
      return std::string(kTokens[in.ConsumeIntegralInRange<std::size_t>(0, kTokens.size() - 1)]);
  }
}

Request command(FuzzedDataProvider& in) {
  Command c;
  if (in.ConsumeIntegralInRange<int>(0, 15) == 0) {
    c.args.push_back(in.ConsumeRandomLengthString(12));
  } else {
    c.args.emplace_back(kCommands[in.ConsumeIntegralInRange<std::size_t>(0, kCommands.size() - 1)]);
  }
  const int n = in.ConsumeIntegralInRange<int>(0, 9);
  for (int i = 0; i < n; ++i) c.args.push_back(token(in));
  return c;
}

Request script_call(FuzzedDataProvider& in) {
  const auto& scripts = all_scripts();
  ScriptCall call;
  call.script = scripts[in.ConsumeIntegralInRange<std::size_t>(0, scripts.size() - 1)];
  const int keys = in.ConsumeIntegralInRange<int>(0, 4);
  for (int i = 0; i < keys; ++i) {
    call.keys.emplace_back(kKeys[in.ConsumeIntegralInRange<std::size_t>(0, kKeys.size() - 1)]);
  }
  const int args = in.ConsumeIntegralInRange<int>(0, 14);
  for (int i = 0; i < args; ++i) call.args.push_back(token(in));
  return call;
}

void require(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "invariant broken: %s\n", what);
    std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  FuzzedDataProvider in(data, size);
  auto clock = std::make_shared<ManualClock>(1'700'000'000'000);
  StoreOptions options;
  options.clock = clock;
  options.sweep_interval = std::chrono::milliseconds(0);  // no sweeper thread: sweeps are inputs
  MemoryStore store(options);
  int steps = 0;
  while (in.remaining_bytes() > 0 && ++steps < 64) {
    switch (in.ConsumeIntegralInRange<int>(0, 9)) {
      case 8:
        clock->advance(in.ConsumeIntegralInRange<std::int64_t>(0, 120'000));
        continue;
      case 9:
        store.sweep();
        continue;
      default:
        break;
    }
    std::vector<Request> batch;
    const int n = in.ConsumeIntegralInRange<int>(1, 3);
    for (int i = 0; i < n; ++i) batch.push_back(in.ConsumeBool() ? command(in) : script_call(in));
    std::vector<Reply> replies;
    try {
      replies = store.execute(batch);
    } catch (const Error&) {
      continue;
    }
    require(replies.size() == batch.size(), "one reply per request");
  }
  // The keyspace still answers for every key it lists.
  const Reply keys = store.execute_one(Command{{"KEYS", "*"}});
  require(keys.type == Reply::Type::Array, "KEYS answers an array");
  for (const Reply& k : keys.elements) {
    const Reply type = store.execute_one(Command{{"TYPE", k.str}});
    require(type.type == Reply::Type::Status && type.str != "none", "a listed key has a type");
  }
  const Reply dbsize = store.execute_one(Command{{"DBSIZE"}});
  require(dbsize.integer == static_cast<std::int64_t>(keys.elements.size()), "DBSIZE counts what KEYS lists");
  return 0;
}
