"""A fault-injecting TCP proxy for tests: it sits between redcount and a real redis-server on
loopback and, on request, misbehaves the way networks and servers do.

    with FaultProxy(server.port) as proxy:          # starts its thread; stops it at the end
        store = redcount.connect(proxy.url)
        proxy.stall()         # hold every byte, both ways, until proxy.heal()
        proxy.freeze()        # stop reading, both ways: the sender's socket buffer fills up
        proxy.split()         # forward each reply one byte per send()
        proxy.split(0.05)     # ...and one byte every 50 ms (a reply that trickles in)
        proxy.delay(0.05)     # forward every chunk 50 ms after it arrived
        proxy.reset()         # reset (RST) every open connection now
        proxy.drop_after_request()  # forward the next request, swallow its reply, close
        proxy.half_open()     # stop forwarding, discarding bytes, without closing
        proxy.refuse()        # reset new connections as soon as they are accepted
        proxy.heal()          # back to forwarding (half-open connections stay dead)
        proxy.commands()      # every complete command clients sent: [(b"INCR", b"k"), ...]

The proxy parses the client side of each connection as RESP commands, so a test can count
what reached it (``seen``) and what it passed on to the server (``forwarded``): a request
redcount resends shows up twice. One thread runs every connection with ``selectors``; the
methods above are thread-safe and take effect for bytes that arrive after them (and, for
``stall``/``half_open``, for bytes not yet forwarded). Test-only: no TLS, loopback only.
"""

from __future__ import annotations

import selectors
import socket
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from types import TracebackType

Command = tuple[bytes, ...]


class RespCommands:
    """Incremental parser of a client's RESP request stream (arrays of bulk strings, and
    inline commands); ``feed`` returns the complete commands the new bytes finished."""

    def __init__(self) -> None:
        self.buf = bytearray()

    def feed(self, data: bytes) -> list[Command]:
        self.buf += data
        out: list[Command] = []
        while True:
            parsed = self._one()
            if parsed is None:
                return out
            out.append(parsed)

    def _one(self) -> Command | None:
        buf = self.buf
        if not buf:
            return None
        end = buf.find(b"\r\n")
        if end < 0:
            return None
        if buf[:1] != b"*":  # an inline command
            line = bytes(buf[:end])
            del buf[: end + 2]
            return tuple(line.split())
        count = int(buf[1:end])
        pos = end + 2
        parts: list[bytes] = []
        for _ in range(count):
            end = buf.find(b"\r\n", pos)
            if end < 0:
                return None
            size = int(buf[pos + 1 : end])
            start = end + 2
            if len(buf) < start + size + 2:
                return None
            parts.append(bytes(buf[start : start + size]))
            pos = start + size + 2
        del buf[:pos]
        return tuple(parts)


@dataclass
class _Chunk:
    data: bytes
    due: float  # monotonic time from which it may be forwarded


@dataclass
class _Side:
    sock: socket.socket
    pending: list[_Chunk] = field(default_factory=list)  # bytes for this socket
    closed: bool = False
    reading: bool = True  # registered with the selector


@dataclass
class _Pair:
    client: _Side
    server: _Side
    parser: RespCommands = field(default_factory=RespCommands)
    blackholed: bool = False
    drop_armed: bool = False  # forward the request, then close when the reply comes
    dropping: bool = False  # the request went out: swallow the reply and close
    to_forward: list[Command] = field(default_factory=list)  # parsed, not yet sent on
    next_byte_at: float = 0.0  # split: when the next reply byte may go


class FaultProxy:
    """See the module docstring. ``upstream_port``: the redis-server's port on 127.0.0.1."""

    def __init__(self, upstream_port: int, upstream_host: str = "127.0.0.1", parse: bool = True) -> None:
        self.upstream = (upstream_host, upstream_port)
        self.parse = parse  # False for a stream that is not plain RESP (TLS): nothing is counted
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        # Small receive buffers (inherited by accepted sockets): freeze() fills them soon.
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(64)
        self._listener.setblocking(False)
        self.port: int = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._sel = selectors.DefaultSelector()
        self._pairs: list[_Pair] = []
        self._mode = "pass"  # pass | stall | half_open | refuse
        self._split = False
        self._split_interval = 0.0
        self._delay = 0.0
        self._drop_next = False
        self._seen: list[Command] = []
        self._forwarded: list[Command] = []
        self.accepted = 0
        self._stop = False
        self._calls: list[Callable[[], object]] = []
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._sel.register(self._listener, selectors.EVENT_READ, "listen")
        self._sel.register(self._wake_r, selectors.EVENT_READ, "wake")
        self._thread = threading.Thread(target=self._run, name=f"fault-proxy-{self.port}", daemon=True)

    # ------------------------------------------------------------------ control (any thread)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> FaultProxy:
        self._thread.start()
        return self

    def close(self) -> None:
        with self._lock:
            self._stop = True
        self._wake()
        self._thread.join(10)
        self._wake_r.close()
        self._wake_w.close()

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, t: type[BaseException] | None, e: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def heal(self) -> None:
        """Forward normally again (from now on; connections made half-open stay dead)."""
        self._set(mode="pass", split=False, split_interval=0.0, delay=0.0, drop_next=False)

    def stall(self) -> None:
        """Hold every byte in both directions, connections open, until :meth:`heal`."""
        self._set(mode="stall")

    def freeze(self) -> None:
        """Stop reading from either side until :meth:`heal`, as a peer that stopped
        acknowledging: a writer's socket buffer fills and its writes come up short."""
        self._set(mode="freeze")

    def split(self, interval: float = 0.0) -> None:
        """Forward server-to-client bytes one byte per ``send()``, the next one ``interval``
        seconds after the last."""
        self._set(split=True, split_interval=interval)

    def delay(self, seconds: float) -> None:
        """Forward every chunk, both ways, ``seconds`` after it arrived."""
        self._set(delay=seconds)

    def half_open(self) -> None:
        """Stop forwarding without closing: bytes in either direction are discarded, on open
        connections and on those accepted from now on. The connections stay dead after
        :meth:`heal` (what they carried is lost); new ones work again."""
        self._set(mode="half_open")

    def refuse(self) -> None:
        """Reset new connections as soon as they are accepted (until :meth:`heal`)."""
        self._set(mode="refuse")

    def drop_after_request(self) -> None:
        """The next request that arrives on any connection is forwarded; its reply is
        swallowed and both sides of that connection are closed (the request ran, the client
        never hears of it). Once."""
        self._set(drop_next=True)

    def reset(self) -> None:
        """Reset (RST) every open connection, both sides, now."""
        with self._lock:
            pairs = list(self._pairs)
        done = threading.Event()

        def reset_now() -> None:
            for p in pairs:
                self._close_pair(p, rst=True)
            done.set()

        self._call(reset_now)
        done.wait(5)

    def seen(self, name: bytes | None = None) -> list[Command]:
        """Complete commands that reached the proxy (``name``: only those, upper case)."""
        with self._lock:
            return [c for c in self._seen if name is None or (c and c[0].upper() == name)]

    def forwarded(self, name: bytes | None = None) -> list[Command]:
        """Complete commands the proxy passed on to the server."""
        with self._lock:
            return [c for c in self._forwarded if name is None or (c and c[0].upper() == name)]

    def open_connections(self) -> int:
        with self._lock:
            return sum(1 for p in self._pairs if not p.client.closed)

    # ------------------------------------------------------------------ the proxy's thread

    def _set(self, mode: str | None = None, split: bool | None = None, split_interval: float | None = None,
             delay: float | None = None, drop_next: bool | None = None) -> None:
        with self._lock:
            if mode is not None:
                self._mode = mode
                if mode == "half_open":
                    for p in self._pairs:
                        p.blackholed = True
            if split is not None:
                self._split = split
            if split_interval is not None:
                self._split_interval = split_interval
            if delay is not None:
                self._delay = delay
            if drop_next is not None:
                self._drop_next = drop_next
        self._wake()

    def _call(self, fn: Callable[[], object]) -> None:
        with self._lock:
            self._calls.append(fn)
        self._wake()

    def _wake(self) -> None:
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass

    def _run(self) -> None:
        try:
            while True:
                with self._lock:
                    if self._stop:
                        break
                    calls, self._calls = self._calls, []
                for fn in calls:
                    fn()
                self._pump()
                self._sync_interest()
                timeout = self._next_due()
                for key, events in self._sel.select(timeout):
                    tag = key.data
                    if tag == "listen":
                        self._accept()
                    elif tag == "wake":
                        try:
                            while self._wake_r.recv(4096):
                                pass
                        except BlockingIOError:
                            pass
                    else:
                        pair, side = tag
                        if events & selectors.EVENT_READ:
                            self._on_readable(pair, side)
        finally:
            for p in list(self._pairs):
                self._close_pair(p, rst=False)
            self._sel.close()
            self._listener.close()

    def _sync_interest(self) -> None:
        """Sockets are watched for reading except while frozen."""
        with self._lock:
            reading = self._mode != "freeze"
        for p in self._pairs:
            for name, side in (("client", p.client), ("server", p.server)):
                if side.closed or side.reading == reading:
                    continue
                if reading:
                    self._sel.register(side.sock, selectors.EVENT_READ, (p, name))
                else:
                    self._sel.unregister(side.sock)
                side.reading = reading

    def _next_due(self) -> float | None:
        now = time.monotonic()
        due: float | None = None
        with self._lock:
            held = self._mode in ("stall", "freeze")
            split = self._split
        for p in self._pairs:
            for side in (p.client, p.server):
                if side.closed or not side.pending:
                    continue
                if held:
                    continue
                if split and side is p.client:
                    d = max(p.next_byte_at - now, 0.0)  # a byte per pass
                    due = d if due is None else min(due, d)
                    continue
                d = max(side.pending[0].due - now, 0.0005)  # due: the socket was full
                due = d if due is None else min(due, d)
        return due

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except BlockingIOError:
                return
            with self._lock:
                mode = self._mode
            self.accepted += 1
            if mode == "refuse":
                _rst(conn)
                continue
            try:
                up = socket.create_connection(self.upstream, timeout=2)
            except OSError:
                _rst(conn)
                continue
            for s in (conn, up):
                s.setblocking(False)
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            pair = _Pair(_Side(conn), _Side(up), blackholed=mode == "half_open")
            with self._lock:
                self._pairs.append(pair)
            self._sel.register(conn, selectors.EVENT_READ, (pair, "client"))
            self._sel.register(up, selectors.EVENT_READ, (pair, "server"))

    def _on_readable(self, pair: _Pair, side: str) -> None:
        src = pair.client if side == "client" else pair.server
        dst = pair.server if side == "client" else pair.client
        try:
            data = src.sock.recv(65536)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self._close_pair(pair, rst=False)
            return
        with self._lock:
            delay = self._delay
            if side == "client":
                commands = pair.parser.feed(data) if self.parse else [(b"?",)]
                self._seen.extend(commands)
                if self._drop_next and commands and not pair.blackholed:
                    self._drop_next = False
                    pair.drop_armed = True
            if pair.blackholed:
                return  # discarded: a peer that is gone without a word
            if side == "client":
                pair.to_forward.extend(commands)  # counted as forwarded when sent on (_pump)
        if side == "server" and pair.dropping:
            self._close_pair(pair, rst=False)  # the reply is swallowed: the client never sees it
            return
        dst.pending.append(_Chunk(data, time.monotonic() + delay))

    def _pump(self) -> None:
        now = time.monotonic()
        with self._lock:
            mode, split, interval = self._mode, self._split, self._split_interval
        for pair in list(self._pairs):
            if pair.client.closed:
                continue
            if pair.blackholed:
                pair.client.pending.clear()
                pair.server.pending.clear()
                continue
            if mode in ("stall", "freeze"):
                continue
            # Client to server.
            wrote_request = False
            while pair.server.pending and pair.server.pending[0].due <= now:
                chunk = pair.server.pending[0]
                try:
                    n = pair.server.sock.send(chunk.data)
                except BlockingIOError:
                    break
                except OSError:
                    self._close_pair(pair, rst=False)
                    break
                wrote_request = True
                if n < len(chunk.data):
                    chunk.data = chunk.data[n:]
                    break
                pair.server.pending.pop(0)
            if pair.client.closed:
                continue
            if wrote_request and not pair.server.pending:
                with self._lock:
                    self._forwarded.extend(pair.to_forward)
                    pair.to_forward.clear()
                if pair.drop_armed:
                    pair.drop_armed = False
                    pair.dropping = True
            # Server to client.
            while (pair.client.pending and pair.client.pending[0].due <= now
                   and (not split or pair.next_byte_at <= now)):
                chunk = pair.client.pending[0]
                try:
                    data = chunk.data[:1] if split else chunk.data
                    n = pair.client.sock.send(data)
                    if n < len(chunk.data):
                        chunk.data = chunk.data[n:]
                    else:
                        pair.client.pending.pop(0)
                    if split:
                        pair.next_byte_at = now + interval
                        break  # one byte per pass, each its own segment
                    if n < len(data):
                        break
                except BlockingIOError:
                    break
                except OSError:
                    self._close_pair(pair, rst=False)
                    break

    def _close_pair(self, pair: _Pair, rst: bool) -> None:
        for side in (pair.client, pair.server):
            if side.closed:
                continue
            side.closed = True
            if side.reading:
                self._sel.unregister(side.sock)
            if rst:
                _rst(side.sock)
            else:
                side.sock.close()
        with self._lock:
            if pair in self._pairs:
                self._pairs.remove(pair)


def _rst(sock: socket.socket) -> None:
    """Close with a reset instead of a FIN (SO_LINGER with a zero timeout)."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except OSError:
        pass
    sock.close()
