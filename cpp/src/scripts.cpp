// The registry of every script redcount sends (see all_scripts() in store.h).
#include "redcount/fixed_window.h"
#include "redcount/limiter.h"
#include "redcount/pn_counter.h"
#include "redcount/quota.h"
#include "redcount/sharded.h"
#include "redcount/sliding_window.h"
#include "redcount/store.h"
#include "redcount/time_source.h"

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
