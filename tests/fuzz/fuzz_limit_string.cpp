// libFuzzer target: the rate-limit string parser ("10/minute", "5/second;100/hour",
// "10/second burst 50").
//
// Any input must either parse into limits within the documented bounds, whose canonical
// text() parses back to the same limit, or be refused with InvalidArgument whose message
// stays short however long the input is.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "redcount/common/bounds.h"
#include "redcount/common/errors.h"
#include "redcount/common/limit_string.h"
#include "redcount/common/util.h"

using namespace redcount;

namespace {

void require(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "invariant broken: %s\n", what);
    std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  std::vector<RateLimit> limits;
  try {
    limits = parse_limits(text);
  } catch (const InvalidArgument& e) {
    // Each quoted part is cut at 80 input bytes (up to 4 output bytes each when escaped).
    const std::string_view message = e.what();
    require(message.size() < 2048, "a limit-string error stays short");
    for (std::size_t i = 0; i < message.size();) {
      if (static_cast<unsigned char>(message[i]) < 0x80) {
        ++i;
        continue;
      }
      const std::size_t n = utf8_char_length(message, i);
      require(n > 0, "a limit-string error is valid UTF-8 (Python decodes it strictly)");
      i += n;
    }
    return 0;
  }
  require(!limits.empty() && limits.size() <= 16, "1 to 16 limits");
  for (const RateLimit& l : limits) {
    require(l.amount >= 1 && l.amount <= kMaxAmount, "amount in bounds");
    require(l.multiple >= 1, "multiple >= 1");
    require(l.window_ms >= 1000 && l.window_ms <= kMaxWindowMs, "window in bounds");
    require(l.burst >= 0 && l.burst <= kMaxAmount, "burst in bounds");
    std::vector<RateLimit> again;
    try {
      again = parse_limits(l.text());
    } catch (const InvalidArgument&) {
      require(false, "text() parses back");
    }
    require(again.size() == 1, "text() is one limit");
    const RateLimit& a = again[0];
    require(a.amount == l.amount && a.multiple == l.multiple && a.window_ms == l.window_ms && a.unit == l.unit &&
                a.burst == l.burst,
            "text() parses back to the same limit");
  }
  return 0;
}
