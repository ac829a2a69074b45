// Shared helpers for the redcount GoogleTest suite.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <exception>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "redcount/common/clock.h"
#include "redcount/common/errors.h"
#include "redcount/memory/memory_store.h"
#include "redcount/common/options.h"
#include "redcount/store/reply.h"
#include "redcount/store/store.h"

namespace rctest {

using redcount::Command;
using redcount::Reply;
using redcount::Store;

// A UTC midnight: a whole number of days, hours, minutes and seconds since the epoch,
// so every window size used in the tests starts exactly here.
inline constexpr std::int64_t kT0 = 1'700'006'400'000;

// A memory store on `clock`; sweep 0 ms = no sweeper thread (fully deterministic).
inline std::shared_ptr<redcount::MemoryStore> memory_store(std::shared_ptr<redcount::Clock> clock,
                                                           std::chrono::milliseconds sweep =
                                                               std::chrono::milliseconds(0)) {
  redcount::StoreOptions o;
  o.clock = std::move(clock);
  o.sweep_interval = sweep;
  return std::make_shared<redcount::MemoryStore>(o);
}

inline Reply run(Store& s, std::vector<std::string> args) { return s.execute_one(Command{std::move(args)}); }

// Concatenates strings and integers. (Tests build keys with this rather than
// `"k" + std::to_string(i)`: GCC 12 at -O3 reports a false -Wrestrict in that form.)
inline void append_part(std::string& out, std::string_view s) { out.append(s); }
inline void append_part(std::string& out, std::int64_t v) { out.append(std::to_string(v)); }
template <class... Parts>
std::string cat(const Parts&... parts) {
  std::string out;
  (append_part(out, parts), ...);
  return out;
}

inline bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

// Live keys matching `pattern`, sorted.
inline std::vector<std::string> keys(Store& s, const std::string& pattern = "*") {
  Reply r = run(s, {"KEYS", pattern});
  std::vector<std::string> out;
  for (const auto& e : r.elements) out.push_back(e.str);
  std::sort(out.begin(), out.end());
  return out;
}

// Every live key with its value and PTTL: the whole observable state of a store.
using Snapshot = std::map<std::string, std::pair<std::string, std::int64_t>>;
inline Snapshot snapshot(Store& s) {
  Snapshot out;
  for (const auto& k : keys(s)) {
    auto v = run(s, {"GET", k}).as_string();
    out[k] = {v.value_or("<nil>"), run(s, {"PTTL", k}).as_integer()};
  }
  return out;
}

// Runs f, expects it to throw exactly E (or a subclass) and returns the message.
template <class E, class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "threw the wrong exception type: " << e.what();
    return "<wrong exception>";
  }
  ADD_FAILURE() << "did not throw";
  return "<no exception>";
}

}  // namespace rctest
