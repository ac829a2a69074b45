// Multi-region PN-counters: a counter that several regions (each with its own store) update
// independently and reconcile by merging, so that every region converges to the same exact
// total without a coordinator.
//
//   PNCounterOptions o;
//   o.name = "stock:sku:42";
//   o.region = "eu-west";
//   PNCounter eu(eu_store, o);
//   eu.incr(5);
//   eu.decr(2);
//   eu.merge(*us_store);              // takes the maximum of every (region, component)
//   std::int64_t total = eu.value();  // sum(P) - sum(N) over all regions known here
//
// State: two hashes, P (increments) and N (decrements), each with one field per region
// holding that region's running total. A region only ever adds to its own fields, so every
// field only grows; merging takes the per-field maximum (pn_merge.lua, with a native twin
// on the memory store), which is idempotent, commutative and associative. After every
// region has (transitively) merged every other's latest state, all regions hold the same
// fields and so the same value. Memory is O(regions), not O(updates).
//
// What it does not give: no causal order, no read-your-writes across regions (an update is
// visible in another region only after a merge), and no bound below the value.
//
// Keys (keys.h): "<prefix>:pn:{<name>}:p" and "<prefix>:pn:{<name>}:n", one hash tag, so one
// script call may touch both on Redis Cluster.
//
// Thread-safe (the object is immutable after construction; the store serialises the rest).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "redcount/store/operation.h"
#include "redcount/store/store.h"
#include "redcount/store/scripts.h"

namespace redcount {


// The largest amount of one incr/decr (exact as a Lua number, as for the other counters).
inline constexpr std::int64_t kMaxPnAmount = (std::int64_t{1} << 53) - 1;
// The most components one merge call carries; beyond that a merge is split into calls
// (each call is atomic; the merge as a whole stays correct because max is monotone).
inline constexpr std::size_t kMaxPnMergeBatch = 512;

struct PNCounterOptions {
  std::string prefix = "redcount";
  std::string name;
  std::string region;  // this store's region: non-empty, no '{' or '}'
};

// One region's running totals: everything it added (p) and everything it took away (n).
struct PNComponent {
  std::string region;
  std::int64_t p = 0;
  std::int64_t n = 0;
  bool operator==(const PNComponent&) const = default;
};

class PNCounter {
 public:
  PNCounter(std::shared_ptr<Store> store, PNCounterOptions options);

  // Adds `amount` (1..kMaxPnAmount) to this region's P (incr) or N (decr); returns this
  // region's new component total.
  std::int64_t incr(std::int64_t amount = 1);
  std::int64_t decr(std::int64_t amount = 1);
  // sum(P) - sum(N), both hashes read in one round trip (two reads, not one snapshot: a
  // concurrent write may be seen in one hash only). Throws ProtocolError when the sum
  // does not fit in 64 bits.
  std::int64_t value();
  // Every region known on this store, sorted by region.
  std::vector<PNComponent> components();
  // Folds `components` (another store's) in: for each (region, P or N), the maximum of the
  // two. Returns how many fields it raised. Atomic per kMaxPnMergeBatch components.
  std::int64_t merge_components(const std::vector<PNComponent>& components);
  // Reads this counter's components on `other` and merges them here: two round trips, one
  // to each store. Counters on both stores must use the same prefix and name.
  std::int64_t merge(Store& other);

  std::shared_ptr<Op<std::int64_t>> make_incr(std::int64_t amount = 1);
  std::shared_ptr<Op<std::int64_t>> make_decr(std::int64_t amount = 1);
  std::shared_ptr<Op<std::int64_t>> make_value();
  std::shared_ptr<Op<std::vector<PNComponent>>> make_components();
  std::shared_ptr<Op<std::int64_t>> make_merge_components(const std::vector<PNComponent>& components);

  // The P or N hash's key.
  const std::string& p_key() const noexcept { return p_key_; }
  const std::string& n_key() const noexcept { return n_key_; }
  const PNCounterOptions& options() const noexcept { return options_; }
  const std::shared_ptr<Store>& store() const noexcept { return store_; }

 private:
  std::shared_ptr<Op<std::int64_t>> make_add(const std::string& key, std::int64_t amount);

  std::shared_ptr<Store> store_;
  PNCounterOptions options_;
  std::string p_key_, n_key_;
};

}  // namespace redcount
