// RESP on the wire: requests formatted straight into a byte buffer, and replies parsed into
// redcount::Reply: complete RESP2 replies straight from the bytes, anything else (a reply
// still arriving, malformed bytes, RESP3 types) by hiredis's redisReader. No socket here: the connection feeds bytes in
// and takes bytes out, so this file is the whole of redcount's protocol knowledge.
//
//   std::string out;
//   std::vector<std::string> scratch;
//   resp::format(out, Command{{"INCR", "k"}}, scratch);   // "*2\r\n$4\r\nINCR\r\n$1\r\nk\r\n"
//   resp::Parser p;
//   p.feed(bytes, n);
//   while (auto reply = p.next()) use(*reply);             // throws ProtocolError on bad bytes
//
// A Parser is used by one thread at a time; the functions are thread-safe.
#pragma once

#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "redcount/store/reply.h"
#include "redcount/store/store.h"

struct redisReader;

namespace redcount::resp {

// Appends one command (an array of bulk strings).
void format_args(std::string& out, const std::vector<std::string_view>& args);
void format_args(std::string& out, const std::vector<std::string>& args);
// Appends a request: a Command as it is, a ScriptCall as EVALSHA <sha1> <numkeys> keys...
// argv... with ARGV from call.argv(scratch) (typed arguments rendered as text).
void format(std::string& out, const Request& request, std::vector<std::string>& scratch);
// SCRIPT LOAD <source>.
void format_script_load(std::string& out, const Script& script);

class Parser {
 public:
  Parser();
  ~Parser();
  Parser(const Parser&) = delete;
  Parser& operator=(const Parser&) = delete;

  void feed(const char* data, std::size_t len);
  // The next complete reply, or nullopt when more bytes are needed. Throws ProtocolError,
  // also for an array announcing more than 2^27 elements (refused before any allocation).
  std::optional<Reply> next();

 private:
  struct Deleter {
    void operator()(redisReader* r) const noexcept;
  };
  // Parses one complete reply at pending_[pos_..] into `out`, advancing pos_; false (pos_
  // untouched) when the reply is incomplete or anything but plain well-formed RESP2.
  bool parse_direct(Reply& out);

  std::unique_ptr<redisReader, Deleter> reader_;
  // Bytes not yet parsed, while hiredis holds none (direct_): a batch's replies are
  // mostly complete in one read, and parsing them in place spares hiredis's allocation of
  // a reply object per element and the copy of every one into a Reply.
  std::string pending_;
  std::size_t pos_ = 0;
  bool direct_ = true;  // false: hiredis holds bytes (a reply in pieces); it parses until drained
};

}  // namespace redcount::resp
