#include "redcount/counters/sliding_window.h"

#include <limits>

#include "store/script_args.h"
#include "redcount/common/errors.h"
#include "redcount/common/window.h"

namespace redcount {
namespace {

}  // namespace


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
