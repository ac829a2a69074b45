"""Real Redis topologies on loopback for tests: a Redis Cluster (3 masters + 3 replicas, or
TLS), a Sentinel trio over a master and its replicas, and standalone servers for a
client-side hash ring. Every process is a real redis-server from PATH; nothing is mocked.

    def test_x(redis_cluster):                 # shared, flushed before each test
        master = redis_cluster.node_for_slot(0)
    def test_y(redis_cluster_factory):         # a fresh cluster this test may break
        c = redis_cluster_factory()
        replica = c.replicas(of=c.masters()[0])[0]
        t0 = c.kill(c.masters()[0])
        print(c.wait_for_promotion(replica, since=t0))

Roles are always read from the servers (CLUSTER NODES, ROLE, SENTINEL), never assumed from
a port. Readiness is polled, never slept for. Each server runs in its own process group
(and, when started from the main thread, dies with the test process through
PR_SET_PDEATHSIG); fixtures kill them in finalizers, so a failing test leaves nothing behind.

Imported by conftest.py: the fixtures below are defined once per session.
"""

from __future__ import annotations

import atexit
import os
import queue
import secrets
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from helpers import wait_until
from redcount.tools.servers import die_with_parent, free_port

__all__ = [
    "redis_cluster",
    "redis_cluster_factory",
    "redis_cluster_session",
    "redis_ring",
    "redis_ring_session",
    "redis_sentinel_factory",
    "redis_tls_cluster",
    "redis_tls_cluster_session",
    "topology_certs",
]

REDIS_SERVER = os.environ.get("REDCOUNT_TEST_REDIS_SERVER", "redis-server")
REDIS_CLI = os.environ.get("REDCOUNT_TEST_REDIS_CLI", "redis-cli")
MAKE_CERTS = Path(__file__).resolve().parent.parent / "tls" / "make_certs.sh"
HOST = "127.0.0.1"
START_TIMEOUT = 10.0  # seconds one server may take to answer PING
TOPOLOGY_TIMEOUT = 30.0  # seconds a topology may take to become healthy (2 loaded cores)
POLL = 0.02  # seconds between two polls of a bounded readiness loop

SLOTS = 16384


# --- a minimal RESP2 client (control traffic only; no client library involved) ----------------


class ReplyError(Exception):
    """An error reply (``-ERR ...``) from a server."""


@dataclass(frozen=True)
class TlsFiles:
    """Certificate files, as paths: the CA every side trusts, and one certificate + key."""

    ca: Path
    cert: Path
    key: Path


class Conn:
    """One blocking connection speaking RESP2; ``call`` returns str, int, list, None or raises
    ReplyError. For control commands and readiness checks, not for load."""

    def __init__(self, port: int, tls: TlsFiles | None = None, timeout: float | None = 2.0) -> None:
        sock = socket.create_connection((HOST, port), timeout=timeout)
        if tls is not None:
            ctx = ssl.create_default_context(cafile=str(tls.ca))
            ctx.load_cert_chain(str(tls.cert), str(tls.key))
            sock = ctx.wrap_socket(sock, server_hostname=HOST)
        self.sock = sock
        self.file = sock.makefile("rb")

    def close(self) -> None:
        try:
            self.file.close()
            self.sock.close()
        except OSError:
            pass

    def __enter__(self) -> Conn:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def send(self, *args: str | bytes | int) -> None:
        out = [b"*%d\r\n" % len(args)]
        for a in args:
            b = a if isinstance(a, bytes) else str(a).encode()
            out.append(b"$%d\r\n%s\r\n" % (len(b), b))
        self.sock.sendall(b"".join(out))

    def read(self) -> Any:
        line = self.file.readline()
        if not line:
            raise ConnectionError("connection closed by the server")
        kind, rest = line[:1], line[1:-2]
        if kind == b"+":
            return rest.decode()
        if kind == b"-":
            return ReplyError(rest.decode())
        if kind == b":":
            return int(rest)
        if kind == b"$":
            n = int(rest)
            if n < 0:
                return None
            data = self.file.read(n + 2)
            return data[:-2].decode(errors="replace")
        if kind == b"*":
            n = int(rest)
            return None if n < 0 else [self.read() for _ in range(n)]
        raise ConnectionError(f"unexpected reply line {line!r}")

    def call(self, *args: str | bytes | int) -> Any:
        self.send(*args)
        reply = self.read()
        if isinstance(reply, ReplyError):
            raise reply
        return reply


def parse_info(text: str) -> dict[str, str]:
    """INFO / CLUSTER INFO text as a dict (section headers and blank lines dropped)."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        if line and not line.startswith("#") and ":" in line:
            k, v = line.split(":", 1)
            out[k] = v.strip()
    return out


# --- key slots (CRC16/XMODEM with the hash-tag rule, as Redis Cluster computes them) -----------


def _crc16_table() -> list[int]:
    table = []
    for i in range(256):
        crc = i << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x1021) if crc & 0x8000 else (crc << 1)
        table.append(crc & 0xFFFF)
    return table


_CRC16 = _crc16_table()


def key_slot(key: str | bytes) -> int:
    """The cluster slot of a key: CRC16 of the first non-empty ``{tag}``, else of the key."""
    b = key.encode() if isinstance(key, str) else key
    start = b.find(b"{")
    if start >= 0:
        end = b.find(b"}", start + 1)
        if end > start + 1:
            b = b[start + 1 : end]
    crc = 0
    for byte in b:
        crc = ((crc << 8) & 0xFFFF) ^ _CRC16[((crc >> 8) ^ byte) & 0xFF]
    return crc % SLOTS


# --- one redis-server process --------------------------------------------------------------------


_LIVE: weakref.WeakSet[Node] = weakref.WeakSet()


@atexit.register
def _kill_leftovers() -> None:  # a last resort behind the fixtures' finalizers
    for node in list(_LIVE):
        node.cleanup()


def _require(exe: str) -> str:
    path = shutil.which(exe)
    if path is None:
        pytest.fail(f"{exe!r} not found on PATH: these tests need real Redis binaries "
                    "(apt-get install redis-server redis-tools). Refusing to skip.", pytrace=False)
    return path


class Node:
    """One redis-server (or sentinel) on loopback, configured by a file in its own directory,
    so it can be killed, paused and restarted on the same ports with the same identity
    (nodes.conf, sentinel state). ``port`` is the port clients use: the TLS port when ``tls``."""

    def __init__(self, config: Sequence[str] = (), *, tls: TlsFiles | None = None, cluster: bool = False,
                 sentinel: bool = False, name: str = "redis") -> None:
        self.exe = _require(REDIS_SERVER)
        self.extra = list(config)
        self.tls = tls
        self.cluster = cluster
        self.sentinel = sentinel
        self.name = name
        self.dir = Path(tempfile.mkdtemp(prefix=f"redcount-{name}-"))
        self.port = free_port()
        self.bus_port = free_port() if cluster else 0
        self.proc: subprocess.Popen[bytes] | None = None
        self.paused = False
        self._started_once = False
        _LIVE.add(self)

    def __repr__(self) -> str:
        state = "paused" if self.paused else ("up" if self.alive else "down")
        return f"<{self.name} {self.addr} {state}>"

    @property
    def addr(self) -> str:
        return f"{HOST}:{self.port}"

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def reachable(self) -> bool:
        """Running and not paused: a command to it will be answered."""
        return self.alive and not self.paused

    def conn(self, timeout: float = 2.0) -> Conn:
        return Conn(self.port, self.tls, timeout)

    def call(self, *args: str | bytes | int, timeout: float = 2.0) -> Any:
        with self.conn(timeout) as c:
            return c.call(*args)

    def info(self, section: str = "") -> dict[str, str]:
        return parse_info(self.call("INFO", section) if section else self.call("INFO"))

    def _config_text(self) -> str:
        lines = [f"bind {HOST}", f"dir {self.dir}", "logfile redis.log", "daemonize no"]
        if not self.sentinel:
            lines += ['save ""', "appendonly no", "dbfilename dump.rdb"]
        if self.tls is not None:
            lines += ["port 0", f"tls-port {self.port}", f"tls-cert-file {self.tls.cert}",
                      f"tls-key-file {self.tls.key}", f"tls-ca-cert-file {self.tls.ca}",
                      "tls-auth-clients yes"]
        else:
            lines.append(f"port {self.port}")
        if self.cluster:
            lines += ["cluster-enabled yes", "cluster-config-file nodes.conf",
                      f"cluster-port {self.bus_port}"]
            if self.tls is not None:
                lines += ["tls-cluster yes", "tls-replication yes"]
        lines += self.extra
        return "\n".join(lines) + "\n"

    def start(self) -> Node:
        assert not self.alive, f"{self} already running"
        for attempt in range(4):
            (self.dir / "redis.conf").write_text(self._config_text())
            cmd = [self.exe, str(self.dir / "redis.conf")] + (["--sentinel"] if self.sentinel else [])
            # Dies with the test process if that is killed outright (the fixtures' finalizers
            # cover everything else); PDEATHSIG follows the creating thread, so main thread only.
            main = threading.current_thread() is threading.main_thread()
            self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                         stderr=subprocess.STDOUT, cwd=self.dir, start_new_session=True,
                                         preexec_fn=die_with_parent() if main else None)
            self.paused = False
            try:
                self._wait_ready()
                self._started_once = True
                return self
            except _PortTaken:
                if self._started_once or attempt == 3:
                    raise
                self.port = free_port()
                if self.cluster:
                    self.bus_port = free_port()
        raise AssertionError("unreachable")

    def _log_tail(self) -> str:
        try:
            return (self.dir / "redis.log").read_text(errors="replace")[-3000:]
        except OSError:
            return ""

    def _wait_ready(self) -> None:
        assert self.proc is not None
        deadline = time.monotonic() + START_TIMEOUT
        last: object = None
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                log = self._log_tail()
                self.proc = None
                if "Address already in use" in log:
                    raise _PortTaken(log)
                raise RuntimeError(f"{self.name} on {self.addr} exited at start:\n{log}")
            try:
                if self.call("PING", timeout=0.5) == "PONG":
                    return
            except (OSError, ReplyError, ConnectionError) as e:
                last = e
            time.sleep(POLL)
        self.kill()
        raise RuntimeError(f"{self.name} on {self.addr} not ready after {START_TIMEOUT}s: {last!r}\n"
                           f"{self._log_tail()}")

    def send_signal(self, sig: int) -> float:
        """Send ``sig`` to the server's process group; returns the monotonic time it was sent."""
        assert self.proc is not None and self.alive, f"{self} is not running"
        t = time.monotonic()
        os.killpg(self.proc.pid, sig)
        if sig == signal.SIGSTOP:
            self.paused = True
        elif sig == signal.SIGCONT:
            self.paused = False
        elif sig in (signal.SIGKILL, signal.SIGTERM):
            self._reap()
        return t

    def kill(self, sig: int = signal.SIGKILL) -> float:
        """SIGKILL (or another terminating signal) and reap; a no-op if already down."""
        if not self.alive:
            self._reap()
            return time.monotonic()
        if self.paused and sig != signal.SIGKILL:
            os.killpg(self.proc.pid, signal.SIGCONT)  # type: ignore[union-attr]
        return self.send_signal(sig)

    def _reap(self) -> None:
        if self.proc is not None:
            try:
                self.proc.wait(timeout=START_TIMEOUT)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.paused = False

    def pause(self) -> float:
        return self.send_signal(signal.SIGSTOP)

    def resume(self) -> float:
        return self.send_signal(signal.SIGCONT)

    def restart(self) -> Node:
        self.kill()
        return self.start()

    def cleanup(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait()
        self.proc = None
        shutil.rmtree(self.dir, ignore_errors=True)
        _LIVE.discard(self)


class _PortTaken(RuntimeError):
    pass


# What a readiness poll tolerates while a topology comes up: a node not listening yet, a
# reply saying it is loading, an assertion inside a check.
TRANSIENT = (OSError, ReplyError, ConnectionError, AssertionError)


# --- Redis Cluster -------------------------------------------------------------------------------


@dataclass
class NodeEntry:
    """One line of CLUSTER NODES."""

    id: str
    port: int
    flags: set[str]
    master_id: str | None
    link: str
    slots: list[tuple[int, int]]

    @property
    def is_master(self) -> bool:
        return "master" in self.flags

    @property
    def failed(self) -> bool:
        return bool(self.flags & {"fail", "fail?", "noaddr"})


def parse_cluster_nodes(text: str) -> list[NodeEntry]:
    out = []
    for line in text.splitlines():
        if not line.strip():
            continue
        f = line.split()
        addr = f[1].split("@")[0]
        port = int(addr.rsplit(":", 1)[1]) if ":" in addr and addr.rsplit(":", 1)[1] else 0
        slots = []
        for s in f[8:]:
            if s.startswith("["):
                continue  # a migrating/importing marker, not an owned range
            lo, _, hi = s.partition("-")
            slots.append((int(lo), int(hi or lo)))
        out.append(NodeEntry(id=f[0], port=port, flags=set(f[2].split(",")),
                             master_id=None if f[3] == "-" else f[3], link=f[7], slots=slots))
    return out


class Cluster:
    """A Redis Cluster on loopback: ``masters`` masters with ``replicas`` replicas each, created
    by ``redis-cli --cluster create``. Helpers read roles from CLUSTER NODES of a reachable
    node. Not thread-safe (one test drives it; load threads use their own clients)."""

    def __init__(self, masters: int = 3, replicas: int = 1, *, tls: TlsFiles | None = None,
                 node_timeout_ms: int = 2000, config: Sequence[str] = ()) -> None:
        self.n_masters = masters
        self.n_replicas = replicas
        self.tls = tls
        self.node_timeout_ms = node_timeout_ms
        base = [f"cluster-node-timeout {node_timeout_ms}", "repl-diskless-sync yes",
                "repl-diskless-sync-delay 0"]
        self.nodes = [Node([*base, *config], tls=tls, cluster=True, name="cluster-node")
                      for _ in range(masters * (1 + replicas))]
        self.started_in = 0.0

    # addresses for clients
    @property
    def startup_nodes(self) -> list[tuple[str, int]]:
        return [(HOST, n.port) for n in self.nodes]

    @property
    def url(self) -> str:
        scheme = "rediss+cluster" if self.tls else "redis+cluster"
        return f"{scheme}://" + ",".join(n.addr for n in self.nodes)

    def start(self) -> Cluster:
        t0 = time.monotonic()
        try:
            for n in self.nodes:
                n.start()
            cmd = [_require(REDIS_CLI)]
            if self.tls is not None:
                cmd += ["--tls", "--cacert", str(self.tls.ca), "--cert", str(self.tls.cert),
                        "--key", str(self.tls.key)]
            cmd += ["--cluster", "create", *(n.addr for n in self.nodes),
                    "--cluster-replicas", str(self.n_replicas), "--cluster-yes"]
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=TOPOLOGY_TIMEOUT,
                                  stdin=subprocess.DEVNULL)
            if done.returncode != 0 or "[OK] All 16384 slots covered" not in done.stdout:
                raise RuntimeError(f"redis-cli --cluster create failed ({done.returncode}):\n"
                                   f"{done.stdout[-3000:]}\n{done.stderr[-2000:]}")
            self.wait_healthy(expect=(self.n_masters, self.n_masters * self.n_replicas))
        except BaseException:
            self.cleanup()
            raise
        self.started_in = time.monotonic() - t0
        return self

    def cleanup(self) -> None:
        for n in self.nodes:
            n.cleanup()

    # reading the topology
    def node_by_port(self, port: int) -> Node:
        for n in self.nodes:
            if n.port == port:
                return n
        raise KeyError(f"no node of this cluster on port {port}")

    def reachable(self) -> list[Node]:
        return [n for n in self.nodes if n.reachable]

    def cluster_nodes(self, via: Node | None = None) -> list[NodeEntry]:
        """CLUSTER NODES as seen by ``via`` (default: the first reachable node)."""
        asked = via or self.reachable()[0]
        return parse_cluster_nodes(asked.call("CLUSTER", "NODES"))

    def node_id(self, node: Node) -> str:
        return str(node.call("CLUSTER", "MYID"))

    def masters(self, via: Node | None = None) -> list[Node]:
        """Nodes the cluster sees as masters owning slots and not failed, by port order."""
        return sorted((self.node_by_port(e.port) for e in self.cluster_nodes(via)
                       if e.is_master and e.slots and not e.failed), key=lambda n: n.port)

    def replicas(self, of: Node | None = None, via: Node | None = None) -> list[Node]:
        """Replicas (not failed), optionally only those of master ``of``."""
        entries = self.cluster_nodes(via)
        want = None
        if of is not None:
            want = next(e.id for e in entries if e.port == of.port)
        return sorted((self.node_by_port(e.port) for e in entries
                       if "slave" in e.flags and not e.failed and (want is None or e.master_id == want)),
                      key=lambda n: n.port)

    def node_for_slot(self, slot: int, via: Node | None = None) -> Node:
        for e in self.cluster_nodes(via):
            if e.is_master and not e.failed and any(lo <= slot <= hi for lo, hi in e.slots):
                return self.node_by_port(e.port)
        raise LookupError(f"no live master owns slot {slot}")

    def node_for_key(self, key: str) -> Node:
        return self.node_for_slot(key_slot(key))

    def slots_of(self, node: Node, via: Node | None = None) -> list[tuple[int, int]]:
        for e in self.cluster_nodes(via):
            if e.port == node.port:
                return e.slots
        return []

    def key_on(self, node: Node, prefix: str = "k") -> str:
        """A key ``{prefix-N}`` whose slot ``node`` owns now."""
        ranges = self.slots_of(node)
        for i in range(100_000):
            key = f"{{{prefix}-{i}}}"
            s = key_slot(key)
            if any(lo <= s <= hi for lo, hi in ranges):
                return key
        raise LookupError(f"no key with prefix {prefix!r} maps to {node}")

    # health
    def _healthy(self, expect: tuple[int, int] | None = None) -> bool:
        live = self.reachable()
        views = {}
        for n in live:
            if parse_info(n.call("CLUSTER", "INFO")).get("cluster_state") != "ok":
                return False
            entries = parse_cluster_nodes(n.call("CLUSTER", "NODES"))
            port_of = {e.id: e.port for e in entries}
            views[n.port] = tuple(sorted(
                (e.port, e.is_master, port_of.get(e.master_id or "", 0), tuple(e.slots))
                for e in entries if not e.failed))
        if len(set(views.values())) != 1:
            return False  # the live nodes do not agree yet on roles and slot owners
        view = next(iter(views.values()))
        if sum(hi - lo + 1 for _, is_master, _, ranges in view if is_master for lo, hi in ranges) != SLOTS:
            return False
        counts = (sum(1 for v in view if v[1] and v[3]), sum(1 for v in view if not v[1]))
        if expect is not None and counts != expect:
            return False
        for n in live:
            repl = n.info("replication")
            if repl.get("role") == "slave":
                master_port = int(repl["master_port"])
                if repl.get("master_link_status") != "up":
                    return False
                master = self.node_by_port(master_port)
                if not master.reachable:
                    return False
                state = master.info("replication")
                if not any(v.startswith(f"ip={HOST},port={n.port},") and "state=online" in v
                           for k, v in state.items() if k.startswith("slave")):
                    return False
        return True

    def wait_healthy(self, timeout: float = TOPOLOGY_TIMEOUT, expect: tuple[int, int] | None = None) -> float:
        """Until every reachable node says cluster_state:ok, they agree on every live node's
        role, master and slots, all 16384 slots are covered and every reachable replica is
        online at its master; with ``expect=(masters, replicas)`` also those counts.
        Returns the seconds waited."""
        t0 = time.monotonic()
        wait_until(lambda: self._healthy(expect), timeout, what="cluster healthy", interval=POLL, ignore=TRANSIENT)
        return time.monotonic() - t0

    def check_healthy(self) -> None:
        if not self._healthy():
            raise AssertionError(f"cluster not healthy: {self.describe()}")

    def describe(self) -> str:
        try:
            return "\n" + "\n".join(
                f"  {e.port} {','.join(sorted(e.flags))} slots={e.slots}" for e in self.cluster_nodes())
        except (IndexError, OSError, ReplyError) as e:
            return f"(no node answers: {e!r})"

    def flushall(self) -> None:
        for m in self.masters():
            m.call("FLUSHALL")
            m.call("SCRIPT", "FLUSH")

    # faults
    def kill(self, node: Node, sig: int = signal.SIGKILL) -> float:
        """Send ``sig`` (SIGKILL by default) to a node; returns the monotonic time of the signal."""
        return node.kill(sig)

    def stop(self, node: Node) -> float:
        """SIGSTOP: the node stops answering but keeps its sockets (a hung node)."""
        return node.pause()

    def cont(self, node: Node) -> float:
        return node.resume()

    def restart(self, node: Node) -> Node:
        """Start a killed node again on its ports with its nodes.conf: it rejoins (a former
        master comes back as a replica of the node that replaced it)."""
        return node.start() if not node.alive else node

    def cut_replication(self, replica: Node) -> Node:
        """Cut ``replica`` off its master without failing it: SIGSTOP the replica, then
        ``CLIENT KILL TYPE replica`` on the master, so writes acknowledged from now on are on
        the master only. Returns the master. ``cont(replica)`` ends the cut (the replica
        reconnects and resyncs); keep the cut shorter than the node timeout, or the cluster
        marks the replica failed."""
        me = next(e for e in self.cluster_nodes() if e.port == replica.port)
        master = next(self.node_by_port(e.port) for e in self.cluster_nodes() if e.id == me.master_id)
        replica.pause()
        master.call("CLIENT", "KILL", "TYPE", "replica")
        return master

    def heal(self, timeout: float = TOPOLOGY_TIMEOUT) -> float:
        """Resume paused nodes, restart killed ones (a former master rejoins as a replica) and
        wait for the full layout (``masters`` masters, each with its replicas) to be healthy.
        Returns the seconds it took."""
        t0 = time.monotonic()
        for n in self.nodes:
            if n.paused:
                n.resume()
            elif not n.alive:
                n.start()
        self.wait_healthy(timeout, expect=(self.n_masters, self.n_masters * self.n_replicas))
        return time.monotonic() - t0

    def failover(self, replica: Node, mode: str | None = None, timeout: float = TOPOLOGY_TIMEOUT) -> float:
        """CLUSTER FAILOVER [FORCE|TAKEOVER] on ``replica``; waits for its promotion and returns
        the seconds from the command to the promotion (see wait_for_promotion)."""
        t0 = time.monotonic()
        args = ["CLUSTER", "FAILOVER"] + ([mode.upper()] if mode else [])
        assert replica.call(*args) == "OK"
        return self.wait_for_promotion(replica, since=t0, timeout=timeout)

    def wait_for_promotion(self, replica: Node, since: float | None = None,
                           timeout: float = TOPOLOGY_TIMEOUT, agreed: bool = True) -> float:
        """Until ``replica`` is a master owning slots in its own CLUSTER NODES and answers
        cluster_state:ok: returns the seconds from ``since`` (default: the call) to that moment,
        the server's own promotion time. Then, unless ``agreed=False``, waits (not counted)
        until every reachable node sees it as the owner of those slots, so that the helpers
        reading CLUSTER NODES of any node give the new layout."""
        t0 = time.monotonic() if since is None else since

        def promoted() -> bool:
            me = next(e for e in parse_cluster_nodes(replica.call("CLUSTER", "NODES")) if "myself" in e.flags)
            return (me.is_master and bool(me.slots)
                    and parse_info(replica.call("CLUSTER", "INFO")).get("cluster_state") == "ok")

        wait_until(promoted, timeout, what=f"promotion of {replica}", interval=POLL, ignore=TRANSIENT)
        took = time.monotonic() - t0
        if agreed:
            slots = self.slots_of(replica, via=replica)
            wait_until(lambda: all(
                self.slots_of(replica, via=n) == slots for n in self.reachable()), timeout, what=f"every node sees {replica} as a master", interval=POLL, ignore=TRANSIENT)
        return took

    def migrate_slot(self, slot: int, target: Node, batch: int = 100,
                     on_batch: Callable[[int], None] | None = None) -> int:
        """Move ``slot`` with its keys to master ``target``: SETSLOT IMPORTING / MIGRATING,
        MIGRATE of the keys ``batch`` at a time (``on_batch(moved_so_far)`` after each), then
        SETSLOT NODE on the target, the source and every other master. Returns keys moved."""
        source = self.node_for_slot(slot)
        if source.port == target.port:
            return 0
        src_id, tgt_id = self.node_id(source), self.node_id(target)
        target.call("CLUSTER", "SETSLOT", slot, "IMPORTING", src_id)
        source.call("CLUSTER", "SETSLOT", slot, "MIGRATING", tgt_id)
        moved = 0
        while True:
            keys = source.call("CLUSTER", "GETKEYSINSLOT", slot, batch)
            if not keys:
                break
            source.call("MIGRATE", HOST, target.port, "", 0, 5000, "KEYS", *keys, timeout=10.0)
            moved += len(keys)
            if on_batch is not None:
                on_batch(moved)
        target.call("CLUSTER", "SETSLOT", slot, "NODE", tgt_id)
        source.call("CLUSTER", "SETSLOT", slot, "NODE", tgt_id)
        for m in self.masters():
            if m.port not in (source.port, target.port):
                m.call("CLUSTER", "SETSLOT", slot, "NODE", tgt_id)
        wait_until(lambda: all(self.node_for_slot(slot, via=n).port == target.port for n in self.reachable()), TOPOLOGY_TIMEOUT, what=f"slot {slot} owned by {target} everywhere", interval=POLL, ignore=TRANSIENT)
        return moved


# --- Sentinel ------------------------------------------------------------------------------------


@dataclass
class SwitchMaster:
    """One ``+switch-master`` event, with the monotonic time it was read."""

    service: str
    old_port: int
    new_port: int
    at: float
    sentinel_port: int


class SwitchWatcher:
    """Subscriptions to ``+switch-master`` on every sentinel, opened before a fault so that
    no event is missed. ``wait()`` returns the first event (any sentinel)."""

    def __init__(self, sentinels: Sequence[Node]) -> None:
        self.events: queue.Queue[SwitchMaster] = queue.Queue()
        self._conns: list[Conn] = []
        self._threads: list[threading.Thread] = []
        for s in sentinels:
            if not s.reachable:
                continue
            c = Conn(s.port, s.tls, timeout=None)  # blocking: the listener thread waits for events
            c.send("SUBSCRIBE", "+switch-master")
            c.read()  # the subscription confirmation: from here on, no event is missed
            self._conns.append(c)
            t = threading.Thread(target=self._listen, args=(c, s.port), daemon=True)
            t.start()
            self._threads.append(t)

    def _listen(self, c: Conn, port: int) -> None:
        while True:
            try:
                msg = c.read()
            except (OSError, ConnectionError, ValueError):
                return
            if isinstance(msg, list) and len(msg) == 3 and msg[0] == "message":
                name, _, old_port, _, new_port = str(msg[2]).split()
                self.events.put(SwitchMaster(name, int(old_port), int(new_port), time.monotonic(), port))

    def wait(self, timeout: float = TOPOLOGY_TIMEOUT) -> SwitchMaster:
        try:
            return self.events.get(timeout=timeout)
        except queue.Empty:
            raise TimeoutError(f"no +switch-master within {timeout}s") from None

    def close(self) -> None:
        for c in self._conns:
            try:
                c.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            c.close()
        for t in self._threads:
            t.join(timeout=2)

    def __enter__(self) -> SwitchWatcher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class SentinelGroup:
    """Three sentinels (quorum 2) over a master and ``replicas`` replicas. The sentinels'
    configuration names each other and the replicas (``known-sentinel``/``known-replica`` with
    fixed ids), so the group is ready without waiting for hello-message discovery.
    ``min_replicas_to_write`` is set on every data node (a replica may become the master)."""

    def __init__(self, replicas: int = 1, *, service: str = "mymaster", min_replicas_to_write: int = 0,
                 down_after_ms: int = 1000, failover_timeout_ms: int = 5000, quorum: int = 2,
                 n_sentinels: int = 3, tls: TlsFiles | None = None) -> None:
        self.service = service
        self.tls = tls
        extra = ["repl-diskless-sync yes", "repl-diskless-sync-delay 0"]
        if min_replicas_to_write:
            extra += [f"min-replicas-to-write {min_replicas_to_write}", "min-replicas-max-lag 10"]
        # TLS only (``port 0``): replication and the sentinels' links to the data nodes too,
        # each side presenting ``tls.cert`` (serverAuth + clientAuth) as its client certificate.
        if tls is not None:
            extra.append("tls-replication yes")
        self.data = [Node(extra, tls=tls, name="sentinel-data") for _ in range(1 + replicas)]
        self.first_master = self.data[0]
        # wait_ready()'s write that every replica must have received (_ready), and where.
        self._marker_offset: int | None = None
        self._marker_master = 0
        for r in self.data[1:]:
            r.extra.append(f"replicaof {HOST} {self.first_master.port}")
        ids = [secrets.token_hex(20) for _ in range(n_sentinels)]
        self.sentinels = [Node(tls=tls, name="sentinel", sentinel=True) for _ in range(n_sentinels)]
        for i, s in enumerate(self.sentinels):
            s.extra = [
                *(["tls-replication yes"] if tls is not None else []),
                f"sentinel myid {ids[i]}",
                f"sentinel monitor {service} {HOST} {self.first_master.port} {quorum}",
                f"sentinel down-after-milliseconds {service} {down_after_ms}",
                f"sentinel failover-timeout {service} {failover_timeout_ms}",
                f"sentinel parallel-syncs {service} 1",
                *(f"sentinel known-replica {service} {HOST} {r.port}" for r in self.data[1:]),
                *(f"sentinel known-sentinel {service} {HOST} {o.port} {ids[j]}"
                  for j, o in enumerate(self.sentinels) if j != i),
            ]
        self.started_in = 0.0

    @property
    def sentinel_addrs(self) -> list[tuple[str, int]]:
        return [(HOST, s.port) for s in self.sentinels]

    @property
    def url(self) -> str:
        scheme = "rediss+sentinel" if self.tls else "redis+sentinel"
        return f"{scheme}://" + ",".join(s.addr for s in self.sentinels) + f"/{self.service}"

    def node_by_port(self, port: int) -> Node:
        for n in self.data:
            if n.port == port:
                return n
        raise KeyError(f"no data node on port {port}")

    def start(self) -> SentinelGroup:
        t0 = time.monotonic()
        try:
            for n in self.data:
                n.start()
            for s in self.sentinels:
                s.start()
            self.wait_ready()
        except BaseException:
            self.cleanup()
            raise
        self.started_in = time.monotonic() - t0
        return self

    def cleanup(self) -> None:
        for n in [*self.sentinels, *self.data]:
            n.cleanup()

    def master(self, via: Node | None = None) -> Node:
        """The master according to a sentinel (``SENTINEL get-master-addr-by-name``)."""
        s = via or next(s for s in self.sentinels if s.reachable)
        _, port = s.call("SENTINEL", "get-master-addr-by-name", self.service)
        return self.node_by_port(int(port))

    def replicas(self) -> list[Node]:
        """Data nodes that are up and report role:slave (from ROLE, not from configuration)."""
        return [n for n in self.data if n.reachable and n.call("ROLE")[0] == "slave"]

    def _ready(self, sentinels_see_replicas: bool = True) -> bool:
        master = self.master()
        if master.call("ROLE")[0] != "master":
            return False
        others = [n for n in self.data if n is not master and n.reachable]
        state = master.info("replication")
        online = sum(1 for k, v in state.items() if k.startswith("slave") and "state=online" in v)
        if online != len(others):
            return False
        # "online" is not yet "receiving writes": after a diskless full sync the master streams
        # to a replica only once it has sent its first REPLCONF ACK, up to a second later, and
        # holds the writes meanwhile (a master killed then loses them). So one write (a key set
        # and deleted) must reach every replica.
        if self._marker_offset is None or self._marker_master != master.port:
            master.call("SET", "topology:ready", "1")
            master.call("DEL", "topology:ready")
            self._marker_offset = int(master.info("replication")["master_repl_offset"])
            self._marker_master = master.port
            return False
        if any(int(n.info("replication").get("slave_repl_offset", -1)) < self._marker_offset for n in others):
            return False
        for s in self.sentinels:
            if not s.reachable:
                continue
            if self.master(via=s).port != master.port:
                return False
            flat = s.call("SENTINEL", "MASTER", self.service)
            info = dict(zip(flat[::2], flat[1::2], strict=True))
            if info["flags"] != "master" or int(info["num-other-sentinels"]) < len(self.sentinels) - 1:
                return False
            if not sentinels_see_replicas:
                continue
            reps = [dict(zip(r[::2], r[1::2], strict=True))
                    for r in s.call("SENTINEL", "REPLICAS", self.service)]
            good = {int(r["port"]) for r in reps
                    if r["flags"] == "slave" and r.get("master-link-status") == "ok"
                    and int(r.get("master-port", 0)) == master.port}
            if not {n.port for n in others} <= good:
                return False
        return True

    def wait_ready(self, timeout: float = TOPOLOGY_TIMEOUT, sentinels_see_replicas: bool = True) -> float:
        """Until every sentinel names the same master, which is a master with every other live
        data node online as its replica, and (unless ``sentinels_see_replicas=False``) every
        sentinel sees those replicas linked to it. After a failover the sentinels learn the
        replicas' new links from INFO, which they refresh only every 10 s: pass False there
        unless the next step (another SENTINEL FAILOVER) needs the sentinels' view."""
        t0 = time.monotonic()
        self._marker_offset = None
        wait_until(lambda: self._ready(sentinels_see_replicas), timeout, what="sentinel group ready", interval=POLL, ignore=TRANSIENT)
        return time.monotonic() - t0

    def wait_for_master(self, node: Node, timeout: float = TOPOLOGY_TIMEOUT) -> float:
        """Until every reachable sentinel names ``node`` as the master (the sentinel that ran a
        failover publishes ``+switch-master`` first; the others learn it from its hello
        messages, within about 2 s). Returns the seconds waited."""
        t0 = time.monotonic()
        wait_until(lambda: all(
            self.master(via=s).port == node.port for s in self.sentinels if s.reachable), timeout, what=f"every sentinel names {node}", interval=POLL, ignore=TRANSIENT)
        return time.monotonic() - t0

    def wait_replicas_online(self, n: int, timeout: float = TOPOLOGY_TIMEOUT) -> float:
        """Until the current master reports at least ``n`` replicas online (enough for
        ``min-replicas-to-write``). After a failover the remaining replicas are moved at once;
        a demoted old master follows only at the sentinels' next INFO of it (up to 10 s)."""
        t0 = time.monotonic()

        def online() -> bool:
            state = self.master().info("replication")
            return sum(1 for k, v in state.items() if k.startswith("slave") and "state=online" in v) >= n

        wait_until(online, timeout, what=f"{n} replicas online", interval=POLL, ignore=TRANSIENT)
        return time.monotonic() - t0

    def watch(self) -> SwitchWatcher:
        """Subscribe to ``+switch-master`` on every sentinel (use as a context manager)."""
        return SwitchWatcher(self.sentinels)

    def kill_master(self, sig: int = signal.SIGKILL) -> tuple[Node, float]:
        """Kill the current master; returns it and the monotonic time of the signal."""
        m = self.master()
        return m, m.kill(sig)

    def sentinel_failover(self) -> float:
        """``SENTINEL FAILOVER`` (no agreement needed); returns the monotonic time it was sent."""
        s = next(s for s in self.sentinels if s.reachable)
        t = time.monotonic()
        assert s.call("SENTINEL", "FAILOVER", self.service) == "OK"
        return t


# --- standalone servers for a client-side hash ring ----------------------------------------------


class Ring:
    """``n`` independent standalone servers (no replication between them)."""

    def __init__(self, n: int = 3, config: Sequence[str] = ()) -> None:
        self.nodes = [Node(config, name="ring") for _ in range(n)]

    @property
    def urls(self) -> list[str]:
        return [f"redis://{n.addr}/0" for n in self.nodes]

    def start(self) -> Ring:
        try:
            for n in self.nodes:
                n.start()
        except BaseException:
            self.cleanup()
            raise
        return self

    def flushall(self) -> None:
        for n in self.nodes:
            if n.reachable:
                n.call("FLUSHALL")

    def cleanup(self) -> None:
        for n in self.nodes:
            n.cleanup()


# --- fixtures ------------------------------------------------------------------------------------


@dataclass
class _Owned:
    """Topologies a factory fixture started; all are cleaned up by its finalizer."""

    items: list[Any] = field(default_factory=list)

    def add(self, t: Any) -> Any:
        self.items.append(t)
        return t

    def cleanup(self) -> None:
        while self.items:
            self.items.pop().cleanup()


@pytest.fixture(scope="session")
def redis_cluster_session() -> Iterator[Cluster]:
    """One 3-master + 3-replica cluster for the whole session; tests must not break it (use
    ``redis_cluster_factory`` for faults)."""
    c = Cluster()
    try:
        yield c.start()
    finally:
        c.cleanup()


@pytest.fixture
def redis_cluster(redis_cluster_session: Cluster) -> Cluster:
    """The shared cluster, checked healthy and flushed (data and scripts) before the test."""
    redis_cluster_session.check_healthy()
    redis_cluster_session.flushall()
    return redis_cluster_session


@pytest.fixture(scope="module")
def redis_cluster_factory() -> Iterator[Callable[..., Cluster]]:
    """``make(masters=3, replicas=1, tls=None, node_timeout_ms=2000, config=())`` starts a
    fresh cluster a test may break; every cluster made is killed when the module ends."""
    owned = _Owned()

    def make(masters: int = 3, replicas: int = 1, **kw: Any) -> Cluster:
        c: Cluster = owned.add(Cluster(masters, replicas, **kw))
        return c.start()

    try:
        yield make
    finally:
        owned.cleanup()


@pytest.fixture(scope="module")
def redis_sentinel_factory() -> Iterator[Callable[..., SentinelGroup]]:
    """``make(replicas=1, min_replicas_to_write=0, down_after_ms=1000, ...)`` starts a fresh
    Sentinel trio over a master and its replicas; all are killed when the module ends."""
    owned = _Owned()

    def make(replicas: int = 1, **kw: Any) -> SentinelGroup:
        g: SentinelGroup = owned.add(SentinelGroup(replicas, **kw))
        return g.start()

    try:
        yield make
    finally:
        owned.cleanup()


@pytest.fixture(scope="session")
def topology_certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory of make_certs.sh's certificates (ca, node, client, ...)."""
    _require("openssl")
    out = tmp_path_factory.mktemp("topology-certs")
    done = subprocess.run(["bash", str(MAKE_CERTS), str(out)], capture_output=True, text=True)
    assert done.returncode == 0, f"make_certs.sh failed:\n{done.stdout}\n{done.stderr}"
    return out


@pytest.fixture(scope="session")
def redis_tls_cluster_session(topology_certs: Path) -> Iterator[Cluster]:
    """3 TLS-only masters (``tls-cluster``, ``tls-replication``, ``tls-auth-clients yes``) with the
    ``node`` certificate; clients need ``ca.pem`` and a certificate (``client.pem``/``client.key``)."""
    tls = TlsFiles(topology_certs / "ca.pem", topology_certs / "node.pem", topology_certs / "node.key")
    c = Cluster(3, 0, tls=tls)
    try:
        yield c.start()
    finally:
        c.cleanup()


@pytest.fixture
def redis_tls_cluster(redis_tls_cluster_session: Cluster) -> Cluster:
    redis_tls_cluster_session.check_healthy()
    redis_tls_cluster_session.flushall()
    return redis_tls_cluster_session


@pytest.fixture(scope="session")
def redis_ring_session() -> Iterator[Ring]:
    r = Ring(3)
    try:
        yield r.start()
    finally:
        r.cleanup()


@pytest.fixture
def redis_ring(redis_ring_session: Ring) -> Ring:
    """Three standalone servers for a client-side hash ring, flushed before the test; a test
    that kills one restarts it (``node.start()``) or uses ``Ring(3).start()`` itself."""
    for n in redis_ring_session.nodes:
        if not n.alive:
            n.start()
    redis_ring_session.flushall()
    return redis_ring_session
