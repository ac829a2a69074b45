"""Concurrent increments are exact: no lost update, no double count.

Processes (spawned, each with its own connection pool) x threads against one
redis-server, and threads against the embedded store. Totals are summed over every
window key of the counter, so they are exact even if a run straddled a window boundary.
"""

from __future__ import annotations

import multiprocessing
import threading
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor

import pytest
import redcount
from helpers import process_worker, sum_keys

KEYS = ["hot:a", "hot:b", "hot:c"]

pytestmark = pytest.mark.usefixtures("away_from_hour_boundary")


def run_threads(n: int, target: Callable[[int], None]) -> None:
    """Start n threads together (barrier) and re-raise the first error any of them hit."""
    barrier = threading.Barrier(n)
    errors: list[BaseException] = []

    def wrap(i: int) -> None:
        try:
            barrier.wait()
            target(i)
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=wrap, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


def expected_per_key(n: int, threads: int, processes: int) -> dict[str, int]:
    """What process_worker adds, computed independently of it."""
    total = dict.fromkeys(KEYS, 0)
    for _ in range(processes):
        for t in range(threads):
            for i in range(n):
                total[KEYS[(i + t) % len(KEYS)]] += 1 + (i % 3)
    return total


@pytest.mark.redis_only
@pytest.mark.parametrize("mode", ["script", "commands"])
def test_processes_times_threads_exact_totals(redis_server, redis_store: redcount.Store,  # type: ignore[no-untyped-def]
                                              mode: str) -> None:
    processes, threads, n = 4, 4, 250
    prefix = f"mp{mode}"
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=processes, mp_context=ctx) as pool:
        futures = [pool.submit(process_worker, redis_server.url, "hits", prefix, mode, KEYS, n, threads)
                   for _ in range(processes)]
        results = [f.result(timeout=120) for f in futures]
    reported: Counter[str] = Counter()
    for r in results:
        reported.update(r)
    expected = expected_per_key(n, threads, processes)
    assert dict(reported) == expected  # every worker did all its increments
    for key in KEYS:
        assert sum_keys(redis_store, f"{prefix}:hits:{{{key}}}:*") == expected[key], key
    assert sum(expected.values()) == processes * threads * sum(1 + (i % 3) for i in range(n))


@pytest.mark.parametrize("mode", ["script", "commands"])
def test_threads_exact_totals_and_unique_counts(store: redcount.Store, mode: str) -> None:
    threads, n = 8, 400
    c = redcount.FixedWindowCounter(store, "t", 3600, mode=mode)  # type: ignore[arg-type]
    seen: dict[str, list[int]] = {k: [] for k in KEYS}
    lock = threading.Lock()

    def work(t: int) -> None:
        mine: dict[str, list[int]] = {k: [] for k in KEYS}
        for i in range(n):
            key = KEYS[(i + t) % len(KEYS)]
            mine[key].append(c.incr(key, 1))
        with lock:
            for k, v in mine.items():
                seen[k].extend(v)

    run_threads(threads, work)
    total = threads * n
    assert sum(c.get(k) for k in KEYS) == total
    for k in KEYS:
        # Every increment of 1 saw its own count: together exactly 1..N, no repeats, no gaps.
        assert sorted(seen[k]) == list(range(1, c.get(k) + 1))


def test_incr_many_concurrently_exact_totals(store: redcount.Store) -> None:
    threads, n = 8, 150
    c = redcount.FixedWindowCounter(store, "many", 3600)
    batch = {"x": 1, "y": 2, "z": 3}

    def work(_: int) -> None:
        for _ in range(n):
            out = c.incr_many(batch)
            assert set(out) == set(batch)
            assert all(out[k] >= batch[k] for k in batch)

    run_threads(threads, work)
    for k, amount in batch.items():
        assert sum_keys(store, f"redcount:many:{{{k}}}:*") == threads * n * amount


@pytest.mark.parametrize("mode", ["script", "commands"])
def test_incr_many_and_incr_mixed(store: redcount.Store, mode: str) -> None:
    c = redcount.FixedWindowCounter(store, "mix", 3600, mode=mode)  # type: ignore[arg-type]
    keys = [f"k{i}" for i in range(40)]

    def work(t: int) -> None:
        for i in range(60):
            if (i + t) % 2:
                c.incr_many({k: 1 for k in keys})
            else:
                for k in keys[::10]:
                    c.incr(k, 2)

    run_threads(6, work)
    # Per thread: 30 batches of +1 on every key, and 30 rounds of +2 on every 10th key.
    for i, k in enumerate(keys):
        expected = 6 * 30 + (6 * 30 * 2 if i % 10 == 0 else 0)
        assert sum_keys(store, f"redcount:mix:{{{k}}}:*") == expected, k


def test_request_ids_counted_once_under_contention(store: redcount.Store) -> None:
    c = redcount.FixedWindowCounter(store, "dedup", 3600)
    ids = [f"req-{i}" for i in range(100)]

    def work(t: int) -> None:
        order = ids if t % 2 == 0 else list(reversed(ids))
        for rid in order:
            assert c.incr("k", 1 + (int(rid[4:]) % 2), request_id=rid) >= 1

    run_threads(8, work)
    # Each id counted exactly once, with its own amount (1 or 2).
    assert sum_keys(store, "redcount:dedup:{k}:*") == sum(1 + (i % 2) for i in range(100))


def test_limiter_admits_exactly_the_limit_under_contention(store: redcount.Store) -> None:
    lim = redcount.Limiter(store)
    allowed = Counter[str]()
    lock = threading.Lock()

    def work(_: int) -> None:
        mine = sum(1 for _ in range(40) if lim.hit("100/hour;1000/day", "shared"))
        with lock:
            allowed["n"] += mine

    run_threads(8, work)  # 320 attempts, 100 allowed
    assert allowed["n"] == 100
    assert [s.count for s in lim.stats("100/hour;1000/day", "shared")] == [100, 100]
