#include "redcount/common/keys.h"

#include <charconv>
#include <cstring>

namespace redcount {
namespace {

// Decimal digits of v, without a temporary string.
struct Digits {
  explicit Digits(std::int64_t v) : n(static_cast<std::size_t>(std::to_chars(buf, buf + sizeof buf, v).ptr - buf)) {}
  std::string_view view() const { return {buf, n}; }
  char buf[24];
  std::size_t n;
};

// A business key goes in as the hash tag "{<key>}". Redis hashes the text between the first '{' and the first '}' after
// it; a key starting with '}' would make that text empty, and an empty tag means "no tag":
// each of the business key's keys would then hash on its whole name and land in a slot of
// its own (CROSSSLOT for request ids and multi-limit calls on a cluster). Such keys, and
// keys starting with the escape character itself, get a '\' in front, which keeps the
// mapping one-to-one and the tag non-empty.
bool needs_escape(std::string_view key) { return !key.empty() && (key.front() == '}' || key.front() == '\\'); }

// Appends the key's tag.
void append_tagged(std::string& out, std::string_view key) {
  out += '{';
  if (needs_escape(key)) out += '\\';
  out.append(key);
  out += '}';
}

char* put(char* p, std::string_view s) {
  if (!s.empty()) std::memcpy(p, s.data(), s.size());
  return p + s.size();
}

// append_tagged() into a buffer sized for it.
char* put_tagged(char* p, std::string_view key, bool escape) {
  *p++ = '{';
  if (escape) *p++ = '\\';
  p = put(p, key);
  *p++ = '}';
  return p;
}

}  // namespace

std::string hash_tag(std::string_view key) {
  std::string out;
  out.reserve(key.size() + 3);
  append_tagged(out, key);
  return out;
}

std::string window_key(std::string_view prefix, std::string_view name, std::string_view key,
                       std::int64_t window_ms, std::int64_t index) {
  const Digits w(window_ms), i(index);
  // Sized once and filled by copies: this runs on every increment, and appending piece by
  // piece costs a capacity check per piece.
  const bool escape = needs_escape(key);
  std::string out(prefix.size() + name.size() + key.size() + (escape ? 1 : 0) + w.n + i.n + 6, '\0');
  char* p = out.data();
  p = put(p, prefix);
  *p++ = ':';
  p = put(p, name);
  *p++ = ':';
  p = put_tagged(p, key, escape);
  *p++ = ':';
  p = put(p, w.view());
  *p++ = ':';
  put(p, i.view());
  return out;
}

std::string request_id_key(std::string_view window_key, std::string_view request_id) {
  std::string out;
  out.reserve(window_key.size() + request_id.size() + 5);
  out.append(window_key).append(":rid:").append(request_id);
  return out;
}

std::string fixed_window_limiter_key(std::string_view prefix, std::string_view key, std::int64_t window_ms,
                                     std::int64_t index, std::string_view tag) {
  if (tag.empty()) return window_key(prefix, "fw", key, window_ms, index);
  std::string kind("fw:@{");
  kind.append(tag).append("}");
  return window_key(prefix, kind, key, window_ms, index);
}

std::string limiter_key(std::string_view prefix, std::string_view kind, std::string_view key, std::int64_t window_ms,
                        std::string_view tag) {
  const Digits w(window_ms);
  // Sized once and filled by copies, as window_key (every hit builds one per limit).
  const bool escape = needs_escape(key);
  const std::size_t tagged = tag.empty() ? 0 : tag.size() + 4;  // ":@{" tag "}"
  std::string out(prefix.size() + kind.size() + tagged + key.size() + (escape ? 1 : 0) + w.n + 5, '\0');
  char* p = out.data();
  p = put(p, prefix);
  *p++ = ':';
  p = put(p, kind);
  if (!tag.empty()) {
    p = put(p, ":@{");
    p = put(p, tag);
    *p++ = '}';
  }
  *p++ = ':';
  p = put_tagged(p, key, escape);
  *p++ = ':';
  put(p, w.view());
  return out;
}

std::string limiter_record_key(std::string_view prefix, std::string_view kind, std::string_view key,
                               std::string_view what, std::string_view request_id, std::string_view tag) {
  std::string out;
  out.reserve(prefix.size() + kind.size() + tag.size() + key.size() + what.size() + request_id.size() + 12);
  out.append(prefix).append(":").append(kind).append(":");
  if (!tag.empty()) out.append("@{").append(tag).append("}:");
  append_tagged(out, key);
  out.append(":").append(what).append(":").append(request_id);
  return out;
}

std::string concurrency_key(std::string_view prefix, std::string_view key) {
  std::string out;
  out.reserve(prefix.size() + key.size() + 6);
  out.append(prefix).append(":cc:");
  append_tagged(out, key);
  return out;
}

std::string penalty_key(std::string_view prefix, std::string_view key, std::string_view component) {
  std::string out;
  out.reserve(prefix.size() + key.size() + component.size() + 10);
  out.append(prefix).append(":pen:");
  append_tagged(out, key);
  out.append(":").append(component);
  return out;
}

std::string sliding_counter_key(std::string_view prefix, std::string_view name, std::string_view key,
                                std::int64_t window_ms, std::string_view suffix) {
  const Digits w(window_ms);
  std::string out;
  out.reserve(prefix.size() + name.size() + key.size() + w.n + suffix.size() + 7);
  out.append(prefix).append(":").append(name).append(":");
  append_tagged(out, key);
  out.append(":").append(w.view()).append(":").append(suffix);
  return out;
}

std::string sharded_value_key(std::string_view prefix, std::string_view name, std::int64_t shard) {
  const Digits i(shard);
  std::string out;
  out.reserve(prefix.size() + name.size() + i.n + 4);
  // Prefix and name never hold braces (validate_name), so the tag is exactly this text.
  out.append("{").append(prefix).append(":").append(name).append(":").append(i.view()).append("}");
  return out;
}

std::string sharded_key(std::string_view prefix, std::string_view name, std::int64_t shard,
                        std::string_view suffix) {
  std::string out = sharded_value_key(prefix, name, shard);
  out.reserve(out.size() + suffix.size() + 1);
  out.append(":").append(suffix);
  return out;
}

std::string sharded_layout_key(std::string_view prefix, std::string_view name) {
  std::string out;
  out.reserve(prefix.size() + name.size() + 10);
  out.append("{").append(prefix).append(":").append(name).append("}:layout");
  return out;
}

std::string quota_key(std::string_view prefix, std::string_view name) {
  std::string out;
  out.reserve(prefix.size() + name.size() + 10);
  out.append(prefix).append(":quota:");
  append_tagged(out, name);
  return out;
}

std::string pn_key(std::string_view prefix, std::string_view name, std::string_view component) {
  std::string out;
  out.reserve(prefix.size() + name.size() + component.size() + 8);
  out.append(prefix).append(":pn:");
  append_tagged(out, name);
  out.append(":").append(component);
  return out;
}

}  // namespace redcount
