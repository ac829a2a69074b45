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
from .store import Store, connect


def _fmt_window(start: float, end: float) -> str:
    return f"{time.strftime('%H:%M:%S', time.gmtime(start))}.{int(start * 1000) % 1000:03d}-" \
           f"{time.strftime('%H:%M:%S', time.gmtime(end))}.{int(end * 1000) % 1000:03d}"


def run_demo(args: argparse.Namespace) -> int:
    if args.clients < 1 or args.hot < 0 or args.hot > args.clients or args.threads < 1 or args.windows < 1:
        raise ValueError("need clients >= 1, 0 <= hot <= clients, threads >= 1 and windows >= 1")
    if not args.rate > 0:
        raise ValueError(f"--rate must be > 0 requests per second, got {args.rate}")
    store = connect(args.url)
    store.ping()
    window = float(args.window)
    limit = args.limit or (f"20/{window:g} seconds" if window != 1 else "20/second")
    run = f"demo{int(time.time() * 1000) % 10_000_000}"  # a fresh prefix per run
    requests = FixedWindowCounter(store, "requests", window, prefix=run, on_error="queue")
    limiter = Limiter(store, prefix=f"{run}:lim")
    clients = [f"client-{i:04d}" for i in range(args.clients)]
    hot = clients[: args.hot]

    print(f"redcount demo on {store.url}: {args.clients} clients ({args.hot} hot, sending 35% of the traffic), "
          f"about {args.rate:g} requests/s from {args.threads} threads, {args.windows} windows of {window:g} s, "
          f"limit {limit!r} per client")
    print(f"keys look like: {requests.storage_key(clients[0])}")

    # Start at the next boundary so every printed window is complete.
    start, end = requests.current_window(clients[0])
    while store.now() < end:
        time.sleep(min(0.05, max(0.0, end - store.now())))
    stop_at = end + args.windows * window

    def worker(seed: int) -> None:
        rng = random.Random(seed)
        per_thread = args.rate / args.threads
        next_at = time.perf_counter()
        sent = 0
        while store.now() < stop_at:
            who = rng.choice(hot) if hot and rng.random() < 0.35 else rng.choice(clients)
            requests.incr(who)
            limiter.hit(limit, who)
            sent += 1
            # Pace to the target rate, with Poisson-like jitter between requests.
            ahead = next_at - time.perf_counter()
            next_at += rng.expovariate(per_thread)
            if ahead > 0:
                time.sleep(ahead)

    threads = [threading.Thread(target=worker, args=(args.seed + i,)) for i in range(args.threads)]
    for t in threads:
        t.start()

    window_ms = int(round(window * 1000))
    current = end
    for _ in range(args.windows):
        while store.now() < current + window:
            time.sleep(0.02)
        # The window [current, current + window) is over, and its keys live on for the grace
        # period: every figure below is read back from the store, not tallied locally.
        index = int(round(current * 1000)) // window_ms
        req_keys = _keys(store, f"{run}:requests:*:{window_ms}:{index}")
        lim_keys = _keys(store, f"{run}:lim:*:{window_ms}:{index}")
        counts = _values(store, req_keys)
        allowed = sum(_values(store, lim_keys))  # denied hits store nothing
        total = sum(counts)
        by_client = dict(zip(req_keys, counts))
        hot_counts = ", ".join(
            f"{h}={by_client.get(f'{run}:requests:{{{h}}}:{window_ms}:{index}', 0)}" for h in hot
        ) or "-"
        ttls = [t for t in _values(store, req_keys[:50], "PTTL")]
        ttl_text = f"{min(ttls) / 1000:.2f}-{max(ttls) / 1000:.2f}s" if ttls else "n/a"
        print(f"window {_fmt_window(current, current + window)}: {total:6d} requests from {len(req_keys):4d} "
              f"clients, allowed {allowed:6d}, denied {total - allowed:6d}; hot: {hot_counts}; "
              f"key TTLs {ttl_text} (grace {requests.grace:g}s)", flush=True)
        current += window

    for t in threads:
        t.join()
    left = requests.flush(5.0)
    s = requests.stats()
    print(f"retry queue: queued={s.queued} retried={s.retried} delivered={s.delivered} "
          f"dropped={s.dropped} overflowed={s.overflowed} pending={left}")
    if store.is_memory:
        time.sleep(window + requests.grace + 0.2)
        store.sweep()
        print(f"after expiry the embedded store holds {store.stored_keys()} keys: no key outlives its window")
    requests.close()
    return 0


def _keys(store: Store, pattern: str) -> list[str]:
    found = store.execute("KEYS", pattern)
    return sorted(k.decode() for k in found if isinstance(k, bytes)) if isinstance(found, list) else []


def _values(store: Store, keys: list[str], command: str = "GET") -> list[int]:
    out: list[int] = []
    for v in store.execute_many([(command, k) for k in keys]):
        out.append(int(v) if isinstance(v, (bytes, int)) else 0)
    return out
