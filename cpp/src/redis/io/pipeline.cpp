#include "redcount/redis/io/pipeline.h"

#include <algorithm>

#include "redcount/common/errors.h"
#include "redcount/redis/io/resp.h"
#include "redcount/common/util.h"

namespace redcount::redis {
namespace {

bool word_is(std::string_view text, std::string_view word) {
  return text.starts_with(word) && (text.size() == word.size() || text[word.size()] == ' ');
}

bool is_noscript(const Reply& reply, const Request& request) {
  return reply.is_error() && word_is(reply.str, "NOSCRIPT") && std::holds_alternative<ScriptCall>(request);
}

bool is_command(const Request& request, std::string_view name) {
  const auto* cmd = std::get_if<Command>(&request);
  return cmd != nullptr && !cmd->args.empty() && cmd->args[0].size() == name.size() && ascii_lower(cmd->args[0]) == name;
}

bool is_multi(const Request& request) { return is_command(request, "multi"); }

bool is_blocking(const Request& request) {
  const auto* cmd = std::get_if<Command>(&request);
  return cmd != nullptr && cmd->blocks_for.count() > 0;
}

// A store on one server (or a Sentinel master) sends every key to that server. A Redis
// Cluster node answers MOVED or ASK for keys in other nodes' slots, which only the cluster
// router follows (its jobs are routed and keep the reply as it is: it parses the address).
// Said here, in the reply that becomes the caller's ReplyError, so that a cluster node opened
// with redis:// does not fail with a bare "MOVED 1234 10.0.0.7:6379".
void explain_redirect(Reply& reply, std::string_view where) {
  const std::string_view t = reply.str;
  if (!((word_is(t, "MOVED") && t.size() > 6) || (word_is(t, "ASK") && t.size() > 4))) return;
  const bool socket = where.starts_with("unix socket ");
  reply.str += " (" + std::string(where) +
               " is a Redis Cluster node, which refers keys of other nodes' slots to them; a store on one server "
               "cannot follow it: open the cluster with " +
               (socket ? std::string("redis+cluster://host:port") : "redis+cluster://" + std::string(where)) +
               " (rediss+cluster:// for TLS))";
}

}  // namespace

void Job::deliver() noexcept {
  BatchDone d = std::move(done);
  done = nullptr;
  if (!d) return;
  try {
    if (error) {
      if (routed) {
        d(std::move(replies), error);  // the router keeps what was answered
      } else {
        d({}, error);
      }
    } else {
      d(std::move(replies), nullptr);
    }
  } catch (...) {
    // A completion callback must not throw (it runs on the engine's thread); there is
    // nobody to report it to, and the engine must keep serving the other callers.
  }
}

bool did_not_run(const Reply& reply, const Request& request, bool routed) noexcept {
  if (!reply.is_error()) return false;
  const std::string_view text = reply.str;
  // Each of these is answered before the command (or the script's first write) executes.
  if (word_is(text, "TRYAGAIN") || word_is(text, "CLUSTERDOWN")) return !routed;
  return word_is(text, "LOADING") || word_is(text, "READONLY") || word_is(text, "MASTERDOWN") ||
         word_is(text, "NOREPLICAS") || is_noscript(reply, request);
}

namespace {
// Bytes a batch takes on the wire, about: a large batch is formatted into one buffer
// grown once instead of doubling (and copying) a dozen times.
std::size_t wire_estimate(const std::vector<Request>& batch) {
  std::size_t n = 0;
  for (const auto& r : batch) {
    if (const auto* cmd = std::get_if<Command>(&r)) {
      n += 16;
      for (const auto& a : cmd->args) n += a.size() + 8;
    } else {
      const auto& call = std::get<ScriptCall>(r);
      n += 64;
      for (const auto& k : call.keys) n += k.size() + 8;
      n += call.args.size() * 16;
    }
  }
  return n;
}
}  // namespace

void format_wire(Job& job) {
  if (!job.wire.empty()) return;
  job.wire.reserve(wire_estimate(job.requests));
  std::vector<std::string> scratch;
  for (const auto& r : job.requests) resp::format(job.wire, r, scratch);
}

std::shared_ptr<Job> make_job(std::vector<Request> batch, BatchDone done, CancelFlag cancelled, TimePoint deadline,
                              bool format) {
  auto job = std::make_shared<Job>();
  std::vector<std::string> scratch;
  if (format) job->wire.reserve(wire_estimate(batch));
  for (const auto& r : batch) {
    if (format) {
      resp::format(job->wire, r, scratch);
    } else if (const auto* cmd = std::get_if<Command>(&r); cmd != nullptr && cmd->args.empty()) {
      throw InvalidArgument("empty command");
    }
    if (!job->multi && is_multi(r)) job->multi = true;
  }
  job->replies.resize(batch.size());
  job->requests = std::move(batch);
  job->done = std::move(done);
  job->cancelled = std::move(cancelled);
  job->deadline = deadline;
  return job;
}

void start_round(const std::shared_ptr<Job>& job, std::string& out, std::deque<Expect>& inflight,
                 std::uint64_t stream_offset) {
  Job& j = *job;
  j.round_begin = stream_offset;
  j.load_error.clear();
  j.outstanding = 0;
  for (std::size_t i = 0; i < j.loads.size(); ++i) {
    resp::format_script_load(out, *j.loads[i]);
    inflight.push_back(Expect{job, -static_cast<std::int32_t>(i) - 1});
    ++j.outstanding;
  }
  if (j.todo.empty()) {  // the first round: every request, formatted by the submitter or now
    if (!j.wire.empty()) {
      // Written once: a later round formats only what it resends, from the requests.
      if (out.empty()) {
        out.swap(j.wire);
      } else {
        out += j.wire;
      }
      j.wire.clear();
    } else {
      std::vector<std::string> scratch;
      for (const auto& r : j.requests) resp::format(out, r, scratch);
    }
    for (std::size_t i = 0; i < j.requests.size(); ++i) inflight.push_back(Expect{job, static_cast<std::int32_t>(i)});
    j.outstanding += j.requests.size();
    return;
  }
  std::vector<std::string> scratch;
  for (std::uint32_t i : j.todo) {
    resp::format(out, j.requests[i], scratch);
    inflight.push_back(Expect{job, static_cast<std::int32_t>(i)});
    ++j.outstanding;
  }
}

std::shared_ptr<Job> take_reply(std::deque<Expect>& inflight, Reply&& reply, std::string_view where) {
  Expect e = std::move(inflight.front());
  inflight.pop_front();
  if (!e.job) return nullptr;
  Job& j = *e.job;
  // A job completed early (its deadline passed with replies due) belongs to its caller from
  // then on: its replies went out with the error. A routed job hands the router the vector
  // itself, which the synchronous caller's wait moves away (on that caller's thread, maybe
  // at this very moment), so writing a late reply at its index would write past the end of
  // an empty vector. The reply is dropped without touching the job; taking it off the
  // connection keeps the connection in step.
  if (j.abandoned) return nullptr;
  if (e.slot < 0) {
    const Script& s = *j.loads[static_cast<std::size_t>(-(e.slot + 1))];
    if (reply.is_error()) {
      j.load_error = "could not load script '" + std::string(s.name) + "' on " + std::string(where) + ": " + reply.str;
    } else if (reply.str != s.sha1) {
      j.load_error = "script '" + std::string(s.name) + "' loaded with SHA1 " + reply.str + ", expected " +
                     std::string(s.sha1);
    }
  } else {
    if (!j.routed && reply.is_error()) explain_redirect(reply, where);
    j.replies[static_cast<std::size_t>(e.slot)] = std::move(reply);
    if (j.answered) (*j.answered)[static_cast<std::size_t>(e.slot)] = 1;
  }
  if (--j.outstanding > 0) return nullptr;
  return std::move(e.job);
}

Next after_round(Job& job, TimePoint now, std::chrono::milliseconds backoff_min, std::chrono::milliseconds backoff_max) {
  if (!job.load_error.empty()) {
    job.fail(std::make_exception_ptr(ScriptError(job.load_error)));
    return Next::Complete;
  }
  std::vector<std::uint32_t> retry;
  bool all_noscript = true;
  auto check = [&](std::uint32_t i) {
    if (did_not_run(job.replies[i], job.requests[i], job.routed)) {
      retry.push_back(i);
      if (!is_noscript(job.replies[i], job.requests[i])) all_noscript = false;
    }
  };
  std::vector<std::uint32_t> all;
  if (job.todo.empty()) {
    all.resize(job.requests.size());
    for (std::uint32_t i = 0; i < all.size(); ++i) all[i] = i;
  }
  const std::vector<std::uint32_t>& round = job.todo.empty() ? all : job.todo;
  for (std::size_t k = 0; k < round.size();) {
    if (!job.multi || !is_multi(job.requests[round[k]])) {
      check(round[k++]);
      continue;
    }
    // A transaction, MULTI to EXEC, is resent whole, and only when none of it ran: EXEC
    // was refused (EXECABORT) because commands were refused while queueing, each for a
    // reason that means "not run" (LOADING, READONLY...), or every reply says "not run".
    std::size_t end = k;
    while (end < round.size() && !is_command(job.requests[round[end]], "exec")) ++end;
    if (end == round.size()) break;  // no EXEC: whatever ran of it stays as it is
    const Reply& exec = job.replies[round[end]];
    bool aborted = exec.is_error() && word_is(exec.str, "EXECABORT");
    bool refused = false, every = did_not_run(exec, job.requests[round[end]], job.routed);
    for (std::size_t m = k; m < end; ++m) {
      const Reply& r = job.replies[round[m]];
      const bool not_run = did_not_run(r, job.requests[round[m]], job.routed);
      every = every && not_run;
      if (!r.is_error()) continue;
      if (!not_run) aborted = false;  // a real error (a syntax error...): never resent
      refused = true;
    }
    if ((aborted && refused) || every) {
      for (std::size_t m = k; m <= end; ++m) retry.push_back(round[m]);
      all_noscript = false;
    }
    k = end + 1;
  }
  if (retry.empty()) {
    job.succeed();
    return Next::Complete;
  }
  // A blocking command after a request sent again goes again too, after it: a WAIT counts
  // the replicas that have its connection's last write, and its first answer came before
  // that write.
  const std::uint32_t first_retry = *std::min_element(retry.begin(), retry.end());
  for (std::uint32_t i : round) {
    if (i > first_retry && is_blocking(job.requests[i]) && std::find(retry.begin(), retry.end(), i) == retry.end()) {
      retry.push_back(i);
    }
  }
  std::sort(retry.begin(), retry.end());
  std::vector<const Script*> loads;
  for (std::uint32_t i : retry) {
    if (!is_noscript(job.replies[i], job.requests[i])) continue;
    const Script* s = std::get<ScriptCall>(job.requests[i]).script;
    if (std::find(loads.begin(), loads.end(), s) == loads.end()) loads.push_back(s);
  }
  if (job.routed) {
    // A request redirected by ASK went out right after an ASKING, which lets only the next
    // command into the importing node. Its rerun (after NOSCRIPT, LOADING...) takes the
    // ASKING along, or that node answers MOVED back to the slot's old owner. The SCRIPT
    // LOADs of the round are written before both, so they do not consume it.
    std::vector<std::uint32_t> with;
    with.reserve(retry.size() + 1);
    for (std::uint32_t i : retry) {
      if (i > 0 && is_command(job.requests[i - 1], "asking") && (with.empty() || with.back() != i - 1)) {
        with.push_back(i - 1);
      }
      with.push_back(i);
    }
    retry = std::move(with);
  }
  if (all_noscript) {
    // The script cache was flushed (SCRIPT FLUSH, a restart, a promoted replica): load and
    // rerun at once, contiguously. Twice in a row means something keeps flushing it.
    if (++job.noscript_rounds > 2) {
      job.succeed();
      return Next::Complete;
    }
    job.loads = std::move(loads);
    job.todo = std::move(retry);
    return Next::Again;
  }
  job.backoff = job.backoff.count() == 0 ? backoff_min : std::min(job.backoff * 2, backoff_max);
  job.not_before = now + jittered(job.backoff);
  if (job.not_before >= job.deadline) {  // no time left: the caller gets the rejection itself
    job.succeed();
    return Next::Complete;
  }
  job.loads = std::move(loads);
  job.todo = std::move(retry);
  return Next::Later;
}

}  // namespace redcount::redis
