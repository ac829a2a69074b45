// The memory store's stream commands (XADD, XLEN, XRANGE, XTRIM...) and consumer groups
// (XGROUP, XREADGROUP, XACK, XPENDING, XAUTOCLAIM...), parsed and answered as Redis does.
#include "redcount/memory/memory_store.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <limits>

#include "redcount/common/errors.h"
#include "redcount/common/util.h"
#include "memory/keyspace.h"

#include "memory/command_support.h"

namespace redcount {

using memory_commands::int64_arg;
using memory_commands::upper;
using memory_commands::wrong_args;

namespace {

constexpr const char* kBadStreamId = "ERR Invalid stream ID specified as stream command argument";

// An unsigned decimal as Redis's string2ull reads it: digits only, no overflow.
std::optional<std::uint64_t> parse_uint64(std::string_view s) {
  if (s.empty() || s.size() > 20) return std::nullopt;
  std::uint64_t v = 0;
  auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || ptr != s.data() + s.size()) return std::nullopt;
  return v;
}

// "<ms>-<seq>" or "<ms>" (seq = `missing_seq`); `seq_star` is set for "<ms>-*" when allowed.
template <class Id>
std::optional<Id> parse_stream_id(const std::string& s, std::uint64_t missing_seq, bool* seq_star = nullptr) {
  const auto dash = s.find('-');
  if (dash == std::string::npos) {
    auto ms = parse_uint64(s);
    if (!ms) return std::nullopt;
    return Id{*ms, missing_seq};
  }
  auto ms = parse_uint64(std::string_view(s).substr(0, dash));
  if (!ms) return std::nullopt;
  const std::string_view rest = std::string_view(s).substr(dash + 1);
  if (seq_star && rest == "*") {
    *seq_star = true;
    return Id{*ms, 0};
  }
  auto seq = parse_uint64(rest);
  if (!seq) return std::nullopt;
  return Id{*ms, *seq};
}

// Redis 7's read-counter arithmetic (t_stream.c), on the memory store's streams: whether XDEL
// left a tombstone at or after `start`, and the logical position ("entries read") of `id`
// when it can be known from the stream alone (-1 when not).
template <class Stream, class Id>
bool range_has_tombstones(const Stream& st, Id start) {
  if (st.items.empty() || st.max_deleted == Id{}) return false;
  if (st.items.front().id > st.max_deleted) return false;
  return start <= st.max_deleted;
}

template <class Stream, class Id>
std::int64_t estimate_entries_read(const Stream& st, Id id) {
  const auto added = static_cast<std::int64_t>(st.added);
  if (added == 0) return 0;
  if (st.items.empty() && id <= st.last) return added;
  if (id == st.last) return added;
  if (id > st.last) return -1;
  const Id first = st.items.front().id;
  if (st.max_deleted == Id{} || st.max_deleted < first) {
    const auto length = static_cast<std::int64_t>(st.items.size());
    if (id < first) return added - length;
    if (id == first) return added - length + 1;
  }
  return -1;
}

}  // namespace

std::optional<Reply> MemoryStore::run_stream_command(Ops& ops, const std::string& cmd,
                                                     const std::vector<std::string>& args) {
  const std::size_t n = args.size();
  auto entry_reply = [](const Stream::Item& item) {
    std::vector<Reply> fv;
    fv.reserve(item.fields.size() * 2);
    for (const auto& [f, v] : item.fields) {
      fv.push_back(Reply::of_string(f));
      fv.push_back(Reply::of_string(v));
    }
    return Reply::of_array({Reply::of_string(Ops::stream_id_text(item.id)), Reply::of_array(std::move(fv))});
  };
  if (cmd == "XADD") {
    if (n < 5) return wrong_args(cmd);
    bool nomkstream = false, have_limit = false, approx = false;
    std::int64_t maxlen = -1;
    std::size_t i = 2;
    for (; i < n; ++i) {
      const std::string opt = upper(args[i]);
      if (opt == "NOMKSTREAM") {
        nomkstream = true;
      } else if (opt == "MAXLEN" && i + 1 < n) {
        std::size_t v = i + 1;
        if (args[v] == "~" || args[v] == "=") {
          approx = args[v] == "~";
          ++v;
        }
        if (v >= n) return Reply::of_error(kSyntax);
        auto len = parse_int64(args[v]);
        if (!len) return Reply::of_error(kNotInteger);
        if (*len < 0) return Reply::of_error("ERR The MAXLEN argument must be >= 0.");
        maxlen = *len;
        i = v;
      } else if (opt == "LIMIT" && i + 1 < n) {
        if (!parse_int64(args[i + 1])) return Reply::of_error(kNotInteger);
        have_limit = true;
        ++i;
      } else if (opt == "MINID") {
        return Reply::of_error("ERR syntax error, the memory:// store supports XADD MAXLEN trimming only");
      } else {
        break;
      }
    }
    if (have_limit && !approx) {
      return Reply::of_error("ERR syntax error, LIMIT cannot be used without the special ~ option");
    }
    if (i >= n || (n - i - 1) % 2 != 0 || n - i - 1 == 0) return wrong_args(cmd);
    bool auto_id = args[i] == "*", seq_star = false;
    StreamId id{};
    if (!auto_id) {
      auto parsed = parse_stream_id<StreamId>(args[i], 0, &seq_star);
      if (!parsed) return Reply::of_error(kBadStreamId);
      id = *parsed;
      if (!seq_star && id == StreamId{}) {
        return Reply::of_error("ERR The ID specified in XADD must be greater than 0-0");
      }
    }
    Stream* st = ops.find_as<Stream>(args[1]);
    if (!st) {
      if (nomkstream) return Reply::nil();
      st = &ops.find_or_create<Stream>(args[1]);
    }
    if (auto_id) {
      id = ops.next_stream_id(*st);
    } else if (seq_star) {
      if (id.ms < st->last.ms) {
        return Reply::of_error("ERR The ID specified in XADD is equal or smaller than the target stream top item");
      }
      id.seq = id.ms == st->last.ms ? st->last.seq + 1 : 0;
    } else if (id <= st->last) {
      return Reply::of_error("ERR The ID specified in XADD is equal or smaller than the target stream top item");
    }
    std::vector<std::pair<std::string, std::string>> fields;
    fields.reserve((n - i - 1) / 2);
    for (std::size_t f = i + 1; f + 1 < n; f += 2) fields.emplace_back(args[f], args[f + 1]);
    Ops::stream_append(*st, id, std::move(fields), maxlen);
    return Reply::of_string(Ops::stream_id_text(id));
  }
  if (cmd == "XDEL") {
    // Every id is checked before anything is deleted; pending entries of consumer groups
    // stay (XAUTOCLAIM then reports them as deleted), as on Redis.
    if (n < 3) return wrong_args(cmd);
    std::vector<StreamId> ids;
    ids.reserve(n - 2);
    for (std::size_t i = 2; i < n; ++i) {
      auto id = parse_stream_id<StreamId>(args[i], 0);
      if (!id) return Reply::of_error("ERR Invalid stream ID specified as stream command argument");
      ids.push_back(*id);
    }
    Stream* st = ops.find_as<Stream>(args[1]);
    std::int64_t deleted = 0;
    if (st != nullptr) {
      for (const StreamId& id : ids) {
        auto it = std::lower_bound(st->items.begin(), st->items.end(), id,
                                   [](const Stream::Item& item, const StreamId& v) { return item.id < v; });
        if (it != st->items.end() && it->id == id) {
          st->items.erase(it);
          ++deleted;
          if (id > st->max_deleted) st->max_deleted = id;
        }
      }
    }
    return Reply::of_integer(deleted);
  }
  if (cmd == "XLEN") {
    if (n != 2) return wrong_args(cmd);
    const Stream* st = ops.find_as<Stream>(args[1]);
    return Reply::of_integer(st ? static_cast<std::int64_t>(st->items.size()) : 0);
  }
  if (cmd == "XRANGE" || cmd == "XREVRANGE") {
    if (n != 4 && n != 6) return wrong_args(cmd);
    const bool rev = cmd == "XREVRANGE";
    const std::string& lo_arg = rev ? args[3] : args[2];
    const std::string& hi_arg = rev ? args[2] : args[3];
    constexpr std::uint64_t kMax = std::numeric_limits<std::uint64_t>::max();
    // Each end: '-' / '+', an id, or '(' and an id for an exclusive end.
    auto bound = [&](const std::string& a, bool low) -> std::optional<StreamId> {
      if (a == "-") return StreamId{0, 0};
      if (a == "+") return StreamId{kMax, kMax};
      const bool ex = !a.empty() && a[0] == '(';
      auto id = parse_stream_id<StreamId>(ex ? a.substr(1) : a, low ? 0 : kMax);
      if (!id) return std::nullopt;
      if (ex) {
        if (low) {
          if (id->seq == kMax) {
            if (id->ms == kMax) return std::nullopt;
            return StreamId{id->ms + 1, 0};
          }
          return StreamId{id->ms, id->seq + 1};
        }
        if (id->seq == 0) {
          if (id->ms == 0) return std::nullopt;
          return StreamId{id->ms - 1, kMax};
        }
        return StreamId{id->ms, id->seq - 1};
      }
      return id;
    };
    auto lo = bound(lo_arg, true), hi = bound(hi_arg, false);
    if (!lo || !hi) return Reply::of_error(kBadStreamId);
    std::int64_t count = -1;
    if (n == 6) {
      if (upper(args[4]) != "COUNT") return Reply::of_error(kSyntax);
      count = int64_arg(args[5]);
      if (count < 0) count = 0;
    }
    const Stream* st = ops.find_as<Stream>(args[1]);
    std::vector<Reply> out;
    if (st && count != 0 && *lo <= *hi) {
      auto in_range = [&](const Stream::Item& it) { return it.id >= *lo && it.id <= *hi; };
      auto add = [&](const Stream::Item& it) {
        if (!in_range(it)) return true;
        out.push_back(entry_reply(it));
        return count < 0 || static_cast<std::int64_t>(out.size()) < count;
      };
      if (rev) {
        for (auto it = st->items.rbegin(); it != st->items.rend() && add(*it);) ++it;
      } else {
        for (auto it = st->items.begin(); it != st->items.end() && add(*it);) ++it;
      }
    }
    return Reply::of_array(std::move(out));
  }
  if (cmd == "XTRIM") {
    // XTRIM key MAXLEN|MINID [=|~] threshold [LIMIT count]; '~' trims exactly here (Redis
    // keeps at least as much). Pending entries of consumer groups stay pending, as on Redis.
    if (n < 4) return wrong_args(cmd);
    const std::string strategy = upper(args[2]);
    if (strategy != "MAXLEN" && strategy != "MINID") return Reply::of_error(kSyntax);
    std::size_t i = 3;
    bool approx = false;
    if (args[i] == "~" || args[i] == "=") {
      approx = args[i] == "~";
      ++i;
    }
    if (i >= n) return Reply::of_error(kSyntax);
    std::int64_t maxlen = 0;
    StreamId minid{};
    if (strategy == "MAXLEN") {
      auto len = parse_int64(args[i]);
      if (!len) return Reply::of_error(kNotInteger);
      if (*len < 0) return Reply::of_error("ERR The MAXLEN argument must be >= 0.");
      maxlen = *len;
    } else {
      auto id = parse_stream_id<StreamId>(args[i], 0);
      if (!id) return Reply::of_error(kBadStreamId);
      minid = *id;
    }
    ++i;
    if (i < n) {
      if (upper(args[i]) != "LIMIT" || i + 2 != n) return Reply::of_error(kSyntax);
      auto limit = parse_int64(args[i + 1]);
      if (!limit) return Reply::of_error(kNotInteger);
      if (*limit < 0) return Reply::of_error("ERR The LIMIT argument must be >= 0.");
      if (!approx) return Reply::of_error("ERR syntax error, LIMIT cannot be used without the special ~ option");
    }
    Stream* st = ops.find_as<Stream>(args[1]);
    std::int64_t removed = 0;
    if (st != nullptr) {
      if (strategy == "MAXLEN") {
        while (st->items.size() > static_cast<std::size_t>(maxlen)) {
          st->items.pop_front();
          ++removed;
        }
      } else {
        while (!st->items.empty() && st->items.front().id < minid) {
          st->items.pop_front();
          ++removed;
        }
      }
    }
    return Reply::of_integer(removed);
  }
  if (cmd == "XINFO") {
    // The summary forms Redis 7.0 answers (field names and order as there); FULL is not kept.
    if (n < 2) return wrong_args(cmd);
    const std::string sub = upper(args[1]);
    if ((sub != "STREAM" && sub != "GROUPS") || n != 3) {
      return Reply::of_error("ERR unknown subcommand or wrong number of arguments for '" + args[1] +
                             "'; the memory:// store supports XINFO STREAM <key> and XINFO GROUPS <key>");
    }
    const Stream* st = ops.find_as<Stream>(args[2]);
    if (!st) return Reply::of_error("ERR no such key");
    auto id_text = [](StreamId id) { return Reply::of_string(Ops::stream_id_text(id)); };
    if (sub == "STREAM") {
      const StreamId first = st->items.empty() ? StreamId{} : st->items.front().id;
      std::vector<Reply> out;
      auto field = [&](const char* name, Reply v) {
        out.push_back(Reply::of_string(name));
        out.push_back(std::move(v));
      };
      field("length", Reply::of_integer(static_cast<std::int64_t>(st->items.size())));
      field("radix-tree-keys", Reply::of_integer(st->items.empty() ? 0 : 1));
      field("radix-tree-nodes", Reply::of_integer(st->items.empty() ? 1 : 2));
      field("last-generated-id", id_text(st->last));
      field("max-deleted-entry-id", id_text(st->max_deleted));
      field("entries-added", Reply::of_integer(static_cast<std::int64_t>(st->added)));
      field("recorded-first-entry-id", id_text(first));
      field("groups", Reply::of_integer(static_cast<std::int64_t>(st->groups.size())));
      field("first-entry", st->items.empty() ? Reply::nil() : entry_reply(st->items.front()));
      field("last-entry", st->items.empty() ? Reply::nil() : entry_reply(st->items.back()));
      return Reply::of_array(std::move(out));
    }
    std::vector<Reply> groups;
    for (const auto& [name, g] : st->groups) {
      Reply lag = Reply::nil();
      if (st->added == 0) {
        lag = Reply::of_integer(0);
      } else if (g.entries_read >= 0 && !range_has_tombstones(*st, g.last_delivered)) {
        lag = Reply::of_integer(static_cast<std::int64_t>(st->added) - g.entries_read);
      } else if (const std::int64_t read = estimate_entries_read(*st, g.last_delivered); read >= 0) {
        lag = Reply::of_integer(static_cast<std::int64_t>(st->added) - read);
      }
      groups.push_back(Reply::of_array({
          Reply::of_string("name"), Reply::of_string(name),
          Reply::of_string("consumers"), Reply::of_integer(static_cast<std::int64_t>(g.consumers.size())),
          Reply::of_string("pending"), Reply::of_integer(static_cast<std::int64_t>(g.pel.size())),
          Reply::of_string("last-delivered-id"), id_text(g.last_delivered),
          Reply::of_string("entries-read"), g.entries_read >= 0 ? Reply::of_integer(g.entries_read) : Reply::nil(),
          Reply::of_string("lag"), std::move(lag),
      }));
    }
    return Reply::of_array(std::move(groups));
  }
  if (cmd == "XGROUP" || cmd == "XREADGROUP" || cmd == "XACK" || cmd == "XPENDING" || cmd == "XAUTOCLAIM") {
    return run_stream_group_command(ops, cmd, args);
  }
  return std::nullopt;
}

namespace {

Reply nogroup(const std::string& key, const std::string& group, const char* tail = "") {
  return Reply::of_error("NOGROUP No such key '" + key + "' or consumer group '" + group + "'" + tail);
}

// An interval end as XPENDING and XAUTOCLAIM read it: '-', '+', an id (a missing sequence
// is 0 at the low end and the largest at the high end) or '(' and an id for an exclusive end.
template <class Id>
std::optional<Id> interval_bound(const std::string& a, bool low) {
  constexpr std::uint64_t kMax = std::numeric_limits<std::uint64_t>::max();
  if (a == "-") return Id{0, 0};
  if (a == "+") return Id{kMax, kMax};
  const bool ex = !a.empty() && a[0] == '(';
  auto id = parse_stream_id<Id>(ex ? a.substr(1) : a, low ? 0 : kMax);
  if (!id || !ex) return id;
  if (low) {
    if (id->seq != kMax) return Id{id->ms, id->seq + 1};
    if (id->ms == kMax) return std::nullopt;
    return Id{id->ms + 1, 0};
  }
  if (id->seq != 0) return Id{id->ms, id->seq - 1};
  if (id->ms == 0) return std::nullopt;
  return Id{id->ms - 1, kMax};
}

// The entry with `id`, or nullptr when there is none (never added, or trimmed).
template <class Stream, class Id>
const typename Stream::Item* find_item(const Stream& st, Id id) {
  auto it = std::lower_bound(st.items.begin(), st.items.end(), id,
                             [](const typename Stream::Item& item, Id v) { return item.id < v; });
  return it != st.items.end() && it->id == id ? &*it : nullptr;
}

}  // namespace

std::optional<Reply> MemoryStore::run_stream_group_command(Ops& ops, const std::string& cmd,
                                                           const std::vector<std::string>& args) {
  using StreamGroup = Stream::Group;
  using StreamItem = Stream::Item;
  const std::size_t n = args.size();
  const std::int64_t now = ops.now_ms();
  auto entry_reply = [](const StreamItem& item) {
    std::vector<Reply> fv;
    fv.reserve(item.fields.size() * 2);
    for (const auto& [f, v] : item.fields) {
      fv.push_back(Reply::of_string(f));
      fv.push_back(Reply::of_string(v));
    }
    return Reply::of_array({Reply::of_string(Ops::stream_id_text(item.id)), Reply::of_array(std::move(fv))});
  };
  auto id_reply = [](StreamId id) { return Reply::of_string(Ops::stream_id_text(id)); };

  if (cmd == "XGROUP") {
    if (n < 2) return wrong_args(cmd);
    const std::string sub = upper(args[1]);
    if (sub == "CREATE") {
      if (n < 5) return Reply::of_error("ERR wrong number of arguments for 'xgroup|create' command");
      bool mkstream = false;
      std::int64_t entries_read = -1;
      for (std::size_t i = 5; i < n; ++i) {
        const std::string opt = upper(args[i]);
        if (opt == "MKSTREAM") {
          mkstream = true;
        } else if (opt == "ENTRIESREAD" && i + 1 < n) {
          auto v = parse_int64(args[++i]);
          if (!v) return Reply::of_error(kNotInteger);
          if (*v < 0 && *v != -1) return Reply::of_error("ERR value for ENTRIESREAD must be positive or -1");
          entries_read = *v;
        } else {
          return Reply::of_error(kSyntax);
        }
      }
      std::optional<StreamId> start;
      if (args[4] != "$") {
        start = parse_stream_id<StreamId>(args[4], 0);
        if (!start) return Reply::of_error(kBadStreamId);
      }
      Stream* st = ops.find_as<Stream>(args[2]);
      if (!st) {
        if (!mkstream) {
          return Reply::of_error("ERR The XGROUP subcommand requires the key to exist. Note that for CREATE "
                                 "you may want to use the MKSTREAM option to create an empty stream "
                                 "automatically.");
        }
        st = &ops.find_or_create<Stream>(args[2]);
      }
      if (st->groups.count(args[3])) return Reply::of_error("BUSYGROUP Consumer Group name already exists");
      StreamGroup& g = st->groups[args[3]];
      g.last_delivered = start ? *start : st->last;
      g.entries_read = entries_read;
      return Reply::of_status("OK");
    }
    if (sub == "SETID") {
      if ((n != 5 && n != 7) || (n == 7 && upper(args[5]) != "ENTRIESREAD")) {
        return Reply::of_error("ERR unknown subcommand or wrong number of arguments for '" + args[1] +
                               "'. Try XGROUP HELP.");
      }
      std::int64_t entries_read = -1;
      if (n == 7) {
        auto v = parse_int64(args[6]);
        if (!v) return Reply::of_error(kNotInteger);
        if (*v < 0 && *v != -1) return Reply::of_error("ERR value for ENTRIESREAD must be positive or -1");
        entries_read = *v;
      }
      std::optional<StreamId> id;
      if (args[4] != "$") {
        id = parse_stream_id<StreamId>(args[4], 0);
        if (!id) return Reply::of_error(kBadStreamId);
      }
      Stream* st = ops.find_as<Stream>(args[2]);
      if (!st) {
        return Reply::of_error("ERR The XGROUP subcommand requires the key to exist. Note that for CREATE "
                               "you may want to use the MKSTREAM option to create an empty stream "
                               "automatically.");
      }
      auto g = st->groups.find(args[3]);
      if (g == st->groups.end()) {
        return Reply::of_error("NOGROUP No such consumer group '" + args[3] + "' for key name '" + args[2] + "'");
      }
      g->second.last_delivered = id ? *id : st->last;
      g->second.entries_read = entries_read;
      return Reply::of_status("OK");
    }
    if (sub == "DESTROY") {
      if (n != 4) return Reply::of_error("ERR wrong number of arguments for 'xgroup|destroy' command");
      Stream* st = ops.find_as<Stream>(args[2]);
      if (!st) {
        return Reply::of_error("ERR The XGROUP subcommand requires the key to exist. Note that for CREATE "
                               "you may want to use the MKSTREAM option to create an empty stream "
                               "automatically.");
      }
      return Reply::of_integer(static_cast<std::int64_t>(st->groups.erase(args[3])));
    }
    return Reply::of_error("ERR unknown subcommand '" + args[1] + "'. Try XGROUP HELP.");
  }

  if (cmd == "XREADGROUP") {
    if (n < 7 || upper(args[1]) != "GROUP") return wrong_args(cmd);
    const std::string& group_name = args[2];
    const std::string& consumer = args[3];
    std::int64_t count = 0;
    bool noack = false;
    std::size_t i = 4;
    for (; i < n; ++i) {
      const std::string opt = upper(args[i]);
      if (opt == "COUNT" && i + 1 < n) {
        count = int64_arg(args[++i]);
        if (count < 0) count = 0;
      } else if (opt == "BLOCK" && i + 1 < n) {
        if (int64_arg(args[++i]) < 0) return Reply::of_error("ERR timeout is negative");
      } else if (opt == "NOACK") {
        noack = true;
      } else if (opt == "STREAMS") {
        break;
      } else {
        return Reply::of_error(kSyntax);
      }
    }
    if (i >= n) return Reply::of_error(kSyntax);
    const std::size_t first = i + 1, rest = n - first;
    if (rest == 0 || rest % 2 != 0) {
      return Reply::of_error("ERR Unbalanced XREAD list of streams: for each stream key an ID or '$' must be "
                             "specified.");
    }
    const std::size_t streams = rest / 2;
    // Every id and every group is checked before anything is delivered, as Redis does.
    std::vector<std::optional<StreamId>> history(streams);
    for (std::size_t s = 0; s < streams; ++s) {
      const std::string& id = args[first + streams + s];
      if (id == ">") continue;
      history[s] = parse_stream_id<StreamId>(id, 0);
      if (!history[s]) return Reply::of_error(kBadStreamId);
    }
    std::vector<Stream*> found(streams);
    for (std::size_t s = 0; s < streams; ++s) {
      const std::string& key = args[first + s];
      found[s] = ops.find_as<Stream>(key);
      if (!found[s] || !found[s]->groups.count(group_name)) {
        return nogroup(key, group_name, " in XREADGROUP with GROUP option");
      }
    }
    std::vector<Reply> out;
    for (std::size_t s = 0; s < streams; ++s) {
      Stream& st = *found[s];
      StreamGroup& g = st.groups[group_name];
      g.consumers[consumer] = now;
      std::vector<Reply> entries;
      if (history[s]) {
        for (auto it = g.pel.upper_bound(*history[s]); it != g.pel.end(); ++it) {
          if (count > 0 && static_cast<std::int64_t>(entries.size()) >= count) break;
          if (it->second.consumer != consumer) continue;
          if (const StreamItem* item = find_item(st, it->first)) {
            entries.push_back(entry_reply(*item));
          } else {
            entries.push_back(Reply::of_array({id_reply(it->first), Reply::nil()}));
          }
          it->second.delivered_at = now;
          ++it->second.deliveries;
        }
        out.push_back(Reply::of_array({Reply::of_string(args[first + s]), Reply::of_array(std::move(entries))}));
        continue;
      }
      auto it = std::upper_bound(st.items.begin(), st.items.end(), g.last_delivered,
                                 [](StreamId v, const StreamItem& item) { return v < item.id; });
      for (; it != st.items.end(); ++it) {
        if (count > 0 && static_cast<std::int64_t>(entries.size()) >= count) break;
        entries.push_back(entry_reply(*it));
        // The group's read counter, as Redis keeps it: one more per entry while it is known
        // and no XDEL tombstone lies ahead, else estimated from the stream's counters.
        if (g.entries_read >= 0 && !range_has_tombstones(st, it->id)) {
          ++g.entries_read;
        } else if (st.added > 0) {
          g.entries_read = estimate_entries_read(st, it->id);
        }
        g.last_delivered = it->id;
        if (!noack) g.pel[it->id] = Stream::Pending{consumer, now, 1};
      }
      if (!entries.empty()) {
        out.push_back(Reply::of_array({Reply::of_string(args[first + s]), Reply::of_array(std::move(entries))}));
      }
    }
    if (out.empty()) return Reply::nil();
    return Reply::of_array(std::move(out));
  }

  if (cmd == "XACK") {
    if (n < 4) return wrong_args(cmd);
    std::vector<StreamId> ids;
    ids.reserve(n - 3);
    for (std::size_t i = 3; i < n; ++i) {
      auto id = parse_stream_id<StreamId>(args[i], 0);
      if (!id) return Reply::of_error(kBadStreamId);
      ids.push_back(*id);
    }
    Stream* st = ops.find_as<Stream>(args[1]);
    if (!st) return Reply::of_integer(0);
    auto g = st->groups.find(args[2]);
    if (g == st->groups.end()) return Reply::of_integer(0);
    std::int64_t acked = 0;
    for (const StreamId& id : ids) acked += static_cast<std::int64_t>(g->second.pel.erase(id));
    return Reply::of_integer(acked);
  }

  if (cmd == "XPENDING") {
    if (n < 3) return wrong_args(cmd);
    const bool extended = n > 3;
    std::int64_t min_idle = 0;
    std::size_t i = 3;
    if (extended) {
      if (n - i >= 2 && upper(args[i]) == "IDLE") {
        min_idle = int64_arg(args[i + 1]);
        i += 2;
      }
      if (n - i != 3 && n - i != 4) return Reply::of_error(kSyntax);
    }
    std::optional<StreamId> lo, hi;
    std::int64_t count = 0;
    if (extended) {
      lo = interval_bound<StreamId>(args[i], true);
      hi = interval_bound<StreamId>(args[i + 1], false);
      if (!lo || !hi) return Reply::of_error(kBadStreamId);
      count = int64_arg(args[i + 2]);
      if (count < 0) count = 0;
    }
    Stream* st = ops.find_as<Stream>(args[1]);
    if (!st || !st->groups.count(args[2])) return nogroup(args[1], args[2]);
    const StreamGroup& g = st->groups[args[2]];
    if (!extended) {
      if (g.pel.empty()) {
        return Reply::of_array({Reply::of_integer(0), Reply::nil(), Reply::nil(), Reply::nil()});
      }
      std::map<std::string, std::int64_t> per_consumer;
      for (const auto& [id, p] : g.pel) ++per_consumer[p.consumer];
      std::vector<Reply> consumers;
      for (const auto& [name, c] : per_consumer) {
        consumers.push_back(Reply::of_array({Reply::of_string(name), Reply::of_string(to_string(c))}));
      }
      return Reply::of_array({Reply::of_integer(static_cast<std::int64_t>(g.pel.size())),
                              id_reply(g.pel.begin()->first), id_reply(g.pel.rbegin()->first),
                              Reply::of_array(std::move(consumers))});
    }
    const std::string* only = n - i == 4 ? &args[i + 3] : nullptr;
    std::vector<Reply> out;
    if (*lo <= *hi) {
      for (auto it = g.pel.lower_bound(*lo); it != g.pel.end() && it->first <= *hi; ++it) {
        if (static_cast<std::int64_t>(out.size()) >= count) break;
        const std::int64_t idle = now - it->second.delivered_at;
        if (idle < min_idle || (only && it->second.consumer != *only)) continue;
        out.push_back(Reply::of_array({id_reply(it->first), Reply::of_string(it->second.consumer),
                                       Reply::of_integer(idle), Reply::of_integer(it->second.deliveries)}));
      }
    }
    return Reply::of_array(std::move(out));
  }

  if (cmd == "XAUTOCLAIM") {
    if (n < 6) return wrong_args(cmd);
    auto min_idle = parse_int64(args[4]);
    if (!min_idle) return Reply::of_error("ERR Invalid min-idle-time argument for XAUTOCLAIM");
    if (*min_idle < 0) *min_idle = 0;
    auto start = interval_bound<StreamId>(args[5], true);
    if (!start) return Reply::of_error(kBadStreamId);
    std::int64_t count = 100;
    bool justid = false;
    for (std::size_t i = 6; i < n; ++i) {
      const std::string opt = upper(args[i]);
      if (opt == "COUNT" && i + 1 < n) {
        count = int64_arg(args[++i]);
        if (count < 1 || count > std::numeric_limits<std::int64_t>::max() / 10) {
          return Reply::of_error("ERR COUNT must be > 0");
        }
      } else if (opt == "JUSTID") {
        justid = true;
      } else {
        return Reply::of_error(kSyntax);
      }
    }
    Stream* st = ops.find_as<Stream>(args[1]);
    if (!st || !st->groups.count(args[2])) return nogroup(args[1], args[2]);
    StreamGroup& g = st->groups[args[2]];
    const std::string& consumer = args[3];
    // As Redis: at most COUNT claims and COUNT*10 entries looked at; an entry trimmed from
    // the stream leaves the pending list and is reported in the third element.
    std::int64_t attempts = count * 10;
    std::vector<Reply> claimed, deleted;
    auto it = g.pel.lower_bound(*start);
    while (attempts-- > 0 && count > 0 && it != g.pel.end()) {
      const StreamItem* item = find_item(*st, it->first);
      if (!item) {
        deleted.push_back(id_reply(it->first));
        it = g.pel.erase(it);
        continue;
      }
      if (*min_idle > 0 && now - it->second.delivered_at < *min_idle) {
        ++it;
        continue;
      }
      g.consumers.try_emplace(consumer, now);
      it->second.consumer = consumer;
      it->second.delivered_at = now;
      if (!justid) ++it->second.deliveries;
      claimed.push_back(justid ? id_reply(it->first) : entry_reply(*item));
      --count;
      ++it;
    }
    const StreamId next = it == g.pel.end() ? StreamId{} : it->first;
    return Reply::of_array({id_reply(next), Reply::of_array(std::move(claimed)), Reply::of_array(std::move(deleted))});
  }
  return std::nullopt;
}

}  // namespace redcount
