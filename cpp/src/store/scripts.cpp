// The registry of every script redcount sends (see all_scripts() in store.h).
#include "redcount/counters/fixed_window.h"
#include "redcount/limiters/limiter.h"
#include "redcount/crdt/pn_counter.h"
#include "redcount/sharded/quota.h"
#include "redcount/sharded/sharded_counter.h"
#include "redcount/counters/sliding_window.h"
#include "redcount/store/store.h"
#include "redcount/store/time_source.h"

namespace redcount {

const std::vector<const Script*>& all_scripts() {
  static const std::vector<const Script*> scripts{
      &kFixedWindowIncrScript, &kFixedWindowHitScript, &kSlidingLogScript, &kSlidingApproxScript,
      &kTokenBucketScript,     &kGcraScript,           &kConcurrencyScript, &kSlidingCounterScript,
      &kTimeProbeScript,
      &kShardedIncrScript,     &kQuotaScript,
      &kShardedReshardScript,
      &kPnMergeScript,
  };
  return scripts;
}

}  // namespace redcount
