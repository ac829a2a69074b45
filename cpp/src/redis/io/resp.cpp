#include "redcount/redis/io/resp.h"

#include <hiredis/hiredis.h>
#include <hiredis/read.h>

#include <charconv>
#include <system_error>

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
  if (!direct_) {
    if (redisReaderFeed(reader_.get(), data, len) != REDIS_OK) {
      throw ProtocolError(std::string("cannot buffer a reply: ") + reader_->errstr);
    }
    return;
  }
  if (pos_ == pending_.size()) {
    pending_.clear();
    pos_ = 0;
  } else if (pos_ > 4096 && pos_ * 2 > pending_.size()) {
    pending_.erase(0, pos_);
    pos_ = 0;
  }
  pending_.append(data, len);
}

namespace {

// A RESP integer exactly as a server writes it (no '+', no leading zeros, no "-0"), the
// form hiredis accepts; anything else goes to hiredis for its own verdict.
bool plain_int(std::string_view text, long long& v) {
  if (text.empty() || text.size() > 20) return false;
  const bool neg = text[0] == '-';
  const std::string_view digits = neg ? text.substr(1) : text;
  if (digits.empty() || (digits[0] == '0' && (digits.size() > 1 || neg))) return false;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  return ec == std::errc() && end == text.data() + text.size();
}

// Nesting parsed in place; deeper replies (no command redcount sends gets one) go to hiredis.
constexpr int kMaxDirectDepth = 7;

bool parse_at(std::string_view data, std::size_t& at, Reply& out, int depth) {
  if (at >= data.size()) return false;
  const char type = data[at];
  const std::size_t cr = data.find("\r\n", at + 1);  // the end of the type's line
  if (cr == std::string_view::npos) return false;
  const std::string_view line = data.substr(at + 1, cr - at - 1);
  std::size_t next = cr + 2;
  switch (type) {
    case '+':
    case '-':
      if (line.find('\r') != std::string_view::npos || line.find('\n') != std::string_view::npos) return false;
      out.type = type == '+' ? Reply::Type::Status : Reply::Type::Error;
      out.str.assign(line);
      break;
    case ':': {
      long long v = 0;
      if (!plain_int(line, v)) return false;
      out.type = Reply::Type::Integer;
      out.integer = v;
      break;
    }
    case '$': {
      long long n = 0;
      if (!plain_int(line, n) || n < -1 || n > (1LL << 40)) return false;
      if (n == -1) {
        out.type = Reply::Type::Nil;
        break;
      }
      const auto len = static_cast<std::size_t>(n);
      if (data.size() - next < len + 2) return false;
      if (data[next + len] != '\r' || data[next + len + 1] != '\n') return false;
      out.type = Reply::Type::String;
      out.str.assign(data.substr(next, len));
      next += len + 2;
      break;
    }
    case '*': {
      long long n = 0;
      if (!plain_int(line, n) || n < -1 || n > kMaxReplyElements || depth >= kMaxDirectDepth) return false;
      if (n == -1) {
        out.type = Reply::Type::Nil;
        break;
      }
      // Every element takes at least 3 bytes ("+\r\n", an empty status): an array that
      // cannot be complete yet is not built at all.
      if (static_cast<std::size_t>(n) > (data.size() - next) / 3) return false;
      out.type = Reply::Type::Array;
      out.elements.resize(static_cast<std::size_t>(n));
      for (Reply& e : out.elements) {
        if (!parse_at(data, next, e, depth + 1)) return false;
      }
      break;
    }
    default:
      return false;  // RESP3 types, or garbage: hiredis's verdict
  }
  at = next;
  return true;
}

}  // namespace

bool Parser::parse_direct(Reply& out) {
  std::size_t at = pos_;
  if (!parse_at(pending_, at, out, 0)) return false;
  pos_ = at;
  return true;
}

std::optional<Reply> Parser::next() {
  if (direct_) {
    if (pos_ == pending_.size()) return std::nullopt;
    Reply r;
    if (parse_direct(r)) return r;
    // In pieces, or not plain RESP2: hiredis takes the rest, and keeps it until drained.
    const std::size_t rest = pending_.size() - pos_;
    if (redisReaderFeed(reader_.get(), pending_.data() + pos_, rest) != REDIS_OK) {
      throw ProtocolError(std::string("cannot buffer a reply: ") + reader_->errstr);
    }
    pending_.clear();
    pos_ = 0;
    direct_ = false;
  }
  void* raw = nullptr;
  t_refused_elements = 0;
  if (redisReaderGetReply(reader_.get(), &raw) != REDIS_OK) {
    if (t_refused_elements != 0) {
      throw ProtocolError("invalid reply from the server: an array of " + std::to_string(t_refused_elements) +
                          " elements (at most " + std::to_string(kMaxReplyElements) + " are accepted)");
    }
    throw ProtocolError(std::string("invalid reply from the server: ") + reader_->errstr);
  }
  // hiredis holds nothing more (its buffer is drained, and no reply is half read): parse
  // in place again from the next bytes.
  if (reader_->pos == reader_->len && reader_->ridx == -1) direct_ = true;
  if (raw == nullptr) return std::nullopt;
  std::unique_ptr<void, ReplyDeleter> guard(raw);
  return convert(static_cast<redisReply*>(raw));
}

}  // namespace redcount::resp
