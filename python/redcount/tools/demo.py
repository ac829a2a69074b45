"""``redcount demo``: a realistic workload, shown window by window.

Many clients send requests at a paced rate, a few hot ones far more than the rest. Every
request is counted by a fixed-window counter and checked by a limiter whose window is the
demo's window. As windows turn over, the demo prints what the store holds for each one:
requests, distinct clients, allowed and denied decisions, the hot clients' counts and key
TTLs, then the retry queue's figures. Every figure is read back from the store, not tallied
locally, so what you see is what Redis (or the embedded store) holds.
"""

from __future__ import annotations

import argparse
import random
import threading
import time

from ..counters import FixedWindowCounter
from ..limiter import Limiter, parse_limits
from ..store import Store, connect


def _fmt_window(start: float, end: float) -> str:
    def hms(t: float) -> str:
        return f"{time.strftime('%H:%M:%S', time.gmtime(t))}.{int(round(t * 1000)) % 1000:03d}"

    return f"{hms(start)}-{hms(end)}"


def run_demo(args: argparse.Namespace) -> int:
    if args.clients < 1 or not 0 <= args.hot <= args.clients or args.threads < 1 or args.windows < 1:
        raise ValueError("need clients >= 1, 0 <= hot <= clients, threads >= 1 and windows >= 1")
    if args.window < 1:
        raise ValueError(f"--window must be a whole number of seconds >= 1, got {args.window}")
    if args.per_client < 1:
        raise ValueError(f"--per-client must be >= 1, got {args.per_client}")
    if not args.rate > 0:
        raise ValueError(f"--rate must be > 0 requests per second, got {args.rate}")
    window = int(args.window)
    limit = f"{args.per_client}/second" if window == 1 else f"{args.per_client}/{window} seconds"
    limits = parse_limits(limit)

    store = connect(args.url)
    store.ping()
    run = f"demo{int(time.time() * 1000) % 10_000_000}"  # a fresh prefix per run
    requests = FixedWindowCounter(store, "requests", window, prefix=run, on_error="queue")
    limiter = Limiter(store, prefix=f"{run}:lim")
    clients = [f"client-{i:04d}" for i in range(args.clients)]
    hot = clients[: args.hot]

    print(f"redcount demo on {store.url}: {args.clients} clients ({args.hot} hot, sending 35% of the traffic), "
          f"about {args.rate:g} requests/s from {args.threads} threads, {args.windows} windows of {window} s, "
          f"limit {limit!r} per client")
    print(f"keys look like: {requests.storage_key(clients[0])}")

    # Start at the next boundary so every printed window is complete.
    _, end = requests.current_window(clients[0])
    while store.now() < end:
        time.sleep(min(0.05, max(0.0, end - store.now())))
    stop_at = end + args.windows * window
    errors: list[BaseException] = []

    def worker(seed: int) -> None:
        try:
            rng = random.Random(seed)
            per_thread = args.rate / args.threads
            next_at = time.perf_counter()
            while store.now() < stop_at and not errors:
                who = rng.choice(hot) if hot and rng.random() < 0.35 else rng.choice(clients)
                requests.incr(who)
                limiter.hit(limits, who)
                # Pace to the target rate, with Poisson-like gaps between requests.
                ahead = next_at - time.perf_counter()
                next_at += rng.expovariate(per_thread)
                if ahead > 0:
                    time.sleep(ahead)
        except BaseException as e:  # noqa: BLE001 - re-raised by the main thread
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(args.seed + i,)) for i in range(args.threads)]
    for t in threads:
        t.start()

    window_ms = window * 1000
    current = end
    for _ in range(args.windows):
        while store.now() < current + window and not errors:
            time.sleep(0.02)
        if errors:
            break
        # The window [current, current + window) is over and its keys live on for their
        # grace period. A denied hit stores nothing, so the limiter's keys hold exactly
        # the allowed hits.
        index = int(round(current * 1000)) // window_ms
        req_keys = _keys(store, f"{run}:requests:*:{window_ms}:{index}")
        lim_keys = _keys(store, f"{run}:lim:*:{window_ms}:{index}")
        counts = _values(store, req_keys)
        total = sum(counts)
        allowed = sum(_values(store, lim_keys))
        by_key = dict(zip(req_keys, counts))
        hot_counts = ", ".join(f"{h}={by_key.get(f'{run}:requests:{{{h}}}:{window_ms}:{index}', 0)}" for h in hot)
        ttls = _values(store, req_keys[:50], "PTTL")
        ttl_text = f"{min(ttls) / 1000:.2f}-{max(ttls) / 1000:.2f}s" if ttls else "n/a"
        print(f"window {_fmt_window(current, current + window)}: {total:6d} requests from {len(req_keys):4d} "
              f"clients, allowed {allowed:6d}, denied {total - allowed:6d}; hot: {hot_counts or '-'}; "
              f"key TTLs {ttl_text} (grace {requests.grace:g}s)", flush=True)
        current += window

    for t in threads:
        t.join()
    if errors:
        requests.close(0)
        raise errors[0]
    left = requests.flush(5.0)
    s = requests.stats()
    print(f"retry queue: queued={s.queued} retried={s.retried} delivered={s.delivered} "
          f"dropped={s.dropped} overflowed={s.overflowed} pending={left}")
    if store.is_memory:
        # Counter keys live window + grace; limiter keys window + 1 s.
        time.sleep(window + max(requests.grace, 1.0) + 0.2)
        store.sweep()
        print(f"after expiry the embedded store holds {store.stored_keys()} keys: no key outlives its window")
    requests.close()
    return 0


def _keys(store: Store, pattern: str) -> list[str]:
    """Every key matching ``pattern`` on every node (KEYS is about one server: a cluster is
    asked node by node)."""
    out: list[str] = []
    for node in store.nodes():
        found = node.execute("KEYS", pattern)
        if isinstance(found, list):
            out.extend(k.decode() for k in found if isinstance(k, bytes))
    return sorted(out)


def _values(store: Store, keys: list[str], command: str = "GET") -> list[int]:
    return [int(v) if isinstance(v, (bytes, int)) else 0 for v in store.execute_many([(command, k) for k in keys])]
