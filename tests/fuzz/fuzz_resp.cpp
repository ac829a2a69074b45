// libFuzzer target: replies from a server. Bytes go through resp::Parser (hiredis's reader
// and redcount's conversion into Reply), fed in chunks of a size the input picks, and every
// reply that comes out is handed to each place that reads a server's reply: the Reply
// accessors, CLUSTER SLOTS and MOVED/ASK parsing, ROLE, SENTINEL get-master-addr-by-name,
// the TIME probe and the "did not run" classification.
//
// Input: one byte choosing the chunk size, then the byte stream. Bad bytes must end in
// ProtocolError (or another redcount::Error from a reader of the reply), never a crash.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "redcount/common/errors.h"
#include "redcount/memory/memory_store.h"
#include "redcount/redis/topology/cluster.h"
#include "redcount/redis/io/pipeline.h"
#include "redcount/redis/io/resp.h"
#include "redcount/redis/io/role.h"
#include "redcount/redis/topology/sentinel.h"
#include "redcount/store/time_source.h"

using namespace redcount;

namespace {

template <typename F>
void tolerate(F&& f) {
  try {
    f();
  } catch (const Error&) {
  }
}

void use(const Reply& r) {
  static const auto store = [] {
    StoreOptions o;
    o.sweep_interval = std::chrono::milliseconds(0);
    return std::make_shared<MemoryStore>(o);
  }();
  static TimeSource time(store, ClockMode::ServerOffset);
  tolerate([&] { r.check(); });
  tolerate([&] { (void)r.as_integer(); });
  tolerate([&] { (void)r.as_string(); });
  tolerate([&] { (void)redis::parse_cluster_slots(r, "10.0.0.1"); });
  tolerate([&] { (void)redis::parse_redirect(r); });
  tolerate([&] { (void)redis::parse_role(r); });
  tolerate([&] { redis::expect_master(r, "10.0.0.1:6379"); });
  tolerate([&] { (void)redis::SentinelResolver::parse_master_reply(r); });
  tolerate([&] { time.record_time(r, 1'700'000'000'000, 1'700'000'000'010); });
  (void)redis::did_not_run(r, Command{{"INCR", "k"}});
  (void)redis::did_not_run(r, Command{{"INCR", "k"}}, true);
  for (const Reply& e : r.elements) {
    tolerate([&] { (void)e.as_integer(); });
    tolerate([&] { (void)redis::parse_redirect(e); });
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const std::size_t chunk = data[0] == 0 ? size : data[0];
  std::string_view bytes(reinterpret_cast<const char*>(data + 1), size - 1);
  resp::Parser parser;
  try {
    while (!bytes.empty()) {
      const std::string_view part = bytes.substr(0, chunk);
      bytes.remove_prefix(part.size());
      parser.feed(part.data(), part.size());
      while (auto reply = parser.next()) use(*reply);
    }
  } catch (const ProtocolError&) {
  }
  return 0;
}
