"""``redcount demo``: a realistic workload, shown window by window.

Many clients send requests at random, a few hot ones far more than the rest. Every request
is counted by a fixed-window counter and checked by a limiter; as windows turn over, the
demo prints what each window saw: requests, distinct clients, allowed and denied decisions,
the hot clients' counts, key TTLs read back from the store, and the retry queue.
"""

from __future__ import annotations

import argparse
import random
import threading
import time

from .counters import FixedWindowCounter
from .limiter import Limiter
from .store import connect


def _fmt_window(start: float, end: float) -> str:
    return f"{time.strftime('%H:%M:%S', time.gmtime(start))}.{int(start * 1000) % 1000:03d}-" \
           f"{time.strftime('%H:%M:%S', time.gmtime(end))}.{int(end * 1000) % 1000:03d}"


def run_demo(args: argparse.Namespace) -> int:
    if args.clients < 1 or args.hot < 0 or args.hot > args.clients or args.threads < 1 or args.windows < 1:
        raise ValueError("need clients >= 1, 0 <= hot <= clients, threads >= 1 and windows >= 1")
    store = connect(args.url)
    store.ping()
    window = float(args.window)
    limit = args.limit or f"20/{window:g} second" if window != 1 else (args.limit or "20/second")
    run = f"demo{int(time.time() * 1000) % 10_000_000}"  # a fresh prefix per run
    requests = FixedWindowCounter(store, "requests", window, prefix=run, on_error="queue")
    total = FixedWindowCounter(store, "total", window, prefix=run, on_error="queue")
    limiter = Limiter(store, prefix=f"{run}:lim")
    clients = [f"client-{i:04d}" for i in range(args.clients)]
    hot = clients[: args.hot]

    print(f"redcount demo on {store.url}: {args.clients} clients ({args.hot} hot), {args.threads} threads, "
          f"{args.windows} windows of {window:g} s, limit {limit!r} per client")
    print(f"keys look like: {requests.storage_key(clients[0])}")

    # Start at the next boundary so every printed window is complete.
    start, end = requests.current_window(clients[0])
    while store.now() < end:
        time.sleep(min(0.05, max(0.0, end - store.now())))
    stop_at = end + args.windows * window

    lock = threading.Lock()
    per_window: dict[float, dict[str, int]] = {}
    seen: dict[float, set[str]] = {}

    def worker(seed: int) -> None:
        rng = random.Random(seed)
        while store.now() < stop_at:
            who = rng.choice(hot) if hot and rng.random() < 0.35 else rng.choice(clients)
            w_start, _ = requests.current_window(who)
            requests.incr(who)
            total.incr("all")
            decision = limiter.hit(limit, who)
            with lock:
                stats = per_window.setdefault(w_start, {"requests": 0, "allowed": 0, "denied": 0})
                stats["requests"] += 1
                stats["allowed" if decision else "denied"] += 1
                seen.setdefault(w_start, set()).add(who)
            if not store.is_memory:
                time.sleep(rng.random() * 0.001)

    threads = [threading.Thread(target=worker, args=(args.seed + i,)) for i in range(args.threads)]
    for t in threads:
        t.start()

    printed = 0
    current = end
    while printed < args.windows:
        while store.now() < current + window:
            time.sleep(0.02)
        # The window [current, current + window) is over: read what the store holds for it.
        stats = per_window.get(current, {"requests": 0, "allowed": 0, "denied": 0})
        hot_counts = ", ".join(f"{h}={_count_in(store, requests, h, current)}" for h in hot) or "-"
        stored_total = _count_in(store, total, "all", current)
        ttl = _ttl_in(store, requests, hot[0] if hot else clients[0], current)
        print(f"window {_fmt_window(current, current + window)}: {stats['requests']:6d} requests "
              f"(store says {stored_total}), {len(seen.get(current, ())):4d} clients, "
              f"allowed {stats['allowed']:6d}, denied {stats['denied']:6d}; hot: {hot_counts}; "
              f"key TTL after window end {ttl}")
        printed += 1
        current += window

    for t in threads:
        t.join()
    left = requests.flush(5.0) + total.flush(5.0)
    s = requests.stats()
    print(f"retry queue: queued={s.queued} retried={s.retried} delivered={s.delivered} "
          f"dropped={s.dropped} overflowed={s.overflowed} pending={left}")
    if store.is_memory:
        time.sleep(window + requests.grace + 0.2)
        store.sweep()
        print(f"after expiry the embedded store holds {store.stored_keys()} keys: no key outlives its window")
    requests.close()
    total.close()
    return 0


def _key_in(counter: FixedWindowCounter, key: str, window_start: float) -> str:
    """The storage key of `key` for the window starting at `window_start`."""
    base = counter.storage_key(key)
    index = int(round(window_start * 1000)) // int(round(counter.window * 1000))
    return base.rsplit(":", 1)[0] + f":{index}"


def _count_in(store: object, counter: FixedWindowCounter, key: str, window_start: float) -> int:
    raw = counter.store.execute("GET", _key_in(counter, key, window_start))
    return int(raw) if raw is not None else 0


def _ttl_in(store: object, counter: FixedWindowCounter, key: str, window_start: float) -> str:
    ms = counter.store.execute("PTTL", _key_in(counter, key, window_start))
    if not isinstance(ms, int) or ms < 0:
        return "expired" if ms == -2 else "MISSING"
    return f"{ms / 1000:.2f}s (grace {counter.grace:g}s)"
