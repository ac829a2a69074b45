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

// hiredis allocates an array's element pointers as soon as it reads the header, so a reply
// announcing two billion elements (a broken server or proxy, garbage on the socket) costs
// 16 GB before a single element arrives. No reply redcount can use comes near this: 2^27
// elements already hold gigabytes once built.
constexpr int kMaxReplyElements = 1 << 27;
// hiredis's own reply constructors, kept for everything but the size check.
const redisReplyObjectFunctions* g_hiredis_functions = nullptr;
// The element count refused by the last create_array on this thread (0: none): the reader
// only says "Out of memory" when a constructor returns null.
thread_local long long t_refused_elements = 0;

void* create_array(const redisReadTask* task, int elements) {
  if (elements > kMaxReplyElements) {
    t_refused_elements = elements;
    return nullptr;
  }
  return g_hiredis_functions->createArray(task, elements);
}

redisReplyObjectFunctions* checked_functions(redisReplyObjectFunctions* hiredis_defaults) {
  static redisReplyObjectFunctions functions = [&] {
    g_hiredis_functions = hiredis_defaults;
    redisReplyObjectFunctions f = *hiredis_defaults;
    f.createArray = &create_array;
    return f;
  }();
  return &functions;
}

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
  reader_->fn = checked_functions(reader_->fn);
}

Parser::~Parser() = default;

void Parser::feed(const char* data, std::size_t len) {
  if (redisReaderFeed(reader_.get(), data, len) != REDIS_OK) {
    throw ProtocolError(std::string("cannot buffer a reply: ") + reader_->errstr);
  }
}

std::optional<Reply> Parser::next() {
  void* raw = nullptr;
  t_refused_elements = 0;
  if (redisReaderGetReply(reader_.get(), &raw) != REDIS_OK) {
    if (t_refused_elements != 0) {
      throw ProtocolError("invalid reply from the server: an array of " + std::to_string(t_refused_elements) +
                          " elements (at most " + std::to_string(kMaxReplyElements) + " are accepted)");
    }
    throw ProtocolError(std::string("invalid reply from the server: ") + reader_->errstr);
  }
  if (raw == nullptr) return std::nullopt;
  std::unique_ptr<void, ReplyDeleter> guard(raw);
  return convert(static_cast<redisReply*>(raw));
}

}  // namespace redcount::resp
