#include "redcount/sharded/quota.h"

#include "redcount/common/bounds.h"
#include "redcount/common/errors.h"
#include "redcount/common/keys.h"
#include "redcount/common/util.h"
#include "redcount/common/window.h"

namespace redcount {
namespace {

void check_amount(std::int64_t n, const char* what) {
  if (n < 1 || n > kMaxQuota) {
    throw InvalidArgument(std::string(what) + " must be between 1 and 2**53 - 1, got " + std::to_string(n));
  }
}

}  // namespace


Quota::Quota(std::shared_ptr<Store> store, QuotaOptions options) : store_(std::move(store)), options_(std::move(options)) {
  if (!store_) throw InvalidArgument("store must not be None");
  validate_name(options_.prefix, "prefix");
  validate_name(options_.name, "name");
  const QuotaOptions& o = options_;
  auto in_range = [](std::int64_t v) { return v >= -kMaxQuota && v <= kMaxQuota; };
  if (!in_range(o.floor)) throw InvalidArgument("floor must be within +-(2**53 - 1), got " + std::to_string(o.floor));
  if (o.ceiling && (!in_range(*o.ceiling) || *o.ceiling < o.floor)) {
    throw InvalidArgument("ceiling must be >= floor (" + std::to_string(o.floor) + ") and <= 2**53 - 1, got " +
                          std::to_string(*o.ceiling));
  }
  if (o.soft && !in_range(*o.soft)) throw InvalidArgument("soft must be within +-(2**53 - 1)");
  if (o.idempotency_ttl_ms < 1) throw InvalidArgument("idempotency_ttl must be > 0 seconds");
  if (o.durable < 0 || o.durable > 1000) {
    throw InvalidArgument("durable must be between 0 and 1000 replicas, got " + std::to_string(o.durable));
  }
  if (o.reset_to < o.floor || o.reset_to > o.ceiling.value_or(kMaxQuota)) {
    throw InvalidArgument("reset_to must be between the floor (" + std::to_string(o.floor) + ") and the ceiling, got " +
                          std::to_string(o.reset_to));
  }
  if (o.grace_ms < 0 || o.grace_ms > kMaxCounterSpanMs) throw InvalidArgument("grace must be >= 0 seconds");
  if (o.durable > 0 && o.durable_timeout.count() < 1) {
    throw InvalidArgument("durable_timeout must be >= 0.001 seconds (WAIT with 0 would wait forever)");
  }
  key_ = quota_key(o.prefix, o.name);
}

Quota::Place Quota::place() const {
  if (!options_.calendar) return Place{key_, Period{}};
  const Period p = options_.calendar->period(options_.period, store_->now_ms());
  // One key per period: its length and start name it, as for calendar windows.
  return Place{key_ + ":" + std::to_string(p.end_ms - p.start_ms) + ":" + std::to_string(p.start_ms), p};
}

std::string Quota::storage_key() const { return place().key; }
Period Quota::period() const { return place().period; }

// WAIT after a write: marked blocking, so the store sends the write and this WAIT on a
// connection of their own (WAIT counts the replicas that have the last write of the
// connection it runs on) and gives the call durable_timeout on top of command_timeout.
Command Quota::wait_command() const {
  Command wait{{"WAIT", std::to_string(options_.durable), std::to_string(options_.durable_timeout.count())}};
  wait.blocks_for = options_.durable_timeout;
  return wait;
}

namespace {

// Reads the reply of the write (script or SET) and of the WAIT after it, if any.
struct QuotaFinish {
  std::int64_t set_value = 0;  // for set(): the value written
  bool is_set = false;
  std::optional<std::int64_t> soft;
  std::int64_t durable = 0;

  QuotaResult operator()(std::vector<Reply>&& replies) const {
    if (replies.size() != (durable > 0 ? 2u : 1u)) throw ProtocolError("quota: reply count mismatch");
    replies[0].check();
    QuotaResult r;
    if (is_set) {
      r.applied = true;
      r.value = set_value;
    } else {
      const Reply& a = replies[0];
      if (a.type != Reply::Type::Array || a.elements.size() != 3) throw ProtocolError("quota returned an unexpected reply");
      r.applied = a.elements[0].as_integer() == 1;
      r.value = a.elements[1].as_integer();
      r.duplicate = a.elements[2].as_integer() == 1;
    }
    r.soft_exceeded = soft && r.value < *soft;
    if (durable > 0) {
      replies[1].check();
      r.replicas = replies[1].as_integer();
      // Only a write that changed something needs its replicas.
      r.durable_ok = !(r.applied && !r.duplicate) || r.replicas >= durable;
    }
    return r;
  }
};

}  // namespace

std::shared_ptr<Op<QuotaResult>> Quota::make_change(const char* op, std::int64_t n, std::string_view request_id) {
  check_amount(n, "n");
  if (!request_id.empty()) validate_request_id(request_id);
  const Place at = place();
  ScriptCall call{&kQuotaScript, {at.key}, {op, std::to_string(n), std::to_string(options_.floor),
                                           std::to_string(options_.ceiling.value_or(kMaxQuota)),
                                           std::to_string(options_.idempotency_ttl_ms)}};
  if (options_.calendar) {
    call.args.push_back(std::to_string(options_.reset_to));
    call.args.push_back(std::to_string(at.period.end_ms + options_.grace_ms));
  }
  if (!request_id.empty()) call.keys.push_back(request_id_key(at.key, request_id));
  std::vector<Request> batch;
  batch.emplace_back(std::move(call));
  if (options_.durable > 0) {
    batch.push_back(wait_command());
  }
  return make_batch_op<QuotaResult>(std::move(batch), QuotaFinish{0, false, options_.soft, options_.durable});
}

std::shared_ptr<Op<QuotaResult>> Quota::make_take(std::int64_t n, std::string_view request_id) {
  return make_change("take", n, request_id);
}

std::shared_ptr<Op<QuotaResult>> Quota::make_give(std::int64_t n, std::string_view request_id) {
  return make_change("give", n, request_id);
}

std::shared_ptr<Op<QuotaResult>> Quota::make_set(std::int64_t value) {
  const std::int64_t ceiling = options_.ceiling.value_or(kMaxQuota);
  if (value < options_.floor || value > ceiling) {
    throw InvalidArgument("value must be between the floor (" + std::to_string(options_.floor) + ") and the ceiling (" +
                          std::to_string(ceiling) + "), got " + std::to_string(value));
  }
  const Place at = place();
  Command set{{"SET", at.key, std::to_string(value)}};
  if (options_.calendar) {
    set.args.push_back("PXAT");
    set.args.push_back(std::to_string(at.period.end_ms + options_.grace_ms));
  }
  std::vector<Request> batch;
  batch.emplace_back(std::move(set));
  if (options_.durable > 0) {
    batch.push_back(wait_command());
  }
  return make_batch_op<QuotaResult>(std::move(batch), QuotaFinish{value, true, options_.soft, options_.durable});
}

std::shared_ptr<Op<std::int64_t>> Quota::make_value() {
  std::vector<Request> batch;
  batch.emplace_back(Command{{"GET", place().key}});
  const std::int64_t start = options_.calendar ? options_.reset_to : 0;
  return make_batch_op<std::int64_t>(std::move(batch), [start](std::vector<Reply>&& r) {
    if (r.size() != 1) throw ProtocolError("GET: expected one reply");
    r[0].check();
    return r[0].is_nil() ? start : r[0].as_integer();
  });
}

QuotaResult Quota::take(std::int64_t n, std::string_view request_id) { return run(*store_, *make_take(n, request_id)); }
QuotaResult Quota::give(std::int64_t n, std::string_view request_id) { return run(*store_, *make_give(n, request_id)); }
QuotaResult Quota::set(std::int64_t value) { return run(*store_, *make_set(value)); }
std::int64_t Quota::value() { return run(*store_, *make_value()); }

}  // namespace redcount
