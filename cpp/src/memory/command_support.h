// What the memory store's command files share: argument parsing and error replies as
// Redis words them. Private to memory/.
#pragma once

#include <cctype>
#include <cstdint>
#include <string>
#include <string_view>

#include "redcount/common/errors.h"
#include "redcount/common/util.h"
#include "redcount/store/reply.h"

namespace redcount::memory_commands {

inline std::string upper(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return out;
}

inline Reply wrong_args(std::string_view cmd) {
  return Reply::of_error("ERR wrong number of arguments for '" + ascii_lower(cmd) + "' command");
}

inline std::int64_t int64_arg(const std::string& s) {
  auto v = parse_int64(s);
  if (!v) throw ReplyError(kNotInteger);
  return *v;
}

}  // namespace redcount::memory_commands
