#include "redcount/store/time_source.h"

#include "redcount/common/errors.h"
#include "redcount/common/util.h"

namespace redcount {
namespace {

constexpr auto kResyncEvery = std::chrono::seconds(10);

}  // namespace


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

TimeSource::TimeSource(std::shared_ptr<Store> store, ClockMode mode) : state_(std::make_shared<State>()) {
  if (!store) throw InvalidArgument("store must not be None");
  state_->store = std::move(store);
  state_->requested = mode;
  state_->effective.store(mode);
}

bool TimeSource::offset_stale() const {
  if (!needs_offset()) return false;
  std::lock_guard<std::mutex> lock(state_->mu);
  return !state_->synced || std::chrono::steady_clock::now() - state_->synced_at >= kResyncEvery;
}

std::int64_t TimeSource::now_ms() const {
  const std::int64_t client = state_->store->now_ms();
  if (!needs_offset()) return client;
  std::lock_guard<std::mutex> lock(state_->mu);
  return client + state_->offset;
}

void TimeSource::record_time(const Reply& r, std::int64_t sent_ms, std::int64_t received_ms) {
  if (r.type == Reply::Type::Error) {
    throw ReplyError("clock='" + std::string(clock_mode_name(requested())) +
                     "' needs the Redis TIME command, which this server refused (" + r.str +
                     "); use clock='client' or allow TIME");
  }
  if (r.type != Reply::Type::Array || r.elements.size() != 2) throw ProtocolError("TIME returned an unexpected reply");
  const std::int64_t server = r.elements[0].as_integer() * 1000 + r.elements[1].as_integer() / 1000;
  std::lock_guard<std::mutex> lock(state_->mu);
  state_->offset = server - (sent_ms + received_ms) / 2;
  state_->synced = true;
  state_->synced_at = std::chrono::steady_clock::now();
}

}  // namespace redcount
