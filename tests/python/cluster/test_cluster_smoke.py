"""A quick check of redcount on a real 3-master Redis Cluster that this module starts itself.

Counters, a limiter and a sharded counter with request ids run across the masters through
``redcount.connect("redis+cluster://...")``; a batch over 200 keys is split per node and
its replies come back in order; a script call whose keys span slots is refused before
anything is sent; what is about one node goes through ``Store.nodes()``.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import redcount
import redcount.aio as aio

pytestmark = pytest.mark.skipif(
    shutil.which("redis-server") is None or shutil.which("redis-cli") is None,
    reason="redis-server and redis-cli are needed to start a cluster",
)


def _free_ports(n: int) -> list[int]:
    # The cluster bus listens on port + 10000: both must be free.
    ports: list[int] = []
    while len(ports) < n:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port + 10000 > 65535 or port in ports:
            continue
        with socket.socket() as bus:
            try:
                bus.bind(("127.0.0.1", port + 10000))
            except OSError:
                continue
        ports.append(port)
    return ports


def _cli(port: int, *args: str) -> str:
    return subprocess.run(
        ["redis-cli", "-p", str(port), *args], capture_output=True, text=True, timeout=10, check=False
    ).stdout


def _poll(what: str, ok: Callable[[], bool], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if ok():
            return
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def _start_cluster(
    tmp: Path, tls: Path | None, replicas: int = 0
) -> tuple[list[int], list[subprocess.Popen[bytes]]]:
    ports = _free_ports(3 * (1 + replicas))
    procs: list[subprocess.Popen[bytes]] = []
    tls_args: list[str] = []
    cli_tls: list[str] = []
    if tls is not None:
        tls_args = [
            "--tls-cert-file", str(tls / "node.pem"), "--tls-key-file", str(tls / "node.key"),
            "--tls-ca-cert-file", str(tls / "ca.pem"), "--tls-cluster", "yes", "--tls-auth-clients", "no",
        ]
        cli_tls = ["--tls", "--cacert", str(tls / "ca.pem")]
    for port in ports:
        d = tmp / str(port)
        d.mkdir()
        listen = ["--port", "0", "--tls-port", str(port)] if tls is not None else ["--port", str(port)]
        procs.append(
            subprocess.Popen(
                [
                    "redis-server", *listen, "--bind", "127.0.0.1", *tls_args,
                    "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                    "--cluster-node-timeout", "2000", "--save", "", "--appendonly", "no",
                    "--repl-diskless-sync-delay", "0",
                    "--dir", str(d),
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        )
    def answers(port: int, *args: str, expect: str) -> Callable[[], bool]:
        return lambda: expect in _cli(port, *cli_tls, *args)

    for port in ports:
        _poll(f"redis-server on {port}", answers(port, "PING", expect="PONG"))
    created = subprocess.run(
        ["redis-cli", *cli_tls, "--cluster", "create", *[f"127.0.0.1:{p}" for p in ports],
         "--cluster-replicas", str(replicas), "--cluster-yes"],
        capture_output=True, text=True, timeout=60, check=False,
    )
    assert created.returncode == 0, created.stdout + created.stderr
    for port in ports:
        _poll("cluster_state:ok", answers(port, "CLUSTER", "INFO", expect="cluster_state:ok"))
    return ports, procs


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        p.kill()
    for p in procs:
        p.wait(timeout=10)


@pytest.fixture(scope="module")
def cluster_url() -> Iterator[str]:
    tmp = Path(tempfile.mkdtemp(prefix="redcount-cluster-"))
    procs: list[subprocess.Popen[bytes]] = []
    try:
        ports, procs = _start_cluster(tmp, None)
        yield "redis+cluster://" + ",".join(f"127.0.0.1:{p}" for p in ports[:2])
    finally:
        _stop(procs)
        shutil.rmtree(tmp, ignore_errors=True)


def _node_certificate(d: Path) -> None:
    # The test CA from tests/tls/make_certs.sh, and a node leaf for 127.0.0.1 that the
    # cluster bus may also present as a client certificate (serverAuth and clientAuth).
    make = Path(__file__).resolve().parents[2] / "tls" / "make_certs.sh"
    subprocess.run(["bash", str(make), str(d)], check=True, capture_output=True, timeout=120)

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True, cwd=d, timeout=60)

    openssl("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", "node.key")
    openssl("req", "-new", "-key", "node.key", "-subj", "/CN=node", "-out", "node.csr")
    (d / "node.ext").write_text(
        "basicConstraints=CA:FALSE\nsubjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth,clientAuth\n"
    )
    openssl("x509", "-req", "-in", "node.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
            "-sha256", "-days", "30", "-extfile", "node.ext", "-out", "node.pem")


@pytest.fixture
def store(cluster_url: str) -> Iterator[redcount.Store]:
    s = redcount.connect(cluster_url)
    yield s
    s.close()


def _keys_per_node(store: redcount.Store) -> list[int]:
    sizes = [n.execute("DBSIZE") for n in store.nodes()]
    assert all(isinstance(n, int) for n in sizes)
    return [int(n) for n in sizes if isinstance(n, int)]


def test_url_and_nodes(store: redcount.Store, cluster_url: str) -> None:
    assert store.url.startswith("redis+cluster://127.0.0.1:")
    nodes = store.nodes()
    assert len(nodes) == 3
    assert all(n.ping() for n in nodes)
    assert len({n.address for n in nodes}) == 3
    with pytest.raises(redcount.InvalidInputError, match="nodes"):
        store.execute("KEYS", "*")
    with pytest.raises(redcount.InvalidInputError, match="database 0"):
        redcount.connect(cluster_url + "/1")


def test_fixed_window_counter_incr_many_over_200_keys(store: redcount.Store) -> None:
    c = redcount.FixedWindowCounter(store, "smoke-fw", 60)
    amounts = {f"user-{i}": i % 7 + 1 for i in range(200)}
    before = _keys_per_node(store)
    got = c.incr_many(amounts)
    assert got == amounts  # every reply back at its own key
    after = _keys_per_node(store)
    assert all(b > a for a, b in zip(before, after)), (before, after)  # spread over every master
    assert c.incr("user-3", 2, request_id="r-1") == amounts["user-3"] + 2
    assert c.incr("user-3", 2, request_id="r-1") == amounts["user-3"] + 2  # counted once
    assert c.get_many(["user-0", "user-199"]) == {"user-0": 1, "user-199": 199 % 7 + 1}


def test_limiter(store: redcount.Store) -> None:
    lim = redcount.Limiter(store)
    for key in (f"client-{i}" for i in range(30)):
        decisions = [lim.hit("3/minute", key).allowed for _ in range(4)]
        assert decisions == [True, True, True, False]


def test_sharded_counter_with_request_ids(store: redcount.Store) -> None:
    c = redcount.ShardedCounter(store, "smoke-sharded", shards=16)
    for i in range(300):
        assert c.incr(2, request_id=f"req-{i}") is True
    for i in range(0, 300, 10):
        assert c.incr(2, request_id=f"req-{i}") is False  # a retry counts once
    assert c.value() == 600
    items = [(f"many-{i % 150 % 20}", 1, f"m-{i % 150}") for i in range(300)]  # every id twice
    got = c.incr_many(items)
    assert got == [True] * 150 + [False] * 150
    values = c.values([f"many-{i}" for i in range(20)])
    assert sum(values.values()) == 150


def test_cross_slot_script_is_refused_before_sending(store: redcount.Store) -> None:
    before = _keys_per_node(store)
    with pytest.raises(redcount.InvalidInputError, match="slot"):
        store.execute("EVAL", "redis.call('SET', KEYS[1], 1) redis.call('SET', KEYS[2], 1)", 2, "foo", "bar")
    assert _keys_per_node(store) == before
    assert store.execute("EVAL", "return redis.call('INCR', KEYS[1])", 1, "{t}foo") == 1


def test_batches_over_many_nodes_keep_their_order(store: redcount.Store) -> None:
    cmds: list[tuple[str | bytes | int | float, ...]] = []
    for i in range(100):
        cmds.append(("SET", f"order-{i}", str(i)))
        cmds.append(("GET", f"order-{i}"))
    replies = store.execute_many(cmds)
    assert replies[1::2] == [str(i).encode() for i in range(100)]
    assert all(r == "OK" for r in replies[0::2])


def test_a_forked_child_opens_its_own_connections(store: redcount.Store) -> None:
    store.execute("SET", "fork-key", "0")
    pid = os.fork()
    if pid == 0:  # the child: its own router and engines; the parent's are never touched
        try:
            ok = store.execute_many([("INCR", "fork-key"), ("INCR", "{x}other")])[0] == 1
        except BaseException:  # noqa: BLE001 - reported through the exit code
            ok = False
        os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert store.execute("INCR", "fork-key") == 2  # the parent keeps working


def test_asyncio_over_the_cluster(store: redcount.Store) -> None:
    astore = aio.AsyncStore(store)
    counter = aio.FixedWindowCounter(store, "smoke-aio", 60)
    limiter = aio.Limiter(store)

    async def main() -> None:
        assert await astore.ping() is True
        replies = await astore.execute_many([("INCRBY", f"aio-{i}", i) for i in range(1, 101)])
        assert replies == list(range(1, 101))
        counts = await asyncio.gather(*(counter.incr(f"k-{i}") for i in range(50)))
        assert counts == [1] * 50
        assert (await limiter.hit("2/minute", "aio-client")).allowed

    asyncio.run(main())


@pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl makes the certificates")
def test_tls_cluster_checks_each_node_certificate_against_its_address() -> None:
    tmp = Path(tempfile.mkdtemp(prefix="redcount-tls-cluster-"))
    procs: list[subprocess.Popen[bytes]] = []
    try:
        certs = tmp / "certs"
        _node_certificate(certs)
        ports, procs = _start_cluster(tmp, certs)
        url = f"rediss+cluster://127.0.0.1:{ports[0]}?ssl_ca_certs={certs / 'ca.pem'}"
        store = redcount.connect(url)
        assert store.execute_many([("INCR", f"tls-{i}") for i in range(30)]) == [1] * 30
        assert len(store.nodes()) == 3  # every node's certificate names its IP address
        store.close()
        wrong = redcount.connect(url + "&ssl_server_name=redis.invalid", breaker=False, command_timeout=1.0)
        with pytest.raises(redcount.ConnectionError, match="hostname mismatch"):
            wrong.execute("GET", "tls-1")
        wrong.close()
    finally:
        _stop(procs)
        shutil.rmtree(tmp, ignore_errors=True)


def _pid(node: redcount.Store) -> int:
    info = node.execute("INFO", "server")
    assert isinstance(info, bytes)
    lines = info.decode().splitlines()
    return int(next(line for line in lines if line.startswith("process_id:")).split(":")[1])


def test_a_killed_master_is_replaced_by_its_replica_within_the_deadline() -> None:
    tmp = Path(tempfile.mkdtemp(prefix="redcount-failover-"))
    procs: list[subprocess.Popen[bytes]] = []
    try:
        ports, procs = _start_cluster(tmp, None, replicas=1)
        store = redcount.connect(f"redis+cluster://127.0.0.1:{ports[0]}", command_timeout=20.0, breaker=False)
        key = "failover-key"
        assert store.execute("INCR", key) == 1
        masters = store.nodes()
        slot = masters[0].execute("CLUSTER", "KEYSLOT", key)
        assert isinstance(slot, int)
        owner = next(n for n in masters if n.execute("CLUSTER", "COUNTKEYSINSLOT", slot) == 1)
        pid = _pid(owner)
        os.kill(pid, signal.SIGKILL)
        next(p for p in procs if p.pid == pid).wait(10)  # its sockets are closed: nothing in flight
        t0 = time.monotonic()
        # Refused connections to the dead master: the router refreshes the table and sends
        # to the promoted replica once the cluster has failed over (node timeout 2 s).
        got = store.execute("INCR", key)
        took = time.monotonic() - t0
        assert got in (1, 2)  # 2 unless the replica had not received the first write
        assert took < 20.0
        after = store.nodes()
        assert len(after) == 3
        assert owner.address not in {n.address for n in after}
        store.close()
    finally:
        _stop(procs)
        shutil.rmtree(tmp, ignore_errors=True)


def test_a_node_lost_after_the_write_fails_only_its_requests(cluster_url: str) -> None:
    # Destructive (kills a master): the last test of the module.
    store = redcount.connect(cluster_url, command_timeout=5.0, breaker=False)
    nodes = store.nodes()
    pid = _pid(nodes[0])
    keys = [f"lost-{i}" for i in range(60)]
    store.execute_many([("SET", k, "0") for k in keys])  # connections to every node are open
    os.kill(pid, signal.SIGSTOP)  # it takes the write, then never answers
    result: list[BaseException] = []

    def call() -> None:
        try:
            store.execute_many([("INCR", k) for k in keys])
        except BaseException as e:  # noqa: BLE001 - handed to the test thread
            result.append(e)

    t = threading.Thread(target=call)
    t.start()
    time.sleep(0.3)
    os.kill(pid, signal.SIGKILL)
    t.join(10)
    assert not t.is_alive()
    assert len(result) == 1 and isinstance(result[0], redcount.ConnectionError), result
    err = result[0]
    assert err.maybe_applied is True
    assert err.outcomes is not None and len(err.outcomes) == len(keys)
    lost = {k for k, o in zip(keys, err.outcomes) if o == "maybe"}
    answered = [o for o in err.outcomes if o != "maybe"]
    assert lost and answered, err.outcomes
    assert all(o == 1 for o in answered)  # the other masters' requests completed
    store.close()
