#include "redcount/common/fork_hooks.h"

#include <pthread.h>

#include <array>
#include <map>
#include <mutex>

namespace redcount {
namespace {

struct Registry {
  std::mutex mu;
  std::uint64_t next_id = 1;
  // By id, which grows with time: iteration order is registration order.
  std::map<std::uint64_t, std::array<std::function<void()>, 3>> hooks;  // prepare, parent, child
};

Registry& registry() {
  static auto* r = new Registry;  // never destroyed: a fork may come during static destruction
  return *r;
}

void prepare() {
  Registry& r = registry();
  r.mu.lock();
  for (auto it = r.hooks.rbegin(); it != r.hooks.rend(); ++it) it->second[0]();
}

void parent() {
  Registry& r = registry();
  for (auto& [id, h] : r.hooks) h[1]();
  r.mu.unlock();
}

void child() {
  Registry& r = registry();
  for (auto& [id, h] : r.hooks) h[2]();
  r.mu.unlock();
}

}  // namespace

ForkHooks::ForkHooks(Hook prepare_hook, Hook parent_hook, Hook child_hook) {
  static std::once_flag once;
  std::call_once(once, [] { pthread_atfork(&prepare, &parent, &child); });
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  id_ = r.next_id++;
  auto& h = r.hooks[id_];
  h[0] = std::move(prepare_hook);
  h[1] = std::move(parent_hook);
  h[2] = std::move(child_hook);
}

ForkHooks& ForkHooks::operator=(ForkHooks&& other) noexcept {
  if (this != &other) {
    ForkHooks gone(std::move(*this));
    id_ = other.id_;
    other.id_ = 0;
  }
  return *this;
}

ForkHooks::~ForkHooks() {
  if (id_ == 0) return;
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  r.hooks.erase(id_);
}

}  // namespace redcount
