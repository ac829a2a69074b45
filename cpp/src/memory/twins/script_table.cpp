// The one table of redcount's scripts: each Lua file (cpp/lua/<name>.lua, embedded with its
// SHA1 by CMake, which globs the folder) with its native twins. Redis gets the Lua text
// (EVALSHA, SCRIPT LOAD on NOSCRIPT); the memory store runs the twin. A script added to
// cpp/lua needs a row here: test_scripts.cpp checks that every file has one, that every
// row's SHA1 is its file's, and that the memory store answers every row.
#include <algorithm>
#include <cstddef>
#include <string>
#include <vector>

#include "memory/twins/twins.h"
#include "redcount/common/util.h"
#include "redcount/lua_scripts.h"
#include "redcount/store/scripts.h"

namespace redcount {
namespace {

// A limiter script's penalty gate, for every native twin of a script that has one (see the
// head of fixed_window_hit.lua): with "gate:<g>" as the last argument, the last g keys are
// block keys; while any lives the reply is {-1, the longest PTTL} and the twin does not run.
template <Script::Native Twin>
Reply gated(Keyspace& ks, const std::vector<std::string>& keys, const std::vector<std::string>& args) {
  if (args.empty() || !args.back().starts_with("gate:")) [[likely]] return Twin(ks, keys, args);
  const auto g = parse_int64(std::string_view(args.back()).substr(5));
  if (!g || *g < 1 || static_cast<std::size_t>(*g) > keys.size()) return Reply::of_error("ERR gate: malformed");
  const std::size_t n = keys.size() - static_cast<std::size_t>(*g);
  std::int64_t longest = 0;
  for (std::size_t j = n; j < keys.size(); ++j) longest = std::max(longest, ks.pttl(keys[j]));
  if (longest > 0) return Reply::of_array({Reply::of_integer(-1), Reply::of_integer(longest)});
  return Twin(ks, std::vector<std::string>(keys.begin(), keys.begin() + static_cast<std::ptrdiff_t>(n)),
              std::vector<std::string>(args.begin(), args.end() - 1));
}

}  // namespace

// name, Lua text and SHA1 (generated from cpp/lua/<name>.lua), native twin, typed twin
const Script kFixedWindowIncrScript{"fixed_window_incr", lua::fixed_window_incr_source, lua::fixed_window_incr_sha1,
                                    &twins::native_fixed_window_incr, &twins::typed_fixed_window_incr};
const Script kFixedWindowHitScript{"fixed_window_hit", lua::fixed_window_hit_source, lua::fixed_window_hit_sha1,
                                   &gated<&twins::native_fixed_window_hit>, &twins::typed_fixed_window_hit};
const Script kSlidingLogScript{"sliding_log", lua::sliding_log_source, lua::sliding_log_sha1,
                               &gated<&twins::native_sliding_log>, &twins::typed_sliding_log};
const Script kSlidingApproxScript{"sliding_approx", lua::sliding_approx_source, lua::sliding_approx_sha1,
                                  &gated<&twins::native_sliding_approx>, &twins::typed_sliding_approx};
const Script kSlidingCounterScript{"sliding_counter", lua::sliding_counter_source, lua::sliding_counter_sha1,
                                   &twins::native_sliding_counter};
const Script kTokenBucketScript{"token_bucket", lua::token_bucket_source, lua::token_bucket_sha1,
                                &gated<&twins::native_token_bucket>};
const Script kGcraScript{"gcra", lua::gcra_source, lua::gcra_sha1,
                         &gated<&twins::native_gcra>};
const Script kConcurrencyScript{"concurrency", lua::concurrency_source, lua::concurrency_sha1,
                                &twins::native_concurrency};
const Script kShardedIncrScript{"sharded_incr", lua::sharded_incr_source, lua::sharded_incr_sha1,
                                &twins::native_sharded_incr};
const Script kShardedClaimScript{"sharded_claim", lua::sharded_claim_source, lua::sharded_claim_sha1,
                                 &twins::native_sharded_claim};
const Script kShardedReshardScript{"sharded_reshard", lua::sharded_reshard_source, lua::sharded_reshard_sha1,
                                   &twins::native_sharded_reshard};
const Script kQuotaScript{"quota", lua::quota_source, lua::quota_sha1,
                          &twins::native_quota};
const Script kPnMergeScript{"pn_merge", lua::pn_merge_source, lua::pn_merge_sha1,
                            &twins::native_pn_merge};
const Script kPenaltyScript{"penalty", lua::penalty_source, lua::penalty_sha1, &twins::native_penalty};
const Script kLeaseTakeScript{"lease_take", lua::lease_take_source, lua::lease_take_sha1, &twins::native_lease_take};
const Script kLeaseGiveBackScript{"lease_give_back", lua::lease_give_back_source, lua::lease_give_back_sha1,
                                  &twins::native_lease_give_back};
const Script kTimeProbeScript{"time_probe", lua::time_probe_source, lua::time_probe_sha1,
                              &twins::native_time_probe};

const Script kLimiterAdjustScript{"limiter_adjust", lua::limiter_adjust_source, lua::limiter_adjust_sha1,
                                  &twins::native_limiter_adjust};

const std::vector<const Script*>& all_scripts() {
  static const std::vector<const Script*> scripts{
      &kFixedWindowIncrScript,
      &kFixedWindowHitScript,
      &kSlidingLogScript,
      &kSlidingApproxScript,
      &kSlidingCounterScript,
      &kTokenBucketScript,
      &kGcraScript,
      &kConcurrencyScript,
      &kShardedIncrScript,
      &kShardedClaimScript,
      &kShardedReshardScript,
      &kQuotaScript,
      &kPnMergeScript,
      &kTimeProbeScript,
      &kLimiterAdjustScript,
      &kPenaltyScript,
      &kLeaseTakeScript,
      &kLeaseGiveBackScript,
  };
  return scripts;
}

}  // namespace redcount
