"""Worker functions for the sharded-counter and quota tests, run in spawned processes (so
this module must not import pytest)."""

from __future__ import annotations

import random
import threading

import redcount


def incr_ids(url: str, name: str, shards: int, ids: list[str], threads: int) -> int:
    """`threads` threads share one store and one counter and send one increment per entry of
    `ids` (split between them). Returns how many of them reported "applied"."""
    store = redcount.connect(url)
    counter = redcount.ShardedCounter(store, name, shards=shards)
    applied = [0] * threads

    def run(t: int) -> None:
        for rid in ids[t::threads]:
            applied[t] += counter.incr(request_id=rid)

    ts = [threading.Thread(target=run, args=(t,)) for t in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    store.close()
    return sum(applied)


def take_until_empty(url: str, name: str, threads: int, seed: int) -> tuple[int, int]:
    """`threads` threads take random sizes (1..9) from the quota until it is empty, and one
    reader checks it never reads below the floor (0). Returns (units taken, reads below the
    floor)."""
    store = redcount.connect(url)
    quota = redcount.Quota(store, name, floor=0)
    taken = [0] * threads
    below = [0]
    done = threading.Event()

    def take(t: int) -> None:
        rng = random.Random(seed * 100 + t)
        while True:
            n = rng.randint(1, 9)
            r = quota.take(n)
            if r:
                taken[t] += n
            elif r.value == 0:
                return
            # refused with units left: a smaller take may still fit (the next draw)

    def read() -> None:
        while not done.is_set():
            if quota.value() < 0:
                below[0] += 1

    reader = threading.Thread(target=read)
    reader.start()
    ts = [threading.Thread(target=take, args=(t,)) for t in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    done.set()
    reader.join()
    store.close()
    return sum(taken), below[0]
