#include "redcount/time_source.h"

#include "redcount/errors.h"
#include "redcount/lua_scripts.h"
#include "redcount/util.h"

namespace redcount {
namespace {

constexpr auto kResyncEvery = std::chrono::seconds(10);

Reply native_time_probe(Keyspace& ks, const std::vector<std::string>&, const std::vector<std::string>&) {
  const std::int64_t now = ks.now_ms();
  return Reply::of_array({Reply::of_integer(now / 1000), Reply::of_integer((now % 1000) * 1000)});
}

}  // namespace

const Script kTimeProbeScript{"time_probe", lua::time_probe_source, lua::time_probe_sha1, &native_time_probe};

ClockMode parse_clock_mode(std::string_view text) {
  if (text == "client") return ClockMode::Client;
  if (text == "server") return ClockMode::Server;
  if (text == "server-offset") return ClockMode::ServerOffset;
  throw InvalidArgument("unknown clock '" + std::string(text) + "' (known: client, server, server-offset)");
}

std::string_view clock_mode_name(ClockMode mode) noexcept {
  switch (mode) {
    case ClockMode::Client: return "client";
    case ClockMode::Server: return "server";
    case ClockMode::ServerOffset: return "server-offset";
  }
  return "client";
}

TimeSource::TimeSource(std::shared_ptr<Store> store, ClockMode mode)
    : store_(std::move(store)), requested_(mode), effective_(mode) {
  if (!store_) throw InvalidArgument("store must not be None");
}

std::int64_t TimeSource::now_ms() {
  const std::int64_t client = store_->now_ms();
  if (effective() == ClockMode::Client || store_->is_memory()) return client;
  return client + offset_ms();
}

std::string TimeSource::script_now(std::int64_t scale) {
  if (effective() == ClockMode::Server) return "";
  return std::to_string(now_ms() * scale);
}

Reply TimeSource::run(ScriptCall call, std::size_t now_arg, std::int64_t scale) {
  call.args.at(now_arg) = script_now(scale);
  Reply r = store_->execute_one(call);
  if (r.type == Reply::Type::Error && call.args[now_arg].empty() && !script_time_allowed()) {
    // The server will not run TIME inside scripts (an ACL, a renamed command, an old
    // server): measure its clock from outside instead.
    effective_.store(ClockMode::ServerOffset, std::memory_order_release);
    call.args[now_arg] = script_now(scale);
    r = store_->execute_one(std::move(call));
  }
  return r;
}

bool TimeSource::script_time_allowed() {
  // Error replies say little about which command failed inside a script, so ask directly.
  Reply probe = store_->execute_one(ScriptCall{&kTimeProbeScript, {}, {}});
  return probe.type != Reply::Type::Error;
}

std::int64_t TimeSource::offset_ms() {
  std::lock_guard<std::mutex> lock(mu_);
  const auto steady = std::chrono::steady_clock::now();
  if (synced_ && steady - synced_at_ < kResyncEvery) return offset_;
  const std::int64_t t0 = store_->now_ms();
  Reply r = store_->execute_one(Command{{"TIME"}});
  const std::int64_t t1 = store_->now_ms();
  if (r.type == Reply::Type::Error) {
    throw ReplyError("clock='" + std::string(clock_mode_name(requested_)) +
                     "' needs the Redis TIME command, which this server refused (" + r.str +
                     "); use clock='client' or allow TIME");
  }
  if (r.type != Reply::Type::Array || r.elements.size() != 2) throw ProtocolError("TIME returned an unexpected reply");
  const std::int64_t server = r.elements[0].as_integer() * 1000 + r.elements[1].as_integer() / 1000;
  offset_ = server - (t0 + t1) / 2;
  synced_ = true;
  synced_at_ = steady;
  return offset_;
}

}  // namespace redcount
