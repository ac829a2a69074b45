// make_gated (gate.h): the penalty's block check inside a decision's round trip.
#include "redcount/limiters/gate.h"

#include <algorithm>
#include <string_view>
#include <utility>

#include "redcount/common/errors.h"
#include "redcount/store/scripts.h"

namespace redcount {
namespace {

bool has_gate(const Script* s) noexcept {
  return s == &kFixedWindowHitScript || s == &kSlidingLogScript || s == &kSlidingApproxScript ||
         s == &kTokenBucketScript || s == &kGcraScript;
}

class GatedOp final : public Op<Gated> {
 public:
  GatedOp(std::shared_ptr<Op<Decision>> inner, std::vector<std::string> gates)
      : inner_(std::move(inner)), gates_(std::move(gates)) {
    meter = inner_->meter;
    meter_items = inner_->meter_items;
  }

  std::vector<Request> prepare() override { return gate(inner_->prepare()); }

  std::vector<Request> finish(std::vector<Reply> replies) override {
    std::int64_t longest = 0;
    for (std::size_t i = 0; i < probes_ && i < replies.size(); ++i) {
      if (replies[i].type == Reply::Type::Integer) longest = std::max(longest, replies[i].integer);
    }
    for (std::size_t i : folded_) {
      if (probes_ + i >= replies.size()) continue;
      const Reply& r = replies[probes_ + i];
      if (r.type == Reply::Type::Array && r.elements.size() == 2 && r.elements[0].type == Reply::Type::Integer &&
          r.elements[0].integer == -1 && r.elements[1].type == Reply::Type::Integer) {
        longest = std::max(longest, r.elements[1].integer);
      }
    }
    if (longest > 0) {
      complete(Gated{std::nullopt, longest});
      return {};
    }
    replies.erase(replies.begin(), replies.begin() + static_cast<std::ptrdiff_t>(std::min(probes_, replies.size())));
    return next(inner_->finish(std::move(replies)));
  }

  std::vector<Request> fail(std::exception_ptr error) override { return next(inner_->fail(error)); }

 private:
  std::vector<Request> next(std::vector<Request> batch) {
    if (batch.empty()) {
      complete(Gated{inner_->take(), 0});
      return {};
    }
    return gate(std::move(batch));
  }

  // Folds the block keys into every hit script of the batch (a rerun after a clock probe
  // carries them again), or, in a batch without one, puts a PTTL of each in front until a
  // script has carried them; after that, batches without a hit script (a charge-then-
  // release's give-back) go as they are.
  std::vector<Request> gate(std::vector<Request> batch) {
    probes_ = 0;
    folded_.clear();
    if (batch.empty()) return batch;
    for (std::size_t i = 0; i < batch.size(); ++i) {
      auto* call = std::get_if<ScriptCall>(&batch[i]);
      if (call == nullptr || !has_gate(call->script)) continue;
      if (call->typed) {
        // The typed twins take no gate: the call goes as text (the operation keeps its
        // typed arguments, unanswered, and reads the reply).
        if (call->args.empty()) call->args = call->typed->render();
        call->typed = nullptr;
      }
      call->keys.insert(call->keys.end(), gates_.begin(), gates_.end());
      call->args.push_back("gate:" + std::to_string(gates_.size()));
      folded_.push_back(i);
    }
    if (!folded_.empty()) {
      checked_ = true;
      return batch;
    }
    if (checked_) return batch;
    std::vector<Request> out;
    out.reserve(gates_.size() + batch.size());
    for (const auto& g : gates_) out.emplace_back(Command{{"PTTL", g}});
    probes_ = gates_.size();
    for (auto& r : batch) out.push_back(std::move(r));
    return out;
  }

  std::shared_ptr<Op<Decision>> inner_;
  std::vector<std::string> gates_;
  std::size_t probes_ = 0;           // PTTLs in front of the last batch
  std::vector<std::size_t> folded_;  // the last batch's requests that carried the gate
  bool checked_ = false;             // a script has carried the gate
};

}  // namespace

std::shared_ptr<Op<Gated>> make_gated(std::shared_ptr<Op<Decision>> decision, std::vector<std::string> gates) {
  if (gates.empty()) throw InvalidArgument("a gated decision needs at least one block key");
  return std::make_shared<GatedOp>(std::move(decision), std::move(gates));
}

}  // namespace redcount
