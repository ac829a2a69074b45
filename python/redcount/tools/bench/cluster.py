"""A Redis Cluster against one server (``--only cluster --url redis+cluster://...``): CPU per
call on each master and in this process, and the rate the cluster is projected to carry.

A machine with two cores cannot show a parallel speed-up over three masters: the client and
every server share the same cores. So nothing here is a cluster's measured throughput. Each
workload runs in alternating turns on the cluster and on one private server in the same run;
the block reads every master's CPU (``INFO cpu`` through ``Store.nodes()``) before and after
each turn, less the CPU the node spends idle (measured first: a cluster node's bus pings cost
CPU with no calls), and its own process's CPU. From those:

- server CPU per call: the masters' CPU together / calls, against the single server's;
- client CPU per call: this process's CPU / calls, against the single-server store's;
- busiest share: the busiest master's CPU / the masters' mean (1.0 = perfectly even);
- projected rate = masters x per-node rate / busiest share, where the per-node rate is what
  one master sustains at the measured server CPU per call (1 / that CPU), and linear is
  masters x the single server's per-node rate. A counter's shards land on masters by hash
  slot, so a counter with few shards per master leaves one master busier (16 shards on 3
  masters: about 1.3x the mean), and the projection says so.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from ...counters import FixedWindowCounter
from ...sharded import ShardedCounter
from ...store import Store
from .harness import BenchError, info
from .rows import COUNTER_WINDOW

CLUSTER_MANY = 1000
"""incr_many's batch in this block: one call touches many slots, so every master."""
CLUSTER_SHARDS = (64, 16)
"""Shard counts of the one-counter workloads (on 3 masters: 64 spread evenly, 16 do not)."""
SERVER_CPU_WITHIN = 1.10
"""Targets: server and client CPU per call against a single server, and the projection."""
CLIENT_CPU_WITHIN = 1.15
PROJECTED_AT_LEAST = 0.8


@dataclass
class Side:
    """One workload on one store: calls, elapsed seconds, CPU per call, CPU per master."""

    calls: int = 0
    seconds: float = 0.0
    client_cpu: float = 0.0  # seconds
    node_cpu: dict[str, float] = field(default_factory=dict)  # address -> CPU seconds, idle taken out

    @property
    def client_us(self) -> float:
        return self.client_cpu / self.calls * 1e6 if self.calls else 0.0

    @property
    def server_us(self) -> float:
        return sum(self.node_cpu.values()) / self.calls * 1e6 if self.calls else 0.0

    @property
    def busiest(self) -> float:
        """The busiest master's CPU over the masters' mean (1.0 on one server)."""
        if len(self.node_cpu) < 2:
            return 1.0
        mean = sum(self.node_cpu.values()) / len(self.node_cpu)
        return max(self.node_cpu.values()) / mean if mean > 0 else 1.0


@dataclass
class Workload:
    name: str
    cluster: Side
    single: Side
    masters: int

    def projected(self) -> tuple[float, float, float]:
        """(projected calls/s, linear calls/s, projected / linear), from per-node figures."""
        per_node = 1e6 / self.cluster.server_us if self.cluster.server_us > 0 else 0.0
        single_node = 1e6 / self.single.server_us if self.single.server_us > 0 else 0.0
        projected = self.masters * per_node / self.cluster.busiest
        linear = self.masters * single_node
        return projected, linear, projected / linear if linear > 0 else 0.0


def _cpu(node: Store) -> float:
    fields = info(node, "cpu")
    try:
        return float(fields["used_cpu_sys"]) + float(fields["used_cpu_user"])
    except (KeyError, ValueError) as e:
        raise BenchError(f"INFO cpu has no used_cpu_sys/used_cpu_user: {fields!r}") from e


def _nodes(store: Store) -> list[Store]:
    nodes = store.nodes()
    return nodes if nodes else [store]


def _address(node: Store, i: int) -> str:
    return str(getattr(node, "address", "") or getattr(node, "url", "") or f"node {i}")


def idle_rates(store: Store, seconds: float = 0.5) -> list[float]:
    """CPU seconds per second each master spends with no calls from us (its cron, and on a
    cluster the bus's pings), to take out of the per-call figures."""
    nodes = _nodes(store)
    before, t0 = [_cpu(n) for n in nodes], time.perf_counter()
    time.sleep(seconds)
    after, elapsed = [_cpu(n) for n in nodes], time.perf_counter() - t0
    return [max(0.0, a - b) / elapsed for a, b in zip(after, before)]


def measure(store: Store, op: Callable[[int], int], seconds: float, idle: Sequence[float], into: Side | None = None) -> Side:
    """Run ``op(i)`` (returns the calls it made) for ``seconds`` after a short warm-up, with
    the CPU of this process and of every master around the timed part (less each master's
    ``idle`` rate); adds to ``into`` when given (turns of one workload add up)."""
    deadline = time.perf_counter() + min(0.1, seconds / 5)
    i = 0
    while time.perf_counter() < deadline:
        op(i)
        i += 1
    nodes = _nodes(store)
    before = [_cpu(n) for n in nodes]
    c0, t0 = time.process_time(), time.perf_counter()
    calls = 0
    while time.perf_counter() - t0 < seconds:
        calls += op(i)
        i += 1
    elapsed, client = time.perf_counter() - t0, time.process_time() - c0
    after = [_cpu(n) for n in nodes]
    side = into if into is not None else Side()
    for k, (n, a, b) in enumerate(zip(nodes, after, before)):
        address = _address(n, k)
        side.node_cpu[address] = side.node_cpu.get(address, 0.0) + max(0.0, a - b - idle[k] * elapsed)
    side.client_cpu += client
    side.calls += calls
    side.seconds += elapsed
    return side


def _workloads(store: Store, prefix: str, keys: Sequence[str]) -> list[tuple[str, Callable[[int], int], list[object]]]:
    """(name, op, objects to close) for each workload on ``store``."""
    fixed = FixedWindowCounter(store, "cl", COUNTER_WINDOW, prefix=prefix)
    n = len(keys)
    batches = [{keys[(j * CLUSTER_MANY + i) % n]: 1 for i in range(CLUSTER_MANY)} for j in range(max(1, n // CLUSTER_MANY))]

    def incr(i: int) -> int:
        fixed.incr(keys[i % n])
        return 1

    def many(i: int) -> int:
        fixed.incr_many(batches[i % len(batches)])
        return CLUSTER_MANY

    out: list[tuple[str, Callable[[int], int], list[object]]] = [
        ("fixed-window incr, many counters", incr, [fixed]),
        (f"fixed-window incr_many x{CLUSTER_MANY} (per key)", many, []),
    ]
    run = uuid.uuid4().hex[:8]
    for shards in CLUSTER_SHARDS:
        sharded = ShardedCounter(store, f"cl{shards}", shards=shards, prefix=prefix)

        def sh(i: int, c: ShardedCounter = sharded) -> int:
            c.incr(1, request_id=f"{run}:{i}")
            return 1

        out.append((f"sharded incr with a request id, one counter, {shards} shards", sh, []))
    return out


def cluster_block(
    cluster: Store, single: Store, prefix: str, keys: Sequence[str], seconds: float, turns: int = 3
) -> list[Workload]:
    """Every workload on ``cluster`` and on ``single`` in alternating turns (so both meet the
    same load from whatever else runs), ``seconds`` on each in all."""
    masters = len(_nodes(cluster))
    idle_c, idle_s = idle_rates(cluster), idle_rates(single)
    on_cluster = _workloads(cluster, prefix, keys)
    on_single = _workloads(single, prefix, keys)
    try:
        out = []
        for (name, op_c, _), (_, op_s, _) in zip(on_cluster, on_single):
            w = Workload(name, Side(), Side(), masters)
            for _turn in range(turns):
                measure(cluster, op_c, seconds / turns, idle_c, w.cluster)
                measure(single, op_s, seconds / turns, idle_s, w.single)
            out.append(w)
        return out
    finally:
        for _, _, closing in on_cluster + on_single:
            for obj in closing:
                obj.close()  # type: ignore[attr-defined]


@dataclass
class NodeAlone:
    """``incr`` on one master alone, against the single server on the same keys."""

    address: str
    node: Side
    single: Side
    node_usec: float = 0.0  # INFO commandstats usec, summed over commands
    single_usec: float = 0.0


def _command_usec(node: Store) -> float:
    total = 0.0
    for value in info(node, "commandstats").values():
        fields = dict(part.split("=", 1) for part in value.split(",") if "=" in part)
        try:
            total += float(fields["usec"])
        except (KeyError, ValueError):
            continue
    return total


def _keys_by_master(store: Store, fixed: FixedWindowCounter, keys: Sequence[str]) -> list[list[str]]:
    """``keys`` grouped by the master (in ``store.nodes()`` order) owning their counter's slot."""
    nodes = _nodes(store)
    ports = [_address(n, i).rsplit(":", 1)[-1] for i, n in enumerate(nodes)]
    ranges: list[tuple[int, int, str]] = []
    slots = nodes[0].execute("CLUSTER", "SLOTS")
    for entry in slots if isinstance(slots, list) else []:
        if isinstance(entry, list) and len(entry) >= 3 and isinstance(entry[2], list) and len(entry[2]) >= 2:
            lo, hi, port = entry[0], entry[1], entry[2][1]
            if isinstance(lo, int) and isinstance(hi, int):
                ranges.append((lo, hi, str(port)))
    out: list[list[str]] = [[] for _ in nodes]
    for key in keys:
        slot = int(nodes[0].execute("CLUSTER", "KEYSLOT", fixed.storage_key(key)))  # type: ignore[arg-type]
        port = next((p for lo, hi, p in ranges if lo <= slot <= hi), None)
        if port in ports:
            out[ports.index(port)].append(key)
    return out


def per_node_block(
    cluster: Store, single: Store, prefix: str, keys: Sequence[str], seconds: float, turns: int = 3
) -> list[NodeAlone]:
    """``incr`` on each master alone (keys of its slots only), in turns with the single
    server on the same keys; ``seconds`` per master on each side in all."""
    nodes = _nodes(cluster)
    if len(nodes) < 2:
        return []
    idle_c, idle_s = idle_rates(cluster), idle_rates(single)
    fixed_c = FixedWindowCounter(cluster, "node", COUNTER_WINDOW, prefix=prefix)
    fixed_s = FixedWindowCounter(single, "node", COUNTER_WINDOW, prefix=prefix)
    groups = _keys_by_master(cluster, fixed_c, keys[: min(len(keys), 3000)])
    out = [NodeAlone(_address(n, i), Side(), Side()) for i, n in enumerate(nodes)]
    try:
        for _turn in range(turns):
            for i, node in enumerate(nodes):
                mine = groups[i]
                if not mine:
                    continue
                for side, store, counter, target, idle in (
                    (out[i].node, cluster, fixed_c, node, idle_c[i]),
                    (out[i].single, single, fixed_s, _nodes(single)[0], idle_s[0]),
                ):
                    def op(j: int, c: FixedWindowCounter = counter, ks: list[str] = mine) -> int:
                        c.incr(ks[j % len(ks)])
                        return 1

                    u0 = _command_usec(target)
                    part = measure(store, op, seconds / turns, [0.0] * len(_nodes(store)))
                    usec = _command_usec(target) - u0
                    busy = max(0.0, part.node_cpu.get(_address(target, i if store is cluster else 0), 0.0)
                               - idle * part.seconds)
                    side.calls += part.calls
                    side.seconds += part.seconds
                    side.client_cpu += part.client_cpu
                    key = out[i].address
                    side.node_cpu[key] = side.node_cpu.get(key, 0.0) + busy
                    if store is cluster:
                        out[i].node_usec += usec
                    else:
                        out[i].single_usec += usec
        return out
    finally:
        fixed_c.close()
        fixed_s.close()


def per_node_lines(alone: Sequence[NodeAlone], busiest: float) -> list[str]:
    """The per-master report and the projection from it (``busiest``: the busiest master's
    share measured with every master loaded)."""
    if not alone:
        return []
    lines = ["  fixed-window incr, each master alone (the others idle; same keys on the single server):"]
    ratios = []
    for a in alone:
        if a.node.calls == 0 or a.single.calls == 0:
            continue
        r = a.node.server_us / a.single.server_us if a.single.server_us > 0 else 0.0
        ratios.append(r)
        cmd_node, cmd_single = a.node_usec / a.node.calls, a.single_usec / a.single.calls
        lines.append(
            f"    {a.address}: server CPU/call {a.node.server_us:.2f} us vs one server {a.single.server_us:.2f} us "
            f"= {r:.2f}x; commandstats {cmd_node:.2f} vs {cmd_single:.2f} us"
        )
    if ratios:
        mean = sum(ratios) / len(ratios)
        lines.append(
            f"    mean {mean:.2f}x (target <= {SERVER_CPU_WITHIN:.2f}x); projected from these per-node figures: "
            f"{1 / (mean * busiest):.2f}x linear (busiest master {busiest:.2f}x the mean)"
        )
    return lines


def cluster_lines(workloads: Sequence[Workload]) -> list[str]:
    """The block's report, one paragraph per workload."""
    lines = ["Cluster against one server (CPU per call; projected from per-node figures, not measured)"]
    for w in workloads:
        proj, linear, frac = w.projected()
        c, s = w.cluster, w.single
        sv = c.server_us / s.server_us if s.server_us > 0 else 0.0
        cl = c.client_us / s.client_us if s.client_us > 0 else 0.0
        nodes = ", ".join(f"{a} {cpu / c.calls * 1e6:.2f}" for a, cpu in sorted(c.node_cpu.items()))
        lines += [
            f"  {w.name}:",
            f"    server CPU/call: cluster {c.server_us:.2f} us (per master: {nodes}) vs one server "
            f"{s.server_us:.2f} us = {sv:.2f}x (target <= {SERVER_CPU_WITHIN:.2f}x)",
            f"    client CPU/call: cluster {c.client_us:.2f} us vs one server {s.client_us:.2f} us = {cl:.2f}x "
            f"(target <= {CLIENT_CPU_WITHIN:.2f}x)",
            f"    busiest master {c.busiest:.2f}x the mean; projected {proj:,.0f} calls/s on {w.masters} masters "
            f"= {frac:.2f}x linear ({linear:,.0f}) (target >= {PROJECTED_AT_LEAST:.1f}x"
            + ("; few shards per master: not expected to reach it)" if "16 shards" in w.name else ")"),
            f"    measured here (2 cores shared by client and servers): cluster {c.calls / c.seconds:,.0f} "
            f"calls/s, one server {s.calls / s.seconds:,.0f} calls/s",
        ]
    return lines


def cluster_json(workloads: Sequence[Workload]) -> list[dict[str, object]]:
    out: list[dict[str, object]] = []
    for w in workloads:
        proj, linear, frac = w.projected()
        out.append(
            {
                "name": w.name,
                "masters": w.masters,
                "cluster": _side_json(w.cluster),
                "single": _side_json(w.single),
                "projected_calls_per_sec": proj,
                "linear_calls_per_sec": linear,
                "projected_over_linear": frac,
            }
        )
    return out


def _side_json(s: Side) -> dict[str, object]:
    return {
        **vars(s),
        "client_us": s.client_us,
        "server_us": s.server_us,
        "busiest": s.busiest,
    }


def delete_run_keys(store: Store, prefix: str) -> int:
    """Delete this run's keys from every master, one key per DEL (a node refuses a DEL of
    keys in two slots); returns how many."""
    deleted = 0
    for node in _nodes(store):
        for pattern in (f"{prefix}:*", f"{{{prefix}:*"):
            cursor: str | bytes = "0"
            while True:
                reply = node.execute("SCAN", cursor, "MATCH", pattern, "COUNT", 1000)
                if not isinstance(reply, list) or len(reply) != 2:
                    raise BenchError(f"unexpected SCAN reply: {reply!r}")
                next_cursor, found = reply
                for key in found if isinstance(found, list) else []:
                    if isinstance(key, bytes):
                        n = node.execute("DEL", key)
                        deleted += n if isinstance(n, int) else 0
                if not isinstance(next_cursor, bytes) or next_cursor == b"0":
                    break
                cursor = next_cursor
    return deleted
