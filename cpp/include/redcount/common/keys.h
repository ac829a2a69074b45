// Every storage key redcount writes, built in one place, with the hash-tag policy.
//
//   std::string k = window_key("redcount", "views", "user:42", 3'600'000, 472'224);
//   // "redcount:views:{user:42}:3600000:472224"
//
// Hash tags: the business key goes inside {braces} in every key that belongs to it (its
// windows, request ids, limiter state, sliding logs), so on Redis Cluster all of them
// share one slot and one script call may touch them together. That is also why prefixes
// and names may not contain '{' or '}' (validate_name). A user key may contain braces:
// Redis takes the first '{' ... first '}' after it, and every key of that business key
// is built the same way, so they still share a slot.
//
// Layouts:
//   counter window        <prefix>:<name>:{<key>}:<window_ms>:<index>
//   request id            <window key>:rid:<request_id>
//   fixed-window limiter  <prefix>:fw:{<key>}:<window_ms>:<index>
//   other limiters        <prefix>:<kind>:{<key>}:<window_ms>   (kind sw, swa<k>, tb, gcra)
//   ... under a tag       the same with ":@{<tag>}" after the kind, the key's own tag
//                         following: <prefix>:fw:@{<tag>}:{<key>}:<window_ms>:<index>
//                         (Redis hashes the first {...}: every key under one tag shares a
//                         slot, so one script call decides them together)
//   The limit's amount (and a bucket's capacity) is not part of a limiter's key: a key
//   keeps its state when its limit changes (see docs/limiting.md).
//   limiter request id    <prefix>:<kind>:{<key>}:refund:<request_id>    (a refund's marker)
//                         <prefix>:<kind>:{<key>}:reserve:<request_id>   (a reservation)
//   concurrency           <prefix>:cc:{<key>}
//   penalty               <prefix>:pen:{<key>}:b | :n | :l   (block, refusal count, last block)
//   sliding counter       <prefix>:<name>:{<key>}:<window_ms>:log | :log:w | :uniq
//   sharded counter       {<prefix>:<name>:<shard>}            value (a string)
//   its shard layout      {<prefix>:<name>}:layout             generations (a string)
//                         {<prefix>:<name>:<shard>}:rid:<id>   request id
//                         {<prefix>:<name>:<shard>}:log        delta log (a stream)
//                         (each shard is its own tag, so shards spread over Cluster slots)
//   quota                 <prefix>:quota:{<name>} and <prefix>:quota:{<name>}:rid:<id>
//   PN-counter            <prefix>:pn:{<name>}:p and <prefix>:pn:{<name>}:n (hashes: region -> total)
//
// Pure functions; thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace redcount {

// "{<key>}": the hash tag of a business key.
std::string hash_tag(std::string_view key);

std::string window_key(std::string_view prefix, std::string_view name, std::string_view key,
                       std::int64_t window_ms, std::int64_t index);
std::string request_id_key(std::string_view window_key, std::string_view request_id);
// `tag`: empty, or a hash tag (no braces: validate_name) that the key is put under.
std::string fixed_window_limiter_key(std::string_view prefix, std::string_view key, std::int64_t window_ms,
                                     std::int64_t index, std::string_view tag = {});
// Built with one allocation: it is on every limiter hit.
std::string limiter_key(std::string_view prefix, std::string_view kind, std::string_view key,
                        std::int64_t window_ms, std::string_view tag = {});
std::string concurrency_key(std::string_view prefix, std::string_view key);
// A penalty's state of `key` (policies.h): `component` is "b" (the block), "n" (refusals
// counted) or "l" (the last block's length). In the slot of the key's limiter state.
std::string penalty_key(std::string_view prefix, std::string_view key, std::string_view component);
// A request id's record for a limiter key: `what` is "refund" (a refund's marker) or
// "reserve" (a reservation). Under a non-empty `tag` it is in the tag's slot, with the
// tagged state it concerns: "<prefix>:<kind>:@{<tag>}:{<key>}:<what>:<id>".
std::string limiter_record_key(std::string_view prefix, std::string_view kind, std::string_view key,
                               std::string_view what, std::string_view request_id, std::string_view tag = {});
// `suffix` is "log", "log:w" or "uniq".
std::string sliding_counter_key(std::string_view prefix, std::string_view name, std::string_view key,
                                std::int64_t window_ms, std::string_view suffix);

// A sharded counter's shard: "{<prefix>:<name>:<shard>}", its value key and the tag of its
// request ids and delta log.
std::string sharded_value_key(std::string_view prefix, std::string_view name, std::int64_t shard);
// `suffix` is "log" or "rid:<request id>".
std::string sharded_key(std::string_view prefix, std::string_view name, std::int64_t shard,
                        std::string_view suffix);
// A sharded counter's layout (its shard generations, written by reshard): "{<prefix>:<name>}:layout".
std::string sharded_layout_key(std::string_view prefix, std::string_view name);
std::string quota_key(std::string_view prefix, std::string_view name);
// A PN-counter's hash; `component` is "p" or "n".
std::string pn_key(std::string_view prefix, std::string_view name, std::string_view component);

}  // namespace redcount
