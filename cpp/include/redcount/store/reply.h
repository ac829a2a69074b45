// A server reply held by value, independent of hiredis.
//
// Both stores answer with `Reply`, so counters never see hiredis types:
//
//   Reply r = store.execute_one(Command{"PTTL", key});
//   int64_t ms = r.as_integer();
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace redcount {

struct Reply {
  enum class Type { Nil, Integer, String, Status, Error, Array };

  Type type = Type::Nil;
  std::int64_t integer = 0;
  std::string str;  // String, Status and Error text
  std::vector<Reply> elements;

  static Reply nil() { return Reply{}; }
  static Reply of_integer(std::int64_t v) {
    Reply r;
    r.type = Type::Integer;
    r.integer = v;
    return r;
  }
  static Reply of_string(std::string s) {
    Reply r;
    r.type = Type::String;
    r.str = std::move(s);
    return r;
  }
  static Reply of_status(std::string s) {
    Reply r;
    r.type = Type::Status;
    r.str = std::move(s);
    return r;
  }
  static Reply of_error(std::string s) {
    Reply r;
    r.type = Type::Error;
    r.str = std::move(s);
    return r;
  }
  static Reply of_array(std::vector<Reply> e) {
    Reply r;
    r.type = Type::Array;
    r.elements = std::move(e);
    return r;
  }

  bool is_nil() const noexcept { return type == Type::Nil; }
  bool is_error() const noexcept { return type == Type::Error; }

  // Throws the matching ReplyError subclass when this is an error reply.
  const Reply& check() const;
  // An Integer reply, or a String holding a decimal int64 (scripts return huge
  // counts as strings because Lua numbers are doubles). Throws ProtocolError otherwise.
  std::int64_t as_integer() const;
  // A String or Status reply's text; nil gives std::nullopt.
  std::optional<std::string> as_string() const;
};

// What became of one request of a batch that failed part-way (a batch spread over the
// nodes of a Redis Cluster, one of which was lost), as ConnectionError::outcomes() holds
// it: its reply (which may be an error reply), Maybe (written, unanswered: it may or may
// not have run) or NotSent.
struct RequestOutcome {
  enum class Kind { Reply, Maybe, NotSent };
  Kind kind = Kind::NotSent;
  Reply reply;
};

}  // namespace redcount
