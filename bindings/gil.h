// The bindings' one GIL policy for a call that blocks: on the network, or on one of the
// core's own threads (a retry thread, a flusher, a store's I/O thread).
//
// Convert every Python argument to C++ values first (convert.h), with the GIL held; then
// hold a NetworkWait in an inner scope around the blocking call only, and build the Python
// result after that scope. Inside it no py::object may be touched.
//
//   std::vector<Reply> replies;
//   {
//     NetworkWait wait;
//     replies = store.execute(batch);
//   }
//   return replies_to_python(replies);
//
// The GIL is released so that other Python threads run while this one waits, and so that
// the core's threads, which may need the GIL to complete an asyncio future, are never
// blocked behind it.
#pragma once

#include <pybind11/pybind11.h>

#include <optional>

namespace redcount::bind {

class NetworkWait {
 public:
  // Releases the GIL until the end of the scope.
  NetworkWait() { release_.emplace(); }
  // The same, except for a call on the memory store (`memory_store`): it never waits on I/O
  // and its lock is held only briefly, by threads that never need the GIL, so there a
  // release and retake would cost more than the call itself. For the per-request hot paths
  // (limiter checks, counter increments, asyncio submission).
  explicit NetworkWait(bool memory_store) {
    if (!memory_store) release_.emplace();
  }
  NetworkWait(const NetworkWait&) = delete;
  NetworkWait& operator=(const NetworkWait&) = delete;

 private:
  std::optional<pybind11::gil_scoped_release> release_;
};

}  // namespace redcount::bind
