#include "redcount/redis/resp.h"

#include <hiredis/hiredis.h>
#include <hiredis/read.h>

#include <charconv>

#include "redcount/common/errors.h"

namespace redcount::resp {
namespace {

void append_number(std::string& out, char prefix, std::size_t n) {
  char digits[24];
  digits[0] = prefix;
  auto [end, ec] = std::to_chars(digits + 1, digits + sizeof digits, n);
  (void)ec;
  out.append(digits, end);
  out.append("\r\n", 2);
}

void append_bulk(std::string& out, std::string_view arg) {
  append_number(out, '$', arg.size());
  out.append(arg);
  out.append("\r\n", 2);
}

Reply convert(const redisReply* r) {
  switch (r->type) {
    case REDIS_REPLY_INTEGER:
      return Reply::of_integer(r->integer);
    case REDIS_REPLY_STRING:
      return Reply::of_string(std::string(r->str, r->len));
    case REDIS_REPLY_STATUS:
      return Reply::of_status(std::string(r->str, r->len));
    case REDIS_REPLY_ERROR:
      return Reply::of_error(std::string(r->str, r->len));
    case REDIS_REPLY_NIL:
      return Reply::nil();
    case REDIS_REPLY_ARRAY: {
      std::vector<Reply> elements;
      elements.reserve(r->elements);
      for (std::size_t i = 0; i < r->elements; ++i) elements.push_back(convert(r->element[i]));
      return Reply::of_array(std::move(elements));
    }
    default:
      throw ProtocolError("unexpected reply type " + std::to_string(r->type));
  }
}

struct ReplyDeleter {
  void operator()(void* r) const noexcept { freeReplyObject(r); }
};

}  // namespace

// hiredis's own formatter is several times slower per argument, and batches have
// thousands of them; the reader is what hiredis is kept for.
void format_args(std::string& out, const std::vector<std::string_view>& args) {
  append_number(out, '*', args.size());
  for (auto a : args) append_bulk(out, a);
}

void format_args(std::string& out, const std::vector<std::string>& args) {
  append_number(out, '*', args.size());
  for (const auto& a : args) append_bulk(out, a);
}

void format(std::string& out, const Request& request, std::vector<std::string>& scratch) {
  if (const auto* cmd = std::get_if<Command>(&request)) {
    if (cmd->args.empty()) throw InvalidArgument("empty command");
    format_args(out, cmd->args);
    return;
  }
  const auto& call = std::get<ScriptCall>(request);
  if (call.script == nullptr) throw InvalidArgument("a script call without a script");
  const std::vector<std::string>& argv = call.argv(scratch);
  append_number(out, '*', 3 + call.keys.size() + argv.size());
  append_bulk(out, "EVALSHA");
  append_bulk(out, call.script->sha1);
  char digits[24];
  auto [end, ec] = std::to_chars(digits, digits + sizeof digits, call.keys.size());
  (void)ec;
  append_bulk(out, std::string_view(digits, static_cast<std::size_t>(end - digits)));
  for (const auto& k : call.keys) append_bulk(out, k);
  for (const auto& a : argv) append_bulk(out, a);
}

void format_script_load(std::string& out, const Script& script) {
  format_args(out, std::vector<std::string_view>{"SCRIPT", "LOAD", script.source});
}

void Parser::Deleter::operator()(redisReader* r) const noexcept { redisReaderFree(r); }

Parser::Parser() : reader_(redisReaderCreate()) {
  if (!reader_) throw std::bad_alloc();
}

Parser::~Parser() = default;

void Parser::feed(const char* data, std::size_t len) {
  if (redisReaderFeed(reader_.get(), data, len) != REDIS_OK) {
    throw ProtocolError(std::string("cannot buffer a reply: ") + reader_->errstr);
  }
}

std::optional<Reply> Parser::next() {
  void* raw = nullptr;
  if (redisReaderGetReply(reader_.get(), &raw) != REDIS_OK) {
    throw ProtocolError(std::string("invalid reply from the server: ") + reader_->errstr);
  }
  if (raw == nullptr) return std::nullopt;
  std::unique_ptr<void, ReplyDeleter> guard(raw);
  return convert(static_cast<redisReply*>(raw));
}

}  // namespace redcount::resp
