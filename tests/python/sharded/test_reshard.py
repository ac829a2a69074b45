"""ShardedCounter.reshard() and skew(): writers in threads and processes
keep writing while the counter moves 16 -> 64 -> 128 shards; nothing is lost or counted twice,
reads never go backwards, the flusher, reconcile and restore follow the new shards."""

from __future__ import annotations

import asyncio
import multiprocessing
import random
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pytest
import redcount
import redcount.aio
from conftest import RedisServer
from helpers import wait_until
from redcount.skew import skew_of
from sharded_workers import incr_ids


class Reader(threading.Thread):
    """Reads value() in a loop and counts every read lower than the one before it (writes
    are positive only, so a lower read is a lost or hidden increment)."""

    def __init__(self, counter: redcount.ShardedCounter) -> None:
        super().__init__(daemon=True)
        self.counter = counter
        self.stop = threading.Event()
        self.reads = 0
        self.backwards: list[tuple[int, int]] = []
        self.error: BaseException | None = None

    def run(self) -> None:
        last = 0
        try:
            while not self.stop.is_set():
                v = self.counter.value()
                if v < last:
                    self.backwards.append((last, v))
                last = v
                self.reads += 1
        except BaseException as e:  # noqa: BLE001 - reported by the test
            self.error = e


# --------------------------------------------------------------------------- both stores


def test_threads_keep_writing_through_two_reshards(store: redcount.Store) -> None:
    writer_counter = redcount.ShardedCounter(store, "hot", shards=16)
    applied: Counter[str] = Counter()
    lock = threading.Lock()
    stop = threading.Event()
    sent = [0]

    def write(t: int) -> None:
        rng = random.Random(t)
        # Each thread its own object too: some writers learn the layout later than others.
        c = writer_counter if t % 2 == 0 else redcount.ShardedCounter(store, "hot", shards=16)
        i = 0
        recent: list[str] = []
        while not stop.is_set() or i < 200:
            rid = f"t{t}-{i}"
            i += 1
            ok = c.incr(request_id=rid)
            recent.append(rid)
            # Retries: now, and of an id sent a while ago (often across a reshard).
            again = [rid] if rng.random() < 0.2 else []
            if rng.random() < 0.2:
                again.append(rng.choice(recent[-500:]))
            oks = [c.incr(request_id=r) for r in again]
            if rng.random() < 0.1:
                oks += c.incr_many([("hot", 1, f"m{t}-{i}"), ("hot", 1, rid)])
                again += [f"m{t}-{i}", rid]
            with lock:
                applied[rid] += ok
                for r, o in zip(again, oks):
                    applied[r] += o
                sent[0] += 1

    reader = Reader(redcount.ShardedCounter(store, "hot", shards=16))
    reader.start()
    writers = [threading.Thread(target=write, args=(t,)) for t in range(4)]
    for w in writers:
        w.start()
    wait_until(lambda: sent[0] >= 300, timeout=60, what="writes before the first reshard")
    before = {r for r in applied if applied[r]}
    layout = writer_counter.reshard(64)
    assert [(g.first, g.count) for g in layout.generations] == [(0, 16), (16, 64)]
    probe = redcount.ShardedCounter(store, "hot", shards=16)
    # Writers learn a reshard within a second (their layout refresh): until then they write
    # the frozen shards, which is part of what this test exercises.
    wait_until(lambda: sum(probe.shard_values()[16:]) >= 300, timeout=60, what="writes to the second generation")
    layout = redcount.ShardedCounter(store, "hot", shards=16).reshard(128)
    assert layout.version == 3 and layout.current.first == 80 and layout.total == 208
    wait_until(lambda: sum(probe.shard_values()[80:]) >= 300, timeout=60, what="writes to the third generation")
    stop.set()
    for w in writers:
        w.join()
    reader.stop.set()
    reader.join()
    assert reader.error is None
    assert reader.backwards == [], "value() went backwards"
    assert reader.reads > 0
    assert max(applied.values()) == 1, "an id was counted twice"
    distinct = sum(applied.values())
    c = redcount.ShardedCounter(store, "hot", shards=16)
    assert c.value() == distinct
    per = c.shard_values()
    assert len(per) == 208 and sum(per) == distinct
    assert sum(per[80:]) > 0, "the newest generation takes the writes"
    # Retries of ids applied before the first reshard, from a fresh object: counted once.
    assert not any(c.incr(request_id=r) for r in sorted(before)[:200])
    assert c.value() == distinct
    assert c.read(0).value == distinct


def test_every_write_path_stays_exact_across_a_reshard(store: redcount.Store) -> None:
    c = redcount.ShardedCounter(store, "paths", shards=4, on_error="queue")
    other = redcount.ShardedCounter(store, "paths:other", shards=4)
    assert c.incr(2, request_id="a") and c.adjust(-1, "fix", request_id="adj")
    assert c.incr_many([("paths", 3, "b"), ("paths:other", 5, "o")]) == [True, True]
    with redcount.BufferedCounter(c, flush_every=3600, max_pending=10**6) as buf:
        buf.incr(4)
        assert buf.flush(5.0) == 0
        c.reshard(8)
        buf.incr(6)
    assert c.incr(2, request_id="a") is False
    assert c.adjust(-1, "fix", request_id="adj") is False
    again = [("paths", 3, "b"), ("paths:other", 5, "o"), ("paths", 1, "c")]
    assert c.incr_many(again) == [False, False, True]
    assert c.value() == 2 - 1 + 3 + 4 + 6 + 1
    assert other.value() == 5 and other.shards == 4
    assert c.values(["paths", "paths:other"]) == {"paths": 15, "paths:other": 5}
    assert c.shards == 8 and c.cached_layout.total == 12
    assert c.stats().failed == 0 and c.pending == 0

    async def run() -> None:
        a = redcount.aio.ShardedCounter.from_sync(c)
        layout = await a.reshard(16)
        assert layout.current.first == 12 and (await a.layout()).version == 3
        assert await a.incr(request_id="a") is False
        assert await a.incr(request_id="d") is True
        assert await a.value() == 16
        assert len(await a.shard_values()) == 28
        assert a.cached_layout.total == 28

    asyncio.run(run())


def test_bad_reshards_write_nothing(store: redcount.Store) -> None:
    c = redcount.ShardedCounter(store, "bad", shards=16)
    assert c.incr(request_id="r")
    keys = store.execute("DBSIZE")
    for bad in (0, -1, 4097, 2**70):
        with pytest.raises(redcount.InvalidInputError):
            c.reshard(bad)
    for wrong in (1.5, "32", None, True):
        with pytest.raises(TypeError, match="new_shards must be an int"):
            c.reshard(wrong)  # type: ignore[arg-type]
    with pytest.raises(redcount.InvalidInputError, match="already has 16 shards"):
        c.reshard(16)
    with pytest.raises(redcount.InvalidInputError, match="over all generations"):
        c.reshard(4090)
    assert store.execute("DBSIZE") == keys
    assert store.execute("EXISTS", c.layout_key) == 0
    assert c.layout().version == 1 and c.layout().total == 16


def test_concurrent_reshards_never_corrupt_the_layout(store: redcount.Store) -> None:
    barrier = threading.Barrier(4)
    outcomes: list[object] = []

    def go(n: int) -> None:
        c = redcount.ShardedCounter(store, "race", shards=8)
        barrier.wait()
        try:
            outcomes.append(c.reshard(n))
        except redcount.RedcountError as e:
            outcomes.append(e)

    ts = [threading.Thread(target=go, args=(n,)) for n in (16, 24, 32, 40)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    won = [o for o in outcomes if isinstance(o, redcount.ShardLayout)]
    lost = [o for o in outcomes if not isinstance(o, redcount.ShardLayout)]
    assert won, "at least one reshard wins"
    for e in lost:
        assert "concurrent reshard" in str(e)
    layout = redcount.ShardedCounter(store, "race", shards=8).layout()
    assert layout.version == 1 + len(won)
    gens = layout.generations
    assert gens[0].first == 0 and all(g.first + g.count == n.first for g, n in zip(gens, gens[1:]))


def test_flusher_reconcile_and_restore_follow_the_reshard(store: redcount.Store, sql_url: str) -> None:
    c = redcount.ShardedCounter(store, "audited", shards=16, log_maxlen=1_000_000)
    ids = {f"r{i}" for i in range(200)}
    for rid in sorted(ids):
        assert c.incr(request_id=rid)
    with redcount.Flusher(store, sql_url, [c]) as f:
        assert f.drain() == 200
        c.reshard(64)
        for i in range(200, 400):
            assert c.incr(request_id=f"r{i}")
            ids.add(f"r{i}")
        assert not any(c.incr(request_id=f"r{i}") for i in range(0, 400, 7))
        assert f.drain() == 200
        snaps = f.snapshots
        assert snaps.total("audited")[0] == c.value() == 400
        assert [s.value for s in snaps.shard_values("audited")] == c.shard_values()
        seen = Counter(d.request_id for d in snaps.deltas("audited"))
        assert set(seen) == ids and max(seen.values()) == 1
        report = redcount.reconcile(store, snaps, "audited")
        assert report.abs_drift == 0 and len(report.rows) == 80
        # A second reshard no flusher has seen yet: reconcile compares its shards too.
        c.reshard(32)
        for i in range(400, 450):
            assert c.incr(request_id=f"r{i}")
        report = redcount.reconcile(store, snaps, "audited")
        assert report.abs_drift == 0 and len(report.rows) == 112
        assert f.drain() == 50
        assert snaps.total("audited")[0] == 450
        # Data loss: everything in Redis, layout key included.
        store.execute("FLUSHALL")
        r = redcount.restore(store, snaps, "audited")
        assert r.total == 450 and len(r.values) == 112
    fresh = redcount.ShardedCounter(store, "audited", shards=16)
    assert fresh.value() == 450
    assert fresh.layout().version == 3 and fresh.shards == 32
    assert fresh.incr(request_id="after") and fresh.shard_of("after") >= 80
    assert fresh.value() == 451


# --------------------------------------------------------------------------- skew


def ids_on(c: redcount.ShardedCounter, shard: int, n: int, tag: str) -> list[str]:
    out: list[str] = []
    i = 0
    while len(out) < n:
        rid = f"{tag}{i}"
        i += 1
        if c.shard_of(rid) == shard:
            out.append(rid)
    return out


def test_skew_of_a_deliberately_skewed_workload(store: redcount.Store) -> None:
    c = redcount.ShardedCounter(store, "skewed", shards=4)
    for shard, n in ((0, 30), (1, 10), (2, 10), (3, 10)):
        for rid in ids_on(c, shard, n, f"s{shard}-"):
            assert c.incr(request_id=rid)
    s = c.skew(window=60.0, target_per_shard=0.1)
    assert s.shards == 4
    assert s.total == pytest.approx(1.0)  # 60 writes in 60 s
    assert s.max == pytest.approx(0.5) and s.mean == pytest.approx(0.25)
    assert s.max_over_mean == pytest.approx(2.0)
    assert s.gini == pytest.approx(0.25)  # sum |xi - xj| / (2 n^2 mean) = 120 / 480
    assert s.cv == pytest.approx(75**0.5 / 15)
    assert s == skew_of([30 / 60, 10 / 60, 10 / 60, 10 / 60], target_per_shard=0.1)
    # After a reshard only the current generation counts: no writes yet, nothing skewed.
    c.reshard(2)
    s = c.skew(window=60.0)
    assert s.shards == 2 and s.total == 0.0 and s.max_over_mean == 1.0
    assert s.recommended_shards is None
    with pytest.raises(redcount.InvalidInputError):
        c.skew(window=0)

    async def run() -> None:
        a = redcount.aio.ShardedCounter.from_sync(c)
        for rid in ids_on(c, 4, 6, "late-"):
            assert await a.incr(request_id=rid)
        s2 = await a.skew(window=60.0)
        assert s2 == skew_of([6 / 60, 0.0])

    asyncio.run(run())


def test_skew_counts_only_the_window(clock: redcount.ManualClock, clock_store: redcount.Store) -> None:
    c = redcount.ShardedCounter(clock_store, "windowed", shards=2)
    for rid in ids_on(c, 1, 20, "old-"):
        assert c.incr(request_id=rid)
    clock.advance(120)
    for rid in ids_on(c, 0, 12, "new-"):
        assert c.incr(request_id=rid)
    s = c.skew(window=60.0)
    assert s == skew_of([12 / 60, 0.0])
    assert c.skew(window=300.0) == skew_of([12 / 300, 20 / 300])


# --------------------------------------------------------------------------- Redis only


@pytest.mark.redis_only
@pytest.mark.slow
def test_processes_keep_writing_through_two_reshards(
    redis_server: RedisServer, redis_store: redcount.Store
) -> None:
    distinct = 6000
    ids = [f"p-{i % distinct}" for i in range(2 * distinct)]  # every id twice: a retry
    random.Random(7).shuffle(ids)
    c = redcount.ShardedCounter(redis_store, "procs", shards=16)
    reader = Reader(redcount.ShardedCounter(redis_store, "procs", shards=16))
    reader.start()
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=3, mp_context=ctx) as pool:
        futures = [pool.submit(incr_ids, redis_server.url, "procs", 16, ids[p::3], 2) for p in range(3)]
        def done() -> bool:
            return all(f.done() for f in futures)

        wait_until(lambda: c.value() >= distinct // 4 or done(), timeout=60, what="the first writes")
        c.reshard(64)
        wait_until(lambda: c.value() >= distinct // 2 or done(), timeout=60, what="more writes")
        c.reshard(128)
        applied = sum(f.result(timeout=300) for f in futures)
    reader.stop.set()
    reader.join()
    assert reader.error is None and reader.backwards == []
    assert applied == distinct
    assert c.value() == distinct
    assert len(c.shard_values()) == 208


@pytest.mark.redis_only
def test_the_reshard_command(redis_server: RedisServer, redis_store: redcount.Store) -> None:
    c = redcount.ShardedCounter(redis_store, "cli", shards=8)
    assert c.incr(3, request_id="a")

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        cmd = [sys.executable, "-m", "redcount", "reshard", "--url", redis_server.url, *args]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False,
                              stdin=subprocess.DEVNULL)

    proc = cli("--counter", "cli", "--shards", "32", "--initial-shards", "8")
    assert proc.returncode == 0, proc.stderr
    assert "reshard cli: 8 -> 32 shards (layout version 2; shards 8..39 take the writes" in proc.stdout
    assert c.layout().current.count == 32
    assert c.incr(3, request_id="a") is False and c.value() == 3
    proc = cli("--counter", "cli", "--shards", "32")
    assert proc.returncode == 2 and "already has 32 shards" in proc.stderr
    proc = cli("--counter", "cli", "--shards", "0")
    assert proc.returncode == 2 and "new_shards must be between 1 and 4096" in proc.stderr
    assert c.layout().version == 2


def test_schema_2_is_migrated_to_3(tmp_path: Path) -> None:
    import sqlalchemy as sa

    url = f"sqlite:///{tmp_path / 'old.db'}"
    redcount.SnapshotStore(url).close()
    engine = sa.create_engine(url)
    with engine.begin() as conn:  # what a schema-2 database looks like
        conn.exec_driver_sql("DROP TABLE redcount_layouts")
        conn.exec_driver_sql("UPDATE redcount_schema SET version = 2")
    engine.dispose()
    with redcount.SnapshotStore(url) as snaps:
        assert snaps.schema_version() == 3
        assert snaps.layout("x") is None
        snaps.record_layout("x", "2|0,4,1000;4,8,0", 2)
        snaps.record_layout("x", "", 1)  # an older layout never replaces a newer one
        assert snaps.layout("x") == "2|0,4,1000;4,8,0"


@pytest.mark.redis_only
def test_queued_retries_stay_exactly_once_across_a_reshard(redis_factory: Callable[..., RedisServer]) -> None:
    server = redis_factory()
    store = redcount.connect(server.url)
    c = redcount.ShardedCounter(store, "queued", shards=4, on_error="queue", retry_backoff=3.0,
                                retry_backoff_max=3.0)
    assert c.incr(1, request_id="before")
    server.stop(save=True)
    for i in range(5):
        assert c.incr(2, request_id=f"while-{i}") is True
    assert c.incr(2, request_id="while-0") is True  # a repeat, queued too; counted once
    server.start()
    other = redcount.connect(server.url)
    # The reshard lands while the writes wait in the queue: they are routed again when retried.
    assert redcount.ShardedCounter(other, "queued", shards=4).reshard(16).current.first == 4
    assert c.flush(timeout=30) == 0
    assert c.stats().delivered == 6 and c.stats().failed == 0
    fresh = redcount.ShardedCounter(other, "queued", shards=4)
    assert fresh.value() == 11
    assert not any(fresh.incr(request_id=f"while-{i}") for i in range(5))
    assert not fresh.incr(request_id="before")
    assert fresh.value() == 11
    c.close()
    store.close()
    other.close()
