// The native twins of redcount's Lua scripts: what the memory store runs in place of each
// script (Script::native with text arguments, Script::typed with typed ones). One file per
// script family beside this header; script_table.cpp pairs each twin with its Lua file.
#pragma once

#include <string>
#include <vector>

#include "redcount/store/store.h"

namespace redcount::twins {

Reply native_concurrency(Keyspace& ks, const std::vector<std::string>& keys, const std::vector<std::string>& args);
Reply native_fixed_window_hit(Keyspace& ks, const std::vector<std::string>& keys, const std::vector<std::string>& args);
Reply typed_fixed_window_hit(Keyspace& ks, const std::vector<std::string>& keys, const ScriptArgs& args);
Reply native_fixed_window_incr(Keyspace& ks, const std::vector<std::string>& keys, const std::vector<std::string>& args);
Reply typed_fixed_window_incr(Keyspace& ks, const std::vector<std::string>& keys, const ScriptArgs& args);
Reply native_gcra(Keyspace& ks, const std::vector<std::string>& keys, const std::vector<std::string>& args);
Reply native_penalty(Keyspace& ks, const std::vector<std::string>& keys, const std::vector<std::string>& args);
Reply native_lease_give_back(Keyspace& ks, const std::vector<std::string>& keys, const std::vector<std::string>& args);
Reply native_lease_take(Keyspace& ks, const std::vector<std::string>& keys, const std::vector<std::string>& args);
Reply native_pn_merge(Keyspace& ks, const std::vector<std::string>& keys, const std::vector<std::string>& args);
Reply native_quota(Keyspace& ks, const std::vector<std::string>& keys, const std::vector<std::string>& args);
Reply native_sharded_claim(Keyspace& ks, const std::vector<std::string>& keys, const std::vector<std::string>& args);
Reply native_sharded_incr(Keyspace& ks, const std::vector<std::string>& keys, const std::vector<std::string>& args);
Reply native_sharded_reshard(Keyspace& ks, const std::vector<std::string>& keys, const std::vector<std::string>& args);
Reply native_sliding_approx(Keyspace& ks, const std::vector<std::string>& keys, const std::vector<std::string>& args);
Reply typed_sliding_approx(Keyspace& ks, const std::vector<std::string>& keys, const ScriptArgs& args);
Reply native_sliding_counter(Keyspace& ks, const std::vector<std::string>& keys, const std::vector<std::string>& args);
Reply native_sliding_log(Keyspace& ks, const std::vector<std::string>& keys, const std::vector<std::string>& args);
Reply typed_sliding_log(Keyspace& ks, const std::vector<std::string>& keys, const ScriptArgs& args);
Reply native_limiter_adjust(Keyspace& ks, const std::vector<std::string>& keys, const std::vector<std::string>& args);
Reply native_time_probe(Keyspace& ks, const std::vector<std::string>& keys, const std::vector<std::string>& args);
Reply native_token_bucket(Keyspace& ks, const std::vector<std::string>& keys, const std::vector<std::string>& args);

}  // namespace redcount::twins
