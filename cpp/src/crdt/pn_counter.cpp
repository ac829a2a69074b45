#include "redcount/crdt/pn_counter.h"

#include <algorithm>
#include <map>
#include <string_view>
#include <utility>

#include "redcount/common/errors.h"
#include "redcount/common/keys.h"
#include "redcount/common/util.h"
#include "redcount/common/window.h"

namespace redcount {
namespace {

void check_amount(std::int64_t amount) {
  if (amount < 1 || amount > kMaxPnAmount) {
    throw InvalidArgument("amount must be between 1 and 2**53 - 1, got " + std::to_string(amount));
  }
}

// HGETALL's flat field/value array into region -> total; a total that is not a canonical
// non-negative integer is someone else's write, reported rather than guessed at.
void fold(const Reply& r, const std::string& key, bool positive, std::map<std::string, PNComponent>& out) {
  r.check();
  if (r.type != Reply::Type::Array || r.elements.size() % 2 != 0) throw ProtocolError("HGETALL returned an unexpected reply");
  for (std::size_t i = 0; i < r.elements.size(); i += 2) {
    auto field = r.elements[i].as_string();
    auto value = r.elements[i + 1].as_string();
    if (!field || !value || !canonical_uint(*value)) {
      throw ProtocolError("PN-counter hash " + key + " holds a value that is not a non-negative integer");
    }
    PNComponent& c = out[*field];
    c.region = *field;
    (positive ? c.p : c.n) = *parse_int64(*value);
  }
}

}  // namespace


PNCounter::PNCounter(std::shared_ptr<Store> store, PNCounterOptions options)
    : store_(std::move(store)), options_(std::move(options)) {
  if (!store_) throw InvalidArgument("store must not be None");
  validate_name(options_.prefix, "prefix");
  validate_name(options_.name, "name");
  validate_name(options_.region, "region");
  p_key_ = pn_key(options_.prefix, options_.name, "p");
  n_key_ = pn_key(options_.prefix, options_.name, "n");
}

std::shared_ptr<Op<std::int64_t>> PNCounter::make_add(const std::string& key, std::int64_t amount) {
  check_amount(amount);
  std::vector<Request> batch;
  batch.emplace_back(Command{{"HINCRBY", key, options_.region, std::to_string(amount)}});
  return make_batch_op<std::int64_t>(std::move(batch), [](std::vector<Reply>&& r) {
    if (r.size() != 1) throw ProtocolError("HINCRBY: expected one reply");
    return r[0].check().as_integer();
  });
}

std::shared_ptr<Op<std::int64_t>> PNCounter::make_incr(std::int64_t amount) { return make_add(p_key_, amount); }
std::shared_ptr<Op<std::int64_t>> PNCounter::make_decr(std::int64_t amount) { return make_add(n_key_, amount); }

std::shared_ptr<Op<std::vector<PNComponent>>> PNCounter::make_components() {
  std::vector<Request> batch;
  batch.emplace_back(Command{{"HGETALL", p_key_}});
  batch.emplace_back(Command{{"HGETALL", n_key_}});
  return make_batch_op<std::vector<PNComponent>>(std::move(batch), [p = p_key_, n = n_key_](std::vector<Reply>&& r) {
    if (r.size() != 2) throw ProtocolError("HGETALL: expected two replies");
    std::map<std::string, PNComponent> by_region;
    fold(r[0], p, true, by_region);
    fold(r[1], n, false, by_region);
    std::vector<PNComponent> out;
    out.reserve(by_region.size());
    for (auto& [region, c] : by_region) out.push_back(std::move(c));
    return out;
  });
}

std::shared_ptr<Op<std::int64_t>> PNCounter::make_value() {
  auto components = make_components();
  // The same batch, summed: one round trip.
  class ValueOp final : public Op<std::int64_t> {
   public:
    explicit ValueOp(std::shared_ptr<Op<std::vector<PNComponent>>> inner) : inner_(std::move(inner)) {}
    std::vector<Request> prepare() override { return inner_->prepare(); }
    std::vector<Request> finish(std::vector<Reply> replies) override {
      inner_->finish(std::move(replies));
      std::int64_t sum = 0;
      for (const PNComponent& c : inner_->result()) {
        if (__builtin_add_overflow(sum, c.p, &sum) || __builtin_sub_overflow(sum, c.n, &sum)) {
          throw ProtocolError("PN-counter value does not fit in 64 bits");
        }
      }
      complete(sum);
      return {};
    }

   private:
    std::shared_ptr<Op<std::vector<PNComponent>>> inner_;
  };
  return std::make_shared<ValueOp>(std::move(components));
}

std::shared_ptr<Op<std::int64_t>> PNCounter::make_merge_components(const std::vector<PNComponent>& components) {
  for (const PNComponent& c : components) {
    validate_name(c.region, "region");
    if (c.p < 0 || c.n < 0) {
      throw InvalidArgument("component totals must be >= 0, got p=" + std::to_string(c.p) + " n=" + std::to_string(c.n) +
                            " for region '" + c.region + "'");
    }
  }
  std::vector<Request> batch;
  // At least one call, so that an empty merge is an ordinary operation too.
  for (std::size_t i = 0; i == 0 || i < components.size(); i += kMaxPnMergeBatch) {
    ScriptCall call{&kPnMergeScript, {p_key_, n_key_}, {}};
    const std::size_t end = std::min(components.size(), i + kMaxPnMergeBatch);
    call.args.reserve((end - i) * 3);
    for (std::size_t j = i; j < end; ++j) {
      call.args.insert(call.args.end(), {components[j].region, std::to_string(components[j].p), std::to_string(components[j].n)});
    }
    batch.emplace_back(std::move(call));
  }
  return make_batch_op<std::int64_t>(std::move(batch), [](std::vector<Reply>&& r) {
    std::int64_t raised = 0;
    for (const Reply& one : r) raised += one.check().as_integer();
    return raised;
  });
}

std::int64_t PNCounter::incr(std::int64_t amount) { return run(*store_, *make_incr(amount)); }
std::int64_t PNCounter::decr(std::int64_t amount) { return run(*store_, *make_decr(amount)); }
std::int64_t PNCounter::value() { return run(*store_, *make_value()); }
std::vector<PNComponent> PNCounter::components() { return run(*store_, *make_components()); }
std::int64_t PNCounter::merge_components(const std::vector<PNComponent>& components) {
  return run(*store_, *make_merge_components(components));
}

std::int64_t PNCounter::merge(Store& other) {
  auto read = make_components();
  return merge_components(run(other, *read));
}

}  // namespace redcount
