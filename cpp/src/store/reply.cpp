#include "redcount/store/reply.h"

#include <string>

#include "redcount/common/errors.h"
#include "redcount/common/util.h"

namespace redcount {

const Reply& Reply::check() const {
  if (type == Type::Error) throw_reply_error(str);
  return *this;
}

std::int64_t Reply::as_integer() const {
  check();
  if (type == Type::Integer) return integer;
  if (type == Type::String) {
    if (auto v = parse_int64(str)) return *v;
  }
  throw ProtocolError("expected an integer reply, got " +
                      (type == Type::Nil ? std::string("nil") : "'" + str.substr(0, 64) + "'"));
}

std::optional<std::string> Reply::as_string() const {
  check();
  if (type == Type::Nil) return std::nullopt;
  if (type == Type::String || type == Type::Status) return str;
  if (type == Type::Integer) return to_string(integer);
  throw ProtocolError("expected a string reply, got an array");
}

}  // namespace redcount
