// The sharded counter's reads: value(), shard_values(), values() and the cached read().
#include "sharded/sharded_core.h"

namespace redcount {
namespace {

using Core = ShardedCounter::Core;

using sharded_detail::layout_text;

std::int64_t shard_reply(const Reply& r) {
  r.check();
  if (r.is_nil()) return 0;
  return r.as_integer();
}

std::int64_t checked_sum(const std::vector<std::int64_t>& v) {
  std::int64_t total = 0;
  for (std::int64_t x : v) {
    if (__builtin_add_overflow(total, x, &total)) {
      throw Error("the shards' sum does not fit in a signed 64-bit integer");
    }
  }
  return total;
}


// The shard values of some counters, with each counter's layout read in the same batch
// (first, so a generation added after it was read only holds writes later than the read
// began): when a layout differs from the one whose shards were read, the batch is sent
// again with the new shards (a follow-up step), so every generation is always summed.
class ShardReads {
 public:
  ShardReads(std::shared_ptr<Core> core, std::vector<std::string> names)
      : core_(std::move(core)), names_(std::move(names)) {}

  std::vector<Request> batch() {
    if (++rounds_ > 8) {
      throw Error("the shard layout of '" + printable(names_.front()) +
                  "' kept changing while it was read (8 reshards during one read?)");
    }
    believed_.clear();
    std::vector<Request> out;
    for (const auto& n : names_) {
      believed_.push_back(core_->known(n));
      out.emplace_back(Command{{"GET", sharded_layout_key(core_->options.prefix, n)}});
      for (auto& k : core_->shard_keys(n, believed_.back().layout)) out.emplace_back(Command{{"GET", std::move(k)}});
    }
    sent_ = SteadyClock::now();
    return out;
  }

  // True with `out` (per name, its shards' values in index order) when every layout was the
  // believed one; false after learning the changed ones: send batch() again.
  bool take(const std::vector<Reply>& replies, std::vector<std::vector<std::int64_t>>& out) {
    out.clear();
    bool same = true;
    std::size_t at = 0;
    for (std::size_t i = 0; i < names_.size(); ++i) {
      const std::size_t n = static_cast<std::size_t>(believed_[i].layout.total());
      if (at + 1 + n > replies.size()) throw ProtocolError("sharded read: reply count mismatch");
      const std::string text = layout_text(replies[at]);
      if (text != believed_[i].text) {
        same = false;
        core_->learn(names_[i], text, sent_);
      } else if (same) {
        std::vector<std::int64_t> v;
        v.reserve(n);
        for (std::size_t j = 0; j < n; ++j) v.push_back(shard_reply(replies[at + 1 + j]));
        out.push_back(std::move(v));
      }
      at += 1 + n;
    }
    if (same) {
      // A confirmed layout is as good as a fresh read of it for the writers.
      for (std::size_t i = 0; i < names_.size(); ++i) core_->learn(names_[i], believed_[i].text, sent_);
    }
    return same;
  }

  SteadyClock::time_point sent() const { return sent_; }

 private:
  std::shared_ptr<Core> core_;
  std::vector<std::string> names_;
  std::vector<Core::KnownLayout> believed_;
  SteadyClock::time_point sent_{};
  int rounds_ = 0;
};

// value(), shard_values(), values(): the shard values of `names`, reduced by `reduce`.
template <class T>
class ShardReadOp final : public Op<T> {
 public:
  using Reduce = std::function<T(std::vector<std::vector<std::int64_t>>&&)>;
  ShardReadOp(std::shared_ptr<Core> core, std::vector<std::string> names, Reduce reduce)
      : reads_(std::move(core), std::move(names)), reduce_(std::move(reduce)) {}

  std::vector<Request> prepare() override { return reads_.batch(); }

  std::vector<Request> finish(std::vector<Reply> replies) override {
    std::vector<std::vector<std::int64_t>> v;
    if (!reads_.take(replies, v)) return reads_.batch();
    this->complete(reduce_(std::move(v)));
    return {};
  }

 private:
  ShardReads reads_;
  Reduce reduce_;
};

// read(): from the cache, or a fresh sum that refreshes it.
class ReadOp final : public Op<Reading> {
 public:
  ReadOp(std::shared_ptr<Core> core, std::int64_t max_staleness_ms)
      : core_(core), max_(std::chrono::milliseconds(max_staleness_ms)), reads_(core, {core->options.name}) {
    with_meter(this, Meter::Read);
  }

  std::vector<Request> prepare() override {
    const auto now = SteadyClock::now();
    {
      std::lock_guard<std::mutex> lock(core_->cache_mu);
      if (core_->cached) {
        const auto age = now - core_->cached_at;
        // A refresh younger than this is still running: take the cached value meanwhile
        // (older ones are taken as lost, e.g. a cancelled coroutine).
        const bool refreshing = now - core_->refresh_started < std::max<SteadyClock::duration>(max_, std::chrono::seconds(1));
        if (age <= max_ || refreshing) {
          complete(Reading{*core_->cached, ms(age)});
          return {};
        }
      }
      core_->refresh_started = now;
    }
    sent_ = now;
    return reads_.batch();
  }

  std::vector<Request> finish(std::vector<Reply> replies) override {
    std::int64_t total;
    try {
      std::vector<std::vector<std::int64_t>> v;
      if (!reads_.take(replies, v)) return reads_.batch();
      total = checked_sum(v.front());
    } catch (...) {
      forget_refresh();
      throw;
    }
    {
      std::lock_guard<std::mutex> lock(core_->cache_mu);
      if (!core_->cached || core_->cached_at <= sent_) {
        core_->cached = total;
        core_->cached_at = sent_;
      }
      core_->refresh_started = {};
    }
    complete(Reading{total, ms(SteadyClock::now() - sent_)});
    return {};
  }

  std::vector<Request> fail(std::exception_ptr error) override {
    forget_refresh();
    std::rethrow_exception(error);
  }

 private:
  static std::int64_t ms(SteadyClock::duration d) {
    return std::chrono::duration_cast<std::chrono::milliseconds>(d).count();
  }
  void forget_refresh() {
    std::lock_guard<std::mutex> lock(core_->cache_mu);
    core_->refresh_started = {};
  }

  std::shared_ptr<Core> core_;
  SteadyClock::duration max_;
  ShardReads reads_;
  SteadyClock::time_point sent_{};
};

}  // namespace

std::shared_ptr<Op<std::vector<std::int64_t>>> ShardedCounter::make_shard_values() {
  return std::make_shared<ShardReadOp<std::vector<std::int64_t>>>(
      core_, std::vector<std::string>{core_->options.name},
      [](std::vector<std::vector<std::int64_t>>&& v) { return std::move(v.front()); });
}

std::shared_ptr<Op<std::int64_t>> ShardedCounter::make_value() {
  return with_meter(std::make_shared<ShardReadOp<std::int64_t>>(
                        core_, std::vector<std::string>{core_->options.name},
                        [](std::vector<std::vector<std::int64_t>>&& v) { return checked_sum(v.front()); }),
                    Meter::Read);
}

std::shared_ptr<Op<std::vector<std::int64_t>>> ShardedCounter::make_values(const std::vector<std::string>& names) {
  for (const auto& n : names) validate_name(n, "name");
  if (names.empty()) {
    return make_batch_op<std::vector<std::int64_t>>({}, [](std::vector<Reply>&&) { return std::vector<std::int64_t>{}; });
  }
  return std::make_shared<ShardReadOp<std::vector<std::int64_t>>>(
      core_, names, [](std::vector<std::vector<std::int64_t>>&& v) {
        std::vector<std::int64_t> out;
        out.reserve(v.size());
        for (const auto& shards : v) out.push_back(checked_sum(shards));
        return out;
      });
}

std::shared_ptr<Op<Reading>> ShardedCounter::make_read(std::int64_t max_staleness_ms) {
  if (max_staleness_ms < 0) throw InvalidArgument("max_staleness must be >= 0 seconds");
  return std::make_shared<ReadOp>(core_, max_staleness_ms);
}

std::int64_t ShardedCounter::value() { return run(*core_->store, *make_value()); }
std::vector<std::int64_t> ShardedCounter::shard_values() { return run(*core_->store, *make_shard_values()); }
std::vector<std::int64_t> ShardedCounter::values(const std::vector<std::string>& names) {
  return run(*core_->store, *make_values(names));
}

Reading ShardedCounter::read(std::int64_t max_staleness_ms) { return run(*core_->store, *make_read(max_staleness_ms)); }

}  // namespace redcount
