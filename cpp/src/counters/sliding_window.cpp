#include "redcount/counters/sliding_window.h"

#include <limits>

#include "limiters/limiter_internal.h"
#include "redcount/common/errors.h"
#include "redcount/lua_scripts.h"
#include "redcount/common/window.h"

namespace redcount {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// The weight an event member carries beyond 1: "<time>:<id>*<amount>" -> amount - 1.
std::int64_t extra_of(const std::string& member) {
  auto star = member.rfind('*');
  if (star == std::string::npos) return 0;
  auto w = parse_int64(std::string_view(member).substr(star + 1));
  return w && *w > 1 ? *w - 1 : 0;
}

// The memory store's twin of sliding_counter.lua; keep the two in step.
Reply native_sliding_counter(Keyspace& ks, const std::vector<std::string>& keys,
                             const std::vector<std::string>& args) {
  if (args.size() != 5 || keys.empty()) return detail::malformed("sliding_counter");
  auto now = detail::script_time(ks, args[0]);
  auto window = detail::arg_in(args[2], 1, detail::kMaxScriptSpanMs);
  if (!now || !window) return detail::malformed("sliding_counter");
  const std::string& op = args[1];
  const std::int64_t cutoff = *now - *window;
  const double cut = static_cast<double>(cutoff);
  ks.or_reset(keys[0], [&] { return ks.zcard(keys[0]); });  // a foreign value of another type is garbage
  if (op == "unique") {
    ks.zremrangebyscore(keys[0], -kInf, cut);
    ks.zadd(keys[0], static_cast<double>(*now), args[3]);
    ks.pexpireat(keys[0], ks.now_ms() + *window);
    return Reply::of_integer(ks.zcard(keys[0]));
  }
  if (op == "count-unique") {
    return Reply::of_integer(static_cast<std::int64_t>(ks.zrangebyscore(keys[0], cut + 1, kInf).size()));
  }
  if (keys.size() != 2) return detail::malformed("sliding_counter");
  auto raw = ks.or_reset(keys[1], [&] { return ks.get(keys[1]); });
  if (raw && !parse_int64(*raw)) {  // garbage in the weight's place: no weight known
    ks.del(keys[1]);
    raw.reset();
  }
  std::int64_t extra = 0;
  if (raw) {
    extra = *parse_int64(*raw);
    for (const auto& [member, score] : ks.zrangebyscore(keys[0], -kInf, cut)) extra = detail::sat_sub(extra, extra_of(member));
  }
  if (op == "count") {
    return Reply::of_integer(
        detail::sat_add(static_cast<std::int64_t>(ks.zrangebyscore(keys[0], cut + 1, kInf).size()), extra));
  }
  if (op != "add") return detail::malformed("sliding_counter");
  auto amount = detail::arg_in(args[3], 1, kMaxSlidingAmount);
  if (!amount) return detail::malformed("sliding_counter");
  ks.zremrangebyscore(keys[0], -kInf, cut);
  std::string member = std::to_string(*now) + ":" + args[4];
  if (*amount > 1) {
    member += "*" + std::to_string(*amount);
    extra = detail::sat_add(extra, *amount - 1);
  }
  ks.zadd(keys[0], static_cast<double>(*now), member);
  ks.pexpireat(keys[0], ks.now_ms() + *window);
  if (extra > 0) {
    ks.del(keys[1]);
    ks.set_nx_pxat(keys[1], std::to_string(extra), ks.now_ms() + *window);
  } else if (raw) {
    ks.del(keys[1]);
  }
  return Reply::of_integer(detail::sat_add(ks.zcard(keys[0]), extra));
}

}  // namespace

const Script kSlidingCounterScript{"sliding_counter", lua::sliding_counter_source, lua::sliding_counter_sha1,
                                   &native_sliding_counter};

SlidingWindowCounter::SlidingWindowCounter(std::shared_ptr<Store> store, std::string name, std::int64_t window_ms,
                                           std::string prefix, ClockMode clock)
    : store_(std::move(store)),
      name_(std::move(name)),
      window_ms_(window_ms),
      prefix_(std::move(prefix)),
      time_(store_, clock) {
  validate_name(prefix_, "prefix");
  validate_name(name_, "name");
  validate(WindowSpec{window_ms_, 0, false});
  if (window_ms_ > kMaxLongTimeoutMs) throw InvalidArgument("window is too long (at most about 34 years)");
}

std::string SlidingWindowCounter::events_key(std::string_view key) const {
  validate_key(key);
  return sliding_counter_key(prefix_, name_, key, window_ms_, "log");
}
std::string SlidingWindowCounter::weight_key(std::string_view key) const {
  validate_key(key);
  return sliding_counter_key(prefix_, name_, key, window_ms_, "log:w");
}
std::string SlidingWindowCounter::unique_key(std::string_view key) const {
  validate_key(key);
  return sliding_counter_key(prefix_, name_, key, window_ms_, "uniq");
}

namespace {

// One sliding_counter.lua call as a ClockedScript spec.
struct CounterSpec {
  std::vector<std::string> keys;
  const char* op;
  std::int64_t window_ms;
  std::string arg;
  std::string id;

  ScriptCall call(std::optional<std::int64_t> now) const {
    return ScriptCall{&kSlidingCounterScript, keys,
                      {now ? std::to_string(*now) : "", op, std::to_string(window_ms), arg, id}};
  }
  std::int64_t finish(Reply reply) const {
    reply.check();
    return reply.as_integer();
  }
};

}  // namespace

std::shared_ptr<Op<std::int64_t>> SlidingWindowCounter::script_op(const char* op, std::vector<std::string> keys,
                                                                  std::string arg) {
  return make_clocked_script<std::int64_t>(
      time_, 1, CounterSpec{std::move(keys), op, window_ms_, std::move(arg), detail::unique_id()});
}

std::shared_ptr<Op<std::int64_t>> SlidingWindowCounter::make_add(std::string_view key, std::int64_t amount) {
  if (amount < 1 || amount > kMaxSlidingAmount) {
    throw InvalidArgument("amount must be between 1 and 2^32, got " + std::to_string(amount));
  }
  return script_op("add", {events_key(key), weight_key(key)}, std::to_string(amount));
}

std::shared_ptr<Op<std::int64_t>> SlidingWindowCounter::make_count(std::string_view key) {
  return script_op("count", {events_key(key), weight_key(key)}, "");
}

std::shared_ptr<Op<std::int64_t>> SlidingWindowCounter::make_add_unique(std::string_view key, std::string_view item) {
  validate_key(item, "item");
  return script_op("unique", {unique_key(key)}, std::string(item));
}

std::shared_ptr<Op<std::int64_t>> SlidingWindowCounter::make_count_unique(std::string_view key) {
  return script_op("count-unique", {unique_key(key)}, "");
}

std::shared_ptr<Op<std::monostate>> SlidingWindowCounter::make_clear(std::string_view key) {
  return detail::make_delete({events_key(key), weight_key(key), unique_key(key)});
}

std::int64_t SlidingWindowCounter::add(std::string_view key, std::int64_t amount) {
  return run(*store_, *make_add(key, amount));
}
std::int64_t SlidingWindowCounter::count(std::string_view key) { return run(*store_, *make_count(key)); }
std::int64_t SlidingWindowCounter::add_unique(std::string_view key, std::string_view item) {
  return run(*store_, *make_add_unique(key, item));
}
std::int64_t SlidingWindowCounter::count_unique(std::string_view key) { return run(*store_, *make_count_unique(key)); }
void SlidingWindowCounter::clear(std::string_view key) { run(*store_, *make_clear(key)); }

}  // namespace redcount
