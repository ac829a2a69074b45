// redcount._core: the pybind11 module over the C++ core. Each area registers itself.
#include "common.h"

PYBIND11_MODULE(_core, m) {
  m.doc() = "redcount's C++ core: stores, counters and limiters. Use the public API in `redcount`.";
  redcount::bind::register_errors(m);
  redcount::bind::register_store(m);
  redcount::bind::register_counters(m);
  redcount::bind::register_limiter(m);
  redcount::bind::register_aio(m);
  redcount::bind::register_sharded(m);
  redcount::bind::register_pn(m);
  redcount::bind::register_hot_keys(m);
#ifdef REDCOUNT_TEST_HOOKS
  redcount::bind::register_testing(m);  // built with -DREDCOUNT_TEST_HOOKS=ON only
#endif
}
