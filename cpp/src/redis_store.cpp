#include "redcount/redis_store.h"

#include <hiredis/hiredis.h>
#include <hiredis/sds.h>
#include <sys/socket.h>
#include <sys/time.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <string_view>

#include "redcount/errors.h"
#include "redcount/util.h"

namespace redcount {
namespace {

using SteadyClock = std::chrono::steady_clock;

// Output bytes after which a pipeline is written out before the rest is formatted.
constexpr std::size_t kEarlyWriteBytes = 4096;

timeval to_timeval(std::chrono::milliseconds ms) {
  timeval tv{};
  tv.tv_sec = static_cast<time_t>(ms.count() / 1000);
  tv.tv_usec = static_cast<suseconds_t>((ms.count() % 1000) * 1000);
  return tv;
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

void append_bulk(std::string& out, std::string_view arg) {
  char digits[24];
  auto [end, ec] = std::to_chars(digits, digits + sizeof digits, arg.size());
  (void)ec;
  out.push_back('$');
  out.append(digits, end);
  out.append("\r\n");
  out.append(arg);
  out.append("\r\n");
}

void append_header(std::string& out, std::size_t argc) {
  char digits[24];
  auto [end, ec] = std::to_chars(digits, digits + sizeof digits, argc);
  (void)ec;
  out.push_back('*');
  out.append(digits, end);
  out.append("\r\n");
}

// Formats one request as RESP straight into `out` (hiredis's own formatter is several
// times slower per argument, and batches have thousands of them).
void format_request(std::string& out, const Request& req) {
  if (const auto* cmd = std::get_if<Command>(&req)) {
    if (cmd->args.empty()) throw InvalidArgument("empty command");
    append_header(out, cmd->args.size());
    for (const auto& a : cmd->args) append_bulk(out, a);
    return;
  }
  const auto& call = std::get<ScriptCall>(req);
  append_header(out, 3 + call.keys.size() + call.args.size());
  append_bulk(out, "EVALSHA");
  append_bulk(out, call.script->sha1);
  char digits[24];
  auto [end, ec] = std::to_chars(digits, digits + sizeof digits, call.keys.size());
  (void)ec;
  append_bulk(out, std::string_view(digits, static_cast<std::size_t>(end - digits)));
  for (const auto& k : call.keys) append_bulk(out, k);
  for (const auto& a : call.args) append_bulk(out, a);
}

void append_formatted(redisContext* c, const std::string& buf) {
  if (redisAppendFormattedCommand(c, buf.data(), buf.size()) != REDIS_OK) {
    throw ConnectionError("could not buffer a command: out of memory");
  }
}

}  // namespace

void RedisStore::ContextDeleter::operator()(redisContext* c) const noexcept { redisFree(c); }

// A connection leased from the pool; goes back (or is dropped) in the destructor.
class RedisStore::Lease {
 public:
  Lease(RedisStore* store, std::unique_ptr<Connection> conn) : store_(store), conn_(std::move(conn)) {}
  Lease(Lease&& o) noexcept = default;
  Lease& operator=(Lease&&) = delete;
  ~Lease() {
    if (conn_) store_->give_back(std::move(conn_), healthy_);
  }
  redisContext* ctx() const { return conn_->ctx.get(); }
  void mark_broken() { healthy_ = false; }

  // Throws the right ConnectionError subclass for the context's error and marks the
  // connection broken: after any I/O error a hiredis context is unusable.
  [[noreturn]] void fail(const std::string& where) {
    healthy_ = false;
    redisContext* c = ctx();
    std::string msg = c->errstr;
    if (c->err == REDIS_ERR_IO && (msg == std::strerror(EAGAIN) || msg == std::strerror(EWOULDBLOCK) ||
                                   msg == std::strerror(ETIMEDOUT))) {
      throw TimeoutError("timed out waiting for a reply from " + where +
                         " (command_timeout=" + std::to_string(store_->options_.command_timeout.count()) +
                         " ms); the command may or may not have run");
    }
    if (c->err == REDIS_ERR_EOF) {
      throw ConnectionError("connection to " + where + " closed by the server: " + msg);
    }
    throw ConnectionError("connection to " + where + " failed: " + msg);
  }

  void flush(const std::string& where) {
    int done = 0;
    do {
      if (redisBufferWrite(ctx(), &done) != REDIS_OK) fail(where);
    } while (!done);
  }

  Reply read(const std::string& where) {
    void* raw = nullptr;
    if (redisGetReply(ctx(), &raw) != REDIS_OK) fail(where);
    std::unique_ptr<void, ReplyDeleter> guard(raw);
    return convert(static_cast<redisReply*>(raw));
  }

 private:
  RedisStore* store_;
  std::unique_ptr<Connection> conn_;
  bool healthy_ = true;
};

RedisStore::RedisStore(StoreOptions options) : options_(std::move(options)) {
  if (options_.max_connections < 1) {
    throw InvalidArgument("max_connections must be >= 1, got " + std::to_string(options_.max_connections));
  }
  if (options_.connect_timeout.count() < 0 || options_.command_timeout.count() < 0 ||
      options_.pool_timeout.count() < 0) {
    throw InvalidArgument("timeouts must be >= 0 (0 means wait forever)");
  }
}

RedisStore::~RedisStore() { close(); }

void RedisStore::close() {
  std::lock_guard<std::mutex> lock(mu_);
  closed_ = true;
  open_ -= static_cast<int>(idle_.size());
  idle_.clear();
  cv_.notify_all();
}

int RedisStore::open_connections() const {
  std::lock_guard<std::mutex> lock(mu_);
  return open_;
}

std::string RedisStore::describe() const {
  if (options_.kind == StoreOptions::Kind::Unix) {
    return "unix://" + options_.unix_path + "?db=" + std::to_string(options_.db);
  }
  return "redis://" + (options_.username.empty() ? std::string() : options_.username + "@") +
         options_.host + ":" + std::to_string(options_.port) + "/" + std::to_string(options_.db);
}

std::string RedisStore::where() const {
  if (options_.kind == StoreOptions::Kind::Unix) return "unix socket " + options_.unix_path;
  return options_.host + ":" + std::to_string(options_.port);
}

void RedisStore::give_back(std::unique_ptr<Connection> conn, bool healthy) {
  std::lock_guard<std::mutex> lock(mu_);
  if (healthy && !closed_) {
    conn->last_used = SteadyClock::now();
    idle_.push_back(std::move(conn));
  } else {
    --open_;
  }
  cv_.notify_one();
}

RedisStore::Lease RedisStore::acquire() {
  std::unique_lock<std::mutex> lock(mu_);
  const auto deadline = SteadyClock::now() + options_.pool_timeout;
  for (;;) {
    if (closed_) throw ConnectionError("the store for " + where() + " is closed; open a new one with redcount.connect()");
    if (!idle_.empty()) {
      auto conn = std::move(idle_.back());
      idle_.pop_back();
      lock.unlock();
      // A connection idle for a while may have been closed by the server (restart,
      // timeout, failover). A non-blocking peek finds out without sending anything,
      // so the caller's command is not lost on a dead socket.
      if (SteadyClock::now() - conn->last_used > std::chrono::seconds(1)) {
        char byte;
        ssize_t n = ::recv(conn->ctx->fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
        if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) || n > 0) {
          lock.lock();
          --open_;
          continue;
        }
      }
      return Lease(this, std::move(conn));
    }
    if (open_ < options_.max_connections) {
      ++open_;
      lock.unlock();
      try {
        return Lease(this, connect());
      } catch (...) {
        lock.lock();
        --open_;
        cv_.notify_one();
        throw;
      }
    }
    if (options_.pool_timeout.count() == 0) {
      cv_.wait(lock);
    } else if (cv_.wait_until(lock, deadline) == std::cv_status::timeout && idle_.empty() &&
               open_ >= options_.max_connections) {
      throw TimeoutError("no free connection to " + where() + " after " +
                         std::to_string(options_.pool_timeout.count()) + " ms (max_connections=" +
                         std::to_string(options_.max_connections) + "); raise max_connections or pool_timeout");
    }
  }
}

std::unique_ptr<RedisStore::Connection> RedisStore::connect() {
  {
    std::lock_guard<std::mutex> lock(backoff_mu_);
    const auto now = SteadyClock::now();
    if (now < next_connect_) {
      auto wait = std::chrono::duration_cast<std::chrono::milliseconds>(next_connect_ - now).count();
      throw ConnectionError(last_connect_error_ + " (reconnecting with backoff; next attempt in " +
                            std::to_string(wait) + " ms)");
    }
  }
  auto record_failure = [&](const std::string& msg) {
    std::lock_guard<std::mutex> lock(backoff_mu_);
    backoff_ = backoff_.count() == 0 ? options_.reconnect_backoff_min
                                     : std::min(backoff_ * 2, options_.reconnect_backoff_max);
    // Jitter keeps many clients from reconnecting in lock-step after a restart.
    next_connect_ = SteadyClock::now() + jittered(backoff_);
    last_connect_error_ = msg;
  };

  redisContext* raw = nullptr;
  const timeval tv = to_timeval(options_.connect_timeout);
  const bool forever = options_.connect_timeout.count() == 0;
  if (options_.kind == StoreOptions::Kind::Unix) {
    raw = forever ? redisConnectUnix(options_.unix_path.c_str())
                  : redisConnectUnixWithTimeout(options_.unix_path.c_str(), tv);
  } else {
    raw = forever ? redisConnect(options_.host.c_str(), options_.port)
                  : redisConnectWithTimeout(options_.host.c_str(), options_.port, tv);
  }
  if (raw == nullptr) throw ConnectionError("could not allocate a connection to " + where());
  ContextPtr ctx(raw);
  if (ctx->err) {
    const int saved_errno = errno;
    std::string err = ctx->errstr;
    std::string msg;
    bool timeout = false;
    if (err.find("Name or service not known") != std::string::npos ||
        err.find("name resolution") != std::string::npos ||
        err.find("No address associated") != std::string::npos ||
        err.find("nodename nor servname") != std::string::npos) {
      msg = "cannot resolve host '" + options_.host + "' (" + err + "); check the host name in the URL";
    } else if (err.find("refused") != std::string::npos || saved_errno == ECONNREFUSED) {
      msg = "connection refused by " + where() + ": is redis-server running there? (" + err + ")";
    } else if (err.find("timed out") != std::string::npos || saved_errno == ETIMEDOUT ||
               saved_errno == EINPROGRESS) {
      msg = "timed out connecting to " + where() + " after " +
            std::to_string(options_.connect_timeout.count()) + " ms (" + err + ")";
      timeout = true;
    } else if (options_.kind == StoreOptions::Kind::Unix) {
      msg = "cannot connect to " + where() + ": " + err + "; check the socket path and permissions";
    } else {
      msg = "cannot connect to " + where() + ": " + err;
    }
    record_failure(msg);
    if (timeout) throw TimeoutError(msg);
    throw ConnectionError(msg);
  }
  if (options_.command_timeout.count() > 0) redisSetTimeout(ctx.get(), to_timeval(options_.command_timeout));
  if (options_.keepalive && options_.kind == StoreOptions::Kind::Tcp) redisEnableKeepAlive(ctx.get());

  auto conn = std::make_unique<Connection>();
  conn->ctx = std::move(ctx);
  conn->last_used = SteadyClock::now();

  // AUTH, SELECT and PING in one round trip; PING also surfaces NOAUTH early.
  std::vector<std::vector<std::string_view>> hello;
  if (!options_.password.empty()) {
    if (options_.username.empty()) {
      hello.push_back({"AUTH", options_.password});
    } else {
      hello.push_back({"AUTH", options_.username, options_.password});
    }
  }
  const std::string db = std::to_string(options_.db);
  if (options_.db != 0) hello.push_back({"SELECT", db});
  hello.push_back({"PING"});
  std::string hello_buf;
  for (const auto& argv : hello) {
    append_header(hello_buf, argv.size());
    for (auto a : argv) append_bulk(hello_buf, a);
  }
  append_formatted(conn->ctx.get(), hello_buf);

  std::vector<Reply> replies;
  for (std::size_t i = 0; i < hello.size(); ++i) {
    void* raw_reply = nullptr;
    if (redisGetReply(conn->ctx.get(), &raw_reply) != REDIS_OK) {
      std::string msg = "connection to " + where() + " failed during the handshake: " + conn->ctx->errstr;
      record_failure(msg);
      throw ConnectionError(msg);
    }
    std::unique_ptr<void, ReplyDeleter> guard(raw_reply);
    replies.push_back(convert(static_cast<redisReply*>(raw_reply)));
  }
  for (std::size_t i = 0; i < hello.size(); ++i) {
    if (!replies[i].is_error()) continue;
    const std::string& text = replies[i].str;
    const std::string_view cmd = hello[i][0];
    const std::string user = options_.username.empty() ? "default" : options_.username;
    if (cmd == "AUTH") {
      throw AuthenticationError("authentication to " + where() + " as user '" + user + "' failed: " + text +
                                "; check the user name and password in the URL");
    }
    if (text.starts_with("NOAUTH")) {
      throw AuthenticationError(where() + " requires a password (" + text +
                                "); put it in the URL: redis://[user]:password@host:port");
    }
    if (cmd == "SELECT") {
      throw ReplyError("cannot select database " + db + " on " + where() + ": " + text +
                       "; check the /db part of the URL");
    }
    throw_reply_error(text);
  }
  {
    std::lock_guard<std::mutex> lock(backoff_mu_);
    backoff_ = std::chrono::milliseconds(0);
    next_connect_ = {};
  }
  return conn;
}

std::vector<Reply> RedisStore::execute(const std::vector<Request>& batch) {
  if (batch.empty()) return {};
  Lease lease = acquire();
  try {
    return run_pipeline(lease, batch);
  } catch (...) {
    // Whatever went wrong, replies may still be in flight on this connection: it must
    // never serve another caller.
    lease.mark_broken();
    throw;
  }
}

std::vector<Reply> RedisStore::run_pipeline(Lease& lease, const std::vector<Request>& batch) {
  const std::string here = where();
  std::string buf;
  for (const auto& req : batch) {
    format_request(buf, req);
    // Hand big batches to the server as they are formatted, so it executes the first
    // commands while the rest are still being built (client and server overlap).
    if (buf.size() >= kEarlyWriteBytes) {
      append_formatted(lease.ctx(), buf);
      buf.clear();
      lease.flush(here);
    }
  }
  if (!buf.empty()) append_formatted(lease.ctx(), buf);
  std::vector<Reply> replies;
  replies.reserve(batch.size());
  for (std::size_t i = 0; i < batch.size(); ++i) replies.push_back(lease.read(here));

  // NOSCRIPT means the call did not run, so loading the script and calling again is
  // safe. Both go on the same connection in one more round trip.
  std::vector<std::size_t> again;
  std::vector<const Script*> to_load;
  for (std::size_t i = 0; i < batch.size(); ++i) {
    const auto* call = std::get_if<ScriptCall>(&batch[i]);
    // A raw EVALSHA from the caller (a Command) gets its NOSCRIPT reply as it is.
    if (call != nullptr && replies[i].is_error() && replies[i].str.starts_with("NOSCRIPT")) {
      const Script* s = call->script;
      again.push_back(i);
      if (std::find(to_load.begin(), to_load.end(), s) == to_load.end()) to_load.push_back(s);
    }
  }
  if (!again.empty()) {
    std::string again_buf;
    for (const Script* s : to_load) format_request(again_buf, Command{{"SCRIPT", "LOAD", std::string(s->source)}});
    for (std::size_t i : again) format_request(again_buf, batch[i]);
    append_formatted(lease.ctx(), again_buf);
    for (const Script* s : to_load) {
      Reply r = lease.read(here);
      if (r.is_error()) {
        throw ScriptError("could not load script '" + std::string(s->name) + "' on " + here + ": " + r.str);
      }
      if (r.str != s->sha1) {
        throw ScriptError("script '" + std::string(s->name) + "' loaded with SHA1 " + r.str + ", expected " +
                          std::string(s->sha1));
      }
    }
    for (std::size_t i : again) replies[i] = lease.read(here);
  }
  return replies;
}

}  // namespace redcount
