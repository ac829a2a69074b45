// The one error tree of the redcount core.
//
// Every failure the core reports is an `Error` subclass, so the bindings can map
// the whole tree onto `redcount.RedcountError` and its children in one place:
//
//   try { store.execute(batch); }
//   catch (const redcount::ConnectionError& e) { /* transient: retry later */ }
//
// Bad input from the caller is `InvalidArgument`; it is raised before anything is
// sent or stored, so it never leaves partial state behind.
#pragma once

#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace redcount {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The caller passed something the core refuses (empty key, window <= 0...).
class InvalidArgument : public Error {
 public:
  using Error::Error;
};

// What became of one request of a batch that failed part-way: store/reply.h (it holds a
// Reply, a store-layer type; this layer only carries them).
struct RequestOutcome;

// The network path to the server failed: refused, reset, unresolvable host, EOF.
// `maybe_applied()` is true when the request had been sent before the failure, so it may
// or may not have run; false when nothing of it can have run (never sent, store closed).
// `outcomes()`, when not null, holds one entry per request of the batch: set when some of
// its requests completed and others did not, so a caller retries only what did not run.
class ConnectionError : public Error {
 public:
  explicit ConnectionError(const std::string& message, bool maybe_applied = false)
      : Error(message), maybe_applied_(maybe_applied) {}
  explicit ConnectionError(const char* message, bool maybe_applied = false)
      : Error(message), maybe_applied_(maybe_applied) {}
  bool maybe_applied() const noexcept { return maybe_applied_; }
  const std::shared_ptr<const std::vector<RequestOutcome>>& outcomes() const noexcept { return outcomes_; }
  void set_outcomes(std::shared_ptr<const std::vector<RequestOutcome>> o) { outcomes_ = std::move(o); }

 private:
  bool maybe_applied_;
  std::shared_ptr<const std::vector<RequestOutcome>> outcomes_;
};

// A connect or command timeout expired. Whether a sent command ran is unknown.
class TimeoutError : public ConnectionError {
 public:
  using ConnectionError::ConnectionError;
};

// The store was closed: nothing was sent. Not transient (a retry cannot help), so a
// queueing counter raises it instead of queueing.
class StoreClosed : public ConnectionError {
 public:
  using ConnectionError::ConnectionError;
};

// The store could not decide within the caller's budget, or its circuit breaker is open:
// raised by a ResilientStore instead of waiting on a dead server. A ConnectionError, so a
// handler written for those catches it; `maybe_applied()` as for ConnectionError.
class Unavailable : public ConnectionError {
 public:
  using ConnectionError::ConnectionError;
};

// The server sent bytes that are not valid RESP, or a reply of an unexpected type.
class ProtocolError : public Error {
 public:
  using Error::Error;
};

// The server answered with an error reply ("ERR ...", "WRONGTYPE ...").
class ReplyError : public Error {
 public:
  explicit ReplyError(std::string message) : Error(message), code_(first_word(message)) {}
  // The leading upper-case word of the reply ("ERR", "WRONGPASS", "READONLY").
  const std::string& code() const noexcept { return code_; }
  // True for replies that a retry may cure: the server is loading, failing over
  // or is a read-only replica right now.
  bool transient() const noexcept;

 private:
  static std::string first_word(std::string_view s) {
    auto end = s.find(' ');
    return std::string(s.substr(0, end));
  }
  std::string code_;
};

// AUTH was refused: wrong user name or password, or the ACL user is disabled.
class AuthenticationError : public ReplyError {
 public:
  using ReplyError::ReplyError;
};

// A Lua script failed on the server for a reason other than NOSCRIPT.
class ScriptError : public ReplyError {
 public:
  using ReplyError::ReplyError;
};

// The bounded retry queue is full; the increment was neither applied nor queued.
class RetryQueueFull : public Error {
 public:
  using Error::Error;
};

// The caller cancelled the operation (an asyncio task was cancelled) before it completed.
class Cancelled : public Error {
 public:
  using Error::Error;
};

// True when `e` is worth retrying later (connection trouble, timeouts, LOADING,
// READONLY, MASTERDOWN, TRYAGAIN, CLUSTERDOWN, BUSY).
bool is_transient(const std::exception& e) noexcept;

// Builds the specific ReplyError subclass for an error reply's text and throws it.
[[noreturn]] void throw_reply_error(std::string message);

}  // namespace redcount
