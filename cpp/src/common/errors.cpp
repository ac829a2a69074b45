#include "redcount/common/errors.h"

#include <array>

#include "redcount/common/util.h"

namespace redcount {

bool ReplyError::transient() const noexcept {
  static constexpr std::array<std::string_view, 7> kTransient = {
      "LOADING", "READONLY", "MASTERDOWN", "TRYAGAIN", "CLUSTERDOWN", "BUSY", "NOREPLICAS"};
  for (auto code : kTransient) {
    if (code_ == code) return true;
  }
  return false;
}

bool is_transient(const std::exception& e) noexcept {
  if (dynamic_cast<const StoreClosed*>(&e)) return false;
  if (dynamic_cast<const ConnectionError*>(&e)) return true;
  if (const auto* r = dynamic_cast<const ReplyError*>(&e)) return r->transient();
  return false;
}

[[noreturn]] void throw_reply_error(std::string message) {
  std::string_view m = message;
  if (m.starts_with("WRONGPASS") || m.starts_with("NOAUTH") || m.starts_with("NOPERM") ||
      m.find("invalid password") != std::string_view::npos ||
      m.find("without any password configured") != std::string_view::npos) {
    throw AuthenticationError(std::move(message));
  }
  // Lua runtime errors come back as "ERR user_script:..." / "ERR Error running script".
  if (m.find("user_script:") != std::string_view::npos ||
      m.find("Error running script") != std::string_view::npos || m.starts_with("NOSCRIPT")) {
    throw ScriptError(std::move(message));
  }
  throw ReplyError(std::move(message));
}

}  // namespace redcount
