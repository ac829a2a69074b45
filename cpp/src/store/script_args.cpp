#include "store/script_args.h"

#include <atomic>
#include <cstdio>
#include <random>

namespace redcount::detail {

UniqueId next_unique_id() {
  static std::atomic<std::uint64_t> seq{0};
  return UniqueId{seq.fetch_add(1, std::memory_order_relaxed)};
}

std::string UniqueId::global() const {
  static const std::string base = [] {
    std::random_device rd;
    const std::uint64_t v = (static_cast<std::uint64_t>(rd()) << 32) ^ rd();
    char buf[17];
    std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
    return std::string(buf);
  }();
  return base + std::to_string(n);
}

std::string UniqueId::local() const {
  std::uint64_t v = n;
  std::string out;
  do {
    out.push_back("0123456789abcdefghijklmnopqrstuvwxyz"[v % 36]);
    v /= 36;
  } while (v != 0);
  return out;
}

std::string unique_id(bool in_process) {
  const UniqueId id = next_unique_id();
  return in_process ? id.local() : id.global();
}

std::optional<std::int64_t> script_time(Keyspace& ks, const std::string& arg, std::int64_t scale) {
  if (arg.empty()) return ks.now_ms() * scale;
  return arg_in(arg, 0, kMaxExact);
}

Reply TimedArgs::answer_with(bool ok, std::string_view script) const {
  if (!ok) return malformed(script);
  answered = true;
  return Reply::of_status(std::string(kAnsweredInPlace));
}

Reply int_array(const Ints& v) {
  Reply r;
  r.type = Reply::Type::Array;
  r.elements.resize(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) {
    r.elements[i].type = Reply::Type::Integer;
    r.elements[i].integer = v[i];
  }
  return r;
}

Reply malformed(std::string_view script) { return Reply::of_error("ERR " + std::string(script) + ": malformed arguments"); }

}  // namespace redcount::detail
