// The sharded counter's layout: the layout key's text, layout() and reshard().
#include "sharded/sharded_core.h"

namespace redcount {
namespace sharded_detail {

// The layout key's text: "<version>|<first>,<count>,<retired_ms>;..." oldest generation first.
std::string format_layout(const ShardLayout& l) {
  std::string out = std::to_string(l.version) + "|";
  for (std::size_t i = 0; i < l.generations.size(); ++i) {
    const ShardGeneration& g = l.generations[i];
    if (i > 0) out += ";";
    out += std::to_string(g.first) + "," + std::to_string(g.count) + "," + std::to_string(g.retired_ms);
  }
  return out;
}

ShardLayout first_layout(std::int64_t shards) {
  ShardLayout l;
  l.generations.push_back(ShardGeneration{0, shards, 0});
  return l;
}

// The layout in `text` ('' = none written yet: the first generation of `shards`). A text
// reshard() did not write (a foreign SET) is an error naming the key, never a guess.
ShardLayout parse_layout(const std::string& text, std::int64_t shards, const std::string& key) {
  if (text.empty()) return first_layout(shards);
  auto bad = [&] {
    return Error("the layout key '" + printable(key) + "' holds '" + printable(text.substr(0, 200)) +
                 "', which reshard() did not write; restore it or delete it (then the counter has its "
                 "constructor's shard count)");
  };
  const auto bar = text.find('|');
  if (bar == std::string::npos) throw bad();
  auto version = parse_int64(text.substr(0, bar));
  if (!version) throw bad();
  ShardLayout l;
  l.version = *version;
  std::size_t pos = bar + 1;
  while (pos <= text.size()) {
    std::size_t end = text.find(';', pos);
    if (end == std::string::npos) end = text.size();
    const std::string part = text.substr(pos, end - pos);
    const auto c1 = part.find(','), c2 = part.rfind(',');
    if (c1 == std::string::npos || c1 == c2) throw bad();
    auto first = parse_int64(part.substr(0, c1));
    auto count = parse_int64(part.substr(c1 + 1, c2 - c1 - 1));
    auto retired = parse_int64(part.substr(c2 + 1));
    if (!first || !count || !retired) throw bad();
    l.generations.push_back(ShardGeneration{*first, *count, *retired});
    pos = end + 1;
  }
  std::int64_t next = 0;
  for (std::size_t i = 0; i < l.generations.size(); ++i) {
    const ShardGeneration& g = l.generations[i];
    const bool last = i + 1 == l.generations.size();
    if (g.first != next || g.count < 1 || g.count > kMaxShards || (last ? g.retired_ms != 0 : g.retired_ms <= 0)) {
      throw bad();
    }
    next += g.count;
  }
  if (l.version != static_cast<std::int64_t>(l.generations.size()) || next > kMaxShards) throw bad();
  return l;
}

// The layout key's reply as text ('' when absent).
std::string layout_text(const Reply& r) {
  r.check();
  if (r.is_nil()) return {};
  return r.str;
}

}  // namespace sharded_detail

using sharded_detail::format_layout;
using sharded_detail::layout_text;

namespace {

using Core = ShardedCounter::Core;

// layout(): the layout key, read and learned.
class LayoutOp final : public Op<ShardLayout> {
 public:
  explicit LayoutOp(std::shared_ptr<Core> core) : core_(std::move(core)) {}
  std::vector<Request> prepare() override {
    sent_ = SteadyClock::now();
    return core_->layout_gets({core_->options.name});
  }
  std::vector<Request> finish(std::vector<Reply> replies) override {
    if (replies.size() != 1) throw ProtocolError("sharded layout: reply count mismatch");
    const std::string text = layout_text(replies[0]);
    core_->learn(core_->options.name, text, sent_);
    complete(parse_layout(text, core_->options.shards, sharded_layout_key(core_->options.prefix, core_->options.name)));
    return {};
  }

 private:
  std::shared_ptr<Core> core_;
  SteadyClock::time_point sent_{};
};

// reshard(): read the layout, then compare-and-set the next one (sharded_reshard.lua), so
// a concurrent reshard makes this one fail instead of both writing.
class ReshardOp final : public Op<ShardLayout> {
 public:
  ReshardOp(std::shared_ptr<Core> core, std::int64_t new_shards) : core_(std::move(core)), new_(new_shards) {}

  std::vector<Request> prepare() override {
    sent_ = SteadyClock::now();
    return core_->layout_gets({core_->options.name});
  }

  std::vector<Request> finish(std::vector<Reply> replies) override {
    const std::string key = sharded_layout_key(core_->options.prefix, core_->options.name);
    if (replies.size() != 1) throw ProtocolError("sharded reshard: reply count mismatch");
    if (!read_) {
      read_ = true;
      expected_ = layout_text(replies[0]);
      ShardLayout l = parse_layout(expected_, core_->options.shards, key);
      core_->learn(core_->options.name, expected_, sent_);
      if (l.current().count == new_) {
        throw InvalidArgument("the counter '" + printable(core_->options.name) + "' already has " +
                              std::to_string(new_) + " shards; nothing to reshard");
      }
      if (l.total() + new_ > kMaxShards) {
        throw InvalidArgument("resharding to " + std::to_string(new_) + " shards would make " +
                              std::to_string(l.total() + new_) + " shards over all generations (every read "
                              "reads them all), more than the cap of " + std::to_string(kMaxShards));
      }
      l.generations.back().retired_ms = core_->store->now_ms();
      l.generations.push_back(ShardGeneration{l.total(), new_, 0});
      l.version = static_cast<std::int64_t>(l.generations.size());
      next_ = std::move(l);
      std::vector<Request> batch;
      batch.emplace_back(ScriptCall{&kShardedReshardScript, {key}, {expected_, format_layout(next_)}});
      sent_ = SteadyClock::now();
      return batch;
    }
    const Reply& r = replies[0];
    r.check();
    if (r.type != Reply::Type::Array || r.elements.size() != 2) throw ProtocolError("sharded_reshard: unexpected reply");
    const std::string text = r.elements[1].str;
    core_->learn(core_->options.name, text, sent_);
    if (r.elements[0].as_integer() != 1) {
      const ShardLayout now = parse_layout(text, core_->options.shards, key);
      throw Error("reshard of '" + printable(core_->options.name) + "' to " + std::to_string(new_) +
                  " shards lost to a concurrent reshard: the layout is now version " + std::to_string(now.version) +
                  " with " + std::to_string(now.current().count) +
                  " shards taking the writes; nothing was changed (reshard again if still wanted)");
    }
    complete(std::move(next_));
    return {};
  }

 private:
  std::shared_ptr<Core> core_;
  std::int64_t new_;
  bool read_ = false;
  std::string expected_;
  ShardLayout next_;
  SteadyClock::time_point sent_{};
};

}  // namespace

std::shared_ptr<Op<ShardLayout>> ShardedCounter::make_reshard(std::int64_t new_shards) {
  if (new_shards < 1 || new_shards > kMaxShards) {
    throw InvalidArgument("new_shards must be between 1 and " + std::to_string(kMaxShards) + ", got " +
                          std::to_string(new_shards));
  }
  return std::make_shared<ReshardOp>(core_, new_shards);
}

ShardLayout ShardedCounter::reshard(std::int64_t new_shards) { return run(*core_->store, *make_reshard(new_shards)); }
std::shared_ptr<Op<ShardLayout>> ShardedCounter::make_layout() { return std::make_shared<LayoutOp>(core_); }
ShardLayout ShardedCounter::layout() { return run(*core_->store, *make_layout()); }
ShardLayout ShardedCounter::cached_layout() const { return core_->known(core_->options.name).layout; }
std::string ShardedCounter::layout_key() const {
  return sharded_layout_key(core_->options.prefix, core_->options.name);
}

}  // namespace redcount
