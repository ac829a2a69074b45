// fork() made safe for the objects that own locks and threads: one pthread_atfork for the
// process, and one registry of every live object's hooks.
//
//   class Table {
//    public:
//     void fork_prepare();  // before fork(): take the locks, so no other thread holds them
//     void fork_parent();   // after, in the parent: release them
//     void fork_child();    // after, in the child (one thread): release or reset them
//    private:
//     ForkHooks fork_hooks_ = ForkHooks::of(this);  // last member: unregistered first
//   };
//
// Before a fork the registry's mutex is taken and every prepare hook runs, the newest
// first; after it, every parent or child hook runs, the oldest first, and the mutex is
// released (pthread_atfork's order, per object). A hook must never register or unregister
// hooks, and no thread may create or destroy a ForkHooks while holding a lock that a
// prepare hook takes. Thread-safe: objects register and unregister from any thread.
#pragma once

#include <cstdint>
#include <functional>

namespace redcount {

class ForkHooks {
 public:
  using Hook = std::function<void()>;

  ForkHooks() = default;  // registers nothing
  ForkHooks(Hook prepare, Hook parent, Hook child);
  // The hooks of an object with fork_prepare(), fork_parent() and fork_child() members.
  template <class T>
  static ForkHooks of(T* object) {
    return ForkHooks([object] { object->fork_prepare(); }, [object] { object->fork_parent(); },
                     [object] { object->fork_child(); });
  }

  ForkHooks(ForkHooks&& other) noexcept : id_(other.id_) { other.id_ = 0; }
  ForkHooks& operator=(ForkHooks&& other) noexcept;
  ForkHooks(const ForkHooks&) = delete;
  ForkHooks& operator=(const ForkHooks&) = delete;
  // Unregisters; waits for the hooks of a fork under way to finish.
  ~ForkHooks();

 private:
  std::uint64_t id_ = 0;  // 0: nothing registered
};

}  // namespace redcount
