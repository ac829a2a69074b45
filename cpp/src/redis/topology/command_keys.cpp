#include "redcount/redis/topology/command_keys.h"

#include <string>
#include <unordered_map>

#include "redcount/common/slot.h"
#include "redcount/common/errors.h"
#include "redcount/common/util.h"

namespace redcount::redis {
namespace {
std::string describe(const Request& r) {
  if (const auto* s = std::get_if<ScriptCall>(&r)) {
    std::string out("script '");
    out.append(s->script->name);
    out.push_back('\'');
    return out;
  }
  const auto& args = std::get<Command>(r).args;
  return printable(args[0], 32);
}

[[noreturn]] void cross_slot(const std::string& what, const std::vector<std::string_view>& keys) {
  std::string shown;
  for (std::size_t i = 0; i < keys.size() && i < 6; ++i) {
    if (i) shown += ", ";
    shown.push_back('\'');
    shown.append(printable(keys[i], 60));
    shown.append("' -> slot ");
    shown.append(std::to_string(key_slot(keys[i])));
  }
  if (keys.size() > 6) shown += ", ... (" + std::to_string(keys.size()) + " keys)";
  throw InvalidArgument(what + " has keys in more than one hash slot on a Redis Cluster (" + shown +
                        "); every key of one call must share a {hash tag}; nothing was sent");
}

}  // namespace

std::vector<Unit> route_units(const std::vector<Request>& batch) {
  // Items: one request, or a whole transaction; each with its role and slot.
  struct Item {
    std::uint32_t begin, end, ask_at;
    KeyRole role;
    std::int32_t slot;
    bool transaction;
  };
  std::vector<Item> items;
  items.reserve(batch.size());
  std::vector<std::string_view> keys;
  std::vector<std::string_view> block_keys;
  std::int32_t block_slot = kAnySlot;
  std::int64_t block_begin = -1;
  const auto n = static_cast<std::uint32_t>(batch.size());
  // Neighbouring requests often name the same key (INCRBY k, PEXPIREAT k): its slot once.
  std::string_view last_key;
  std::int32_t last_slot = kAnySlot;
  auto slot_of = [&](std::string_view k) {
    if (last_slot == kAnySlot || k != last_key) {
      last_key = k;
      last_slot = static_cast<std::int32_t>(key_slot(k));
    }
    return last_slot;
  };
  for (std::uint32_t i = 0; i < n; ++i) {
    keys.clear();
    const KeyRole role = keys_of(batch[i], keys);
    if (role == KeyRole::Unknown) {
      std::string m("unknown command '");
      m.append(describe(batch[i]));
      m.append("' on a Redis Cluster store: redcount does not know where its keys are, so it cannot route it; run "
               "it on one node through store.nodes() (nothing was sent)");
      throw InvalidArgument(m);
    }
    if (role == KeyRole::NodeOnly) {
      throw InvalidArgument(ascii_lower(describe(batch[i])) +
                            " is about one node, not the whole Redis Cluster: run it on each node of "
                            "store.nodes() (nothing was sent)");
    }
    std::int32_t slot = kAnySlot;
    if (role == KeyRole::Keyed) {
      slot = slot_of(keys[0]);
      for (std::size_t k = 1; k < keys.size(); ++k) {
        if (static_cast<std::int32_t>(key_slot(keys[k])) != slot) {
          std::string what(std::holds_alternative<ScriptCall>(batch[i]) ? "a call to " : "the command ");
          what.append(describe(batch[i]));
          cross_slot(what, keys);
        }
      }
    }
    const auto* cmd = std::get_if<Command>(&batch[i]);
    const std::string_view name = cmd ? std::string_view(cmd->args[0]) : std::string_view();
    if (ascii_iequals(name, "multi")) {
      if (block_begin >= 0) throw InvalidArgument("MULTI inside MULTI: a transaction cannot be nested");
      block_begin = i;
      block_slot = kAnySlot;
      block_keys.clear();
      continue;
    }
    if (block_begin >= 0) {
      if (role == KeyRole::Keyed) {
        block_keys.insert(block_keys.end(), keys.begin(), keys.end());
        if (block_slot == kAnySlot) {
          block_slot = slot;
        } else if (slot != block_slot) {
          cross_slot("a transaction (MULTI ... EXEC)", block_keys);
        }
      }
      if (ascii_iequals(name, "exec") || ascii_iequals(name, "discard")) {
        const auto b = static_cast<std::uint32_t>(block_begin);
        items.push_back(Item{b, i + 1, b, block_slot == kAnySlot ? KeyRole::Free : KeyRole::Keyed, block_slot, true});
        block_begin = -1;
      }
      continue;
    }
    items.push_back(Item{i, i + 1, i, role, slot, false});
  }
  if (block_begin >= 0) {
    throw InvalidArgument("MULTI without EXEC or DISCARD in the same batch: a transaction must be sent whole");
  }

  std::vector<Unit> units;
  units.reserve(items.size());
  std::int64_t pending = -1;  // start of keyless requests waiting for the next keyed item
  for (const Item& it : items) {
    const bool keyed = it.role == KeyRole::Keyed;
    if (keyed) {
      Unit u;
      u.begin = pending >= 0 ? static_cast<std::uint32_t>(pending) : it.begin;
      u.end = it.end;
      u.slot = it.slot;
      u.ask_at = it.ask_at;
      u.transaction = it.transaction;
      units.push_back(u);
      pending = -1;
      continue;
    }
    if (it.role == KeyRole::JoinAfter || units.empty() || pending >= 0) {
      if (pending < 0) pending = it.begin;
      continue;
    }
    // Free or JoinBefore with a unit before it: joins that unit.
    units.back().end = it.end;
    units.back().transaction = units.back().transaction || it.transaction;
  }
  if (pending >= 0) {
    if (!units.empty()) {
      units.back().end = n;
    } else {
      Unit u;
      u.begin = static_cast<std::uint32_t>(pending);
      u.end = n;
      u.ask_at = u.begin;
      units.push_back(u);
    }
  }
  return units;
}

}  // namespace redcount::redis
