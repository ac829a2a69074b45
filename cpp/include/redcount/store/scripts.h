// Every script redcount sends, by name: the rows of the script table
// (cpp/src/memory/twins/script_table.cpp), which pairs each Lua file with its native twin.
//
//   ScriptCall call{&kFixedWindowIncrScript, keys, args};   // an operation's request
#pragma once

#include "redcount/store/store.h"

namespace redcount {

extern const Script kFixedWindowIncrScript;
extern const Script kFixedWindowHitScript;
extern const Script kSlidingLogScript;
extern const Script kSlidingApproxScript;
extern const Script kSlidingCounterScript;
extern const Script kTokenBucketScript;
extern const Script kGcraScript;
extern const Script kConcurrencyScript;
extern const Script kShardedIncrScript;
extern const Script kShardedClaimScript;
extern const Script kShardedReshardScript;
extern const Script kQuotaScript;
extern const Script kPnMergeScript;
extern const Script kTimeProbeScript;
extern const Script kLimiterAdjustScript;
extern const Script kPenaltyScript;
extern const Script kLeaseTakeScript;
extern const Script kLeaseGiveBackScript;

}  // namespace redcount
