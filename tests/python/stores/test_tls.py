"""TLS: ``rediss://`` URLs, the ``ssl_*`` keywords of :func:`redcount.connect`, the
``ssl_cert_reqs="none"`` warning, and end-to-end counters and limiters over TLS against
redis-servers this module starts with certificates it generates (tests/tls/make_certs.sh,
the openssl CLI: SANs for localhost and 127.0.0.1, a second CA, an expired certificate,
one for another name, client certificates).
"""

from __future__ import annotations

import shutil
import ssl
import subprocess
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redcount
from conftest import REDIS_SERVER as SERVER_BINARY
from conftest import RedisServer
from redcount.tools.servers import Tls

pytestmark = pytest.mark.tls

MAKE_CERTS = Path(__file__).resolve().parents[2] / "tls" / "make_certs.sh"
REDIS_SERVER = shutil.which(SERVER_BINARY)


# --- certificates and TLS servers ------------------------------------------------------------


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if shutil.which("openssl") is None:
        pytest.fail("the openssl CLI is needed to make test certificates (apt-get install openssl)", pytrace=False)
    out = tmp_path_factory.mktemp("tls-certs")
    done = subprocess.run(["bash", str(MAKE_CERTS), str(out)], capture_output=True, text=True)
    assert done.returncode == 0, f"make_certs.sh failed:\n{done.stdout}\n{done.stderr}"
    return out


def tls_server(certs: Path, cert: str = "server", auth_clients: str = "no") -> RedisServer:
    """A redis-server that speaks only TLS with one of the generated server certificates; its
    readiness PING presents the client certificate (for the servers that require one)."""
    if REDIS_SERVER is None:
        pytest.fail(f"{SERVER_BINARY!r} not found on PATH (apt-get install redis-server)", pytrace=False)
    files = Tls(
        cert=str(certs / f"{cert}.pem"),
        key=str(certs / f"{cert}.key"),
        ca=str(certs / "ca.pem"),
        auth_clients=auth_clients,
        client_cert=str(certs / "client.pem"),
        client_key=str(certs / "client.key"),
    )
    return RedisServer(REDIS_SERVER, tls=files).start()


def url_of(server: RedisServer, host: str = "localhost") -> str:
    """The server's URL through ``host`` (the certificates name localhost and 127.0.0.1)."""
    return f"rediss://{host}:{server.port}/0"


class TlsServers:
    """The module's TLS servers, each started on first use."""

    KINDS = {
        "server": ("server", "optional"),  # a client certificate is verified if sent
        "mtls": ("server", "yes"),  # a client certificate is required
        "expired": ("expired", "no"),
        "wrongname": ("wrongname", "no"),  # names redis.invalid only
    }

    def __init__(self, certs: Path) -> None:
        self.certs = certs
        self.running: dict[str, RedisServer] = {}

    def __getitem__(self, kind: str) -> RedisServer:
        if kind not in self.running:
            cert, auth = self.KINDS[kind]
            self.running[kind] = tls_server(self.certs, cert, auth)
        return self.running[kind]

    def cleanup(self) -> None:
        for s in self.running.values():
            s.cleanup()


@pytest.fixture(scope="module")
def tls(certs: Path) -> Iterator[TlsServers]:
    servers = TlsServers(certs)
    try:
        yield servers
    finally:
        servers.cleanup()


# --- URLs and keywords (run today) ---------------------------------------------------------------

TLS_KEYWORDS: list[tuple[str, object]] = [
    ("ssl_ca_certs", "/etc/ssl/ca.pem"),
    ("ssl_certfile", "/etc/ssl/client.pem"),
    ("ssl_keyfile", "/etc/ssl/client.key"),
    ("ssl_cert_reqs", "required"),
    ("ssl_check_hostname", True),
    ("ssl_server_name", "redis.example"),
]


@pytest.mark.parametrize("url", ["redis://127.0.0.1:6379/0", "unix:///tmp/redis.sock", "memory://", None])
@pytest.mark.parametrize(("name", "value"), TLS_KEYWORDS)
def test_tls_keywords_need_a_rediss_url(url: str | None, name: str, value: object) -> None:
    with pytest.raises(redcount.InvalidInputError, match=f"{name} applies to TLS connections only: use a rediss:// URL"):
        redcount.connect(url, **{name: value})


@pytest.mark.parametrize("url", [
    "redis://127.0.0.1:6379/0?ssl_ca_certs=/ca.pem",
    "redis://127.0.0.1/0?ssl_cert_reqs=none",
    "unix:///tmp/redis.sock?ssl_certfile=/c.pem",
])
def test_tls_query_parameters_need_a_rediss_url(url: str) -> None:
    with pytest.raises(ValueError, match="applies to TLS connections only: use a rediss:// URL"):
        redcount.connect(url)


@pytest.mark.parametrize(("url", "match"), [
    ("rediss://h?ssl_verify=none", r"unknown query parameter 'ssl_verify' \(rediss:// accepts ssl_ca_certs"),
    ("redis://h?timeout=3", "unknown query parameter 'timeout'"),
    ("redis://h?db=3", r"the database goes in the path \(redis://host:port/N\)"),
    ("rediss://h?ssl_cert_reqs=maybe", "ssl_cert_reqs must be required, optional or none"),
    ("rediss://h?ssl_check_hostname=yes", "ssl_check_hostname must be true, false, 1 or 0"),
    ("rediss://h?ssl_ca_certs=/a&ssl_ca_certs=/b", "'ssl_ca_certs' is given twice"),
    ("rediss://h?ssl_ca_certs=", "ssl_ca_certs must not be empty"),
    ("rediss://h?ssl_ca_certs=%zz", "bad %-escape in query parameter 'ssl_ca_certs'"),
    ("rediss://h?ssl_certfile=/home/a@b/c.pem", "percent-encode"),
    ("unix:///tmp/r.sock?timeout=1", r"unknown query parameter 'timeout' \(unix:// takes db=N\)"),
])
def test_bad_tls_urls(url: str, match: str) -> None:
    with pytest.raises(redcount.InvalidInputError, match=match) as info:
        redcount.connect(url)
    assert "expected memory://" in str(info.value)


@pytest.mark.parametrize("option", ["ssl_cert_reqs", "ssl_check_hostname", "ssl_server_name"])
def test_a_rejected_tls_value_is_never_repeated(option: str) -> None:
    # A query value may be a secret pasted into the wrong parameter: the error names the
    # parameter and what it accepts, never the value (in the message or in the URL shown).
    with pytest.raises(redcount.InvalidInputError, match=option) as info:
        redcount.connect(f"rediss://h:6380/0?{option}=s3cr%2Ft%20value")
    assert "s3cr" not in str(info.value)


@pytest.mark.parametrize(("kwargs", "error", "match"), [
    ({"ssl_cert_reqs": "maybe"}, redcount.InvalidInputError, "ssl_cert_reqs must be required, optional or none"),
    ({"ssl_ca_certs": ""}, redcount.InvalidInputError, "ssl_ca_certs must not be empty"),
    ({"ssl_server_name": "a/b"}, redcount.InvalidInputError, "ssl_server_name must be a host name"),
    ({"ssl_check_hostname": "yes"}, TypeError, "ssl_check_hostname must be a bool, got str"),
    ({"ssl_cert_reqs": 0}, TypeError, "ssl_cert_reqs must be a str or ssl.VerifyMode, got int"),
    ({"ssl_ca_certs": 3}, TypeError, r"ssl_ca_certs must be a path \(str or os.PathLike\), got int"),
    ({"ssl_certfile": b"/c.pem"}, TypeError, "ssl_certfile must be a path"),
    ({"ssl_server_name": 1}, TypeError, "ssl_server_name must be a str, got int"),
])
def test_bad_tls_keywords(kwargs: dict[str, Any], error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        redcount.connect("rediss://127.0.0.1:6380/0", **kwargs)


@pytest.mark.parametrize("url", [
    "unix:///tmp/redis.sock?password=hunter2secret",
    "unix:///tmp/redis.sock?db=x&password=hunter2secret",
    "rediss://:hunter2secret@h?ssl_verify=1",
    "rediss://:hunter2?secret@h:6380",
    "rediss://h?nope=hunter2secret",
])
def test_url_errors_never_echo_secrets(url: str) -> None:
    with pytest.raises(redcount.InvalidInputError) as info:
        redcount.connect(url)
    assert "hunter2" not in str(info.value)
    assert "secret" not in str(info.value)


def test_good_tls_urls_and_keywords_pass_validation(certs: Path) -> None:
    # Up to the point where a store opens: the engine's tests below go further.
    for url, kwargs in [
        ("rediss://localhost:6380/0", {}),
        ("rediss://127.0.0.1:6380", {"ssl_ca_certs": certs / "ca.pem"}),
        ("rediss://[::1]:6380/3?ssl_check_hostname=false", {}),
        (f"rediss://localhost:6380/0?ssl_ca_certs={certs / 'ca.pem'}&ssl_cert_reqs=optional", {}),
        ("rediss://localhost:6380/0", {"ssl_cert_reqs": ssl.CERT_REQUIRED, "ssl_server_name": "redis.example"}),
    ]:
        try:
            store = redcount.connect(url, connect_timeout=0.2, command_timeout=0.2, **kwargs)
        except redcount.ConnectionError:
            continue  # a store that connects at once: nothing listens there, which is fine here
        store.close()


@pytest.mark.parametrize(("url", "kwargs"), [
    ("rediss://localhost:{port}/0?ssl_cert_reqs=none", {}),
    ("rediss://localhost:{port}/0", {"ssl_cert_reqs": "none"}),
    ("rediss://localhost:{port}/0", {"ssl_cert_reqs": ssl.CERT_NONE}),
    ("rediss://localhost:{port}/0?ssl_cert_reqs=required", {"ssl_cert_reqs": "NONE"}),  # the keyword wins
])
def test_cert_reqs_none_warns_once_at_connect(tls: TlsServers, url: str, kwargs: dict[str, Any]) -> None:
    with pytest.warns(redcount.SecurityWarning, match="ssl_cert_reqs='none'") as record:
        store = redcount.connect(url.format(port=tls["wrongname"].port), **kwargs)
    assert len(record) == 1
    assert record[0].filename == __file__  # points at the caller, not into redcount
    assert issubclass(redcount.SecurityWarning, UserWarning)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # and not again on use
        assert store.ping()
    store.close()


def test_a_keyword_overrides_the_query(tls: TlsServers, certs: Path) -> None:
    # The URL says none, the keyword required: no warning (the suite turns warnings into
    # errors), and verification happens.
    url = f"rediss://localhost:{tls['server'].port}/0?ssl_cert_reqs=none&ssl_ca_certs=/nonexistent.pem"
    store = redcount.connect(url, ssl_cert_reqs="required", ssl_ca_certs=str(certs / "ca.pem"))
    assert store.ping()
    store.close()


# --- end to end over TLS (the engine) --------------------------------------------------------------


def _open(url: str, **kwargs: Any) -> redcount.Store:
    kwargs.setdefault("connect_timeout", 5.0)
    kwargs.setdefault("command_timeout", 5.0)
    return redcount.connect(url, **kwargs)


@pytest.mark.parametrize("host", ["localhost", "127.0.0.1"])
def test_counters_and_limiter_over_tls(tls: TlsServers, certs: Path, host: str) -> None:
    store = _open(url_of(tls["server"], host), ssl_ca_certs=certs / "ca.pem")
    try:
        store.execute("FLUSHALL")
        views = redcount.FixedWindowCounter(store, "tls-views", window=3600)
        for _ in range(5):
            views.incr("page")
        assert views.get("page") == 5
        limiter = redcount.Limiter(store, "sliding-window")
        decisions = [bool(limiter.hit("3/minute", "tls-user")) for _ in range(5)]
        assert decisions == [True, True, True, False, False]
    finally:
        store.close()


def test_large_values_over_tls(tls: TlsServers, certs: Path) -> None:
    store = _open(url_of(tls["server"]), ssl_ca_certs=str(certs / "ca.pem"))
    try:
        value = bytes(range(256)) * (4 * 4096)  # 4 MiB: many TLS records and partial writes
        assert store.execute("SET", "tls:big", value) == "OK"
        assert store.execute("GET", "tls:big") == value
    finally:
        store.close()


def test_mutual_tls(tls: TlsServers, certs: Path) -> None:
    url = f"{url_of(tls['mtls'])}?ssl_certfile={certs / 'client.pem'}&ssl_keyfile={certs / 'client.key'}"
    store = _open(url, ssl_ca_certs=certs / "ca.pem")
    try:
        assert store.ping()
    finally:
        store.close()


@pytest.mark.parametrize(("server", "ca", "kwargs", "causes"), [
    ("server", "other-ca.pem", {}, ["certificate verify failed", "ssl_ca_certs"]),
    ("expired", "ca.pem", {}, ["certificate verify failed: certificate has expired", "2020"]),
    ("wrongname", "ca.pem", {}, ["hostname mismatch", "'localhost'", "redis.invalid"]),
    ("mtls", "ca.pem", {}, ["requires a client certificate", "ssl_certfile and ssl_keyfile"]),
    ("mtls", "ca.pem", {"ssl_certfile": "other-client.pem", "ssl_keyfile": "other-client.key"},
     ["the server refused our client certificate"]),
])
def test_failures_name_their_cause(
    tls: TlsServers, certs: Path, server: str, ca: str, kwargs: dict[str, str], causes: list[str]
) -> None:
    files = {k: str(certs / v) for k, v in kwargs.items()}
    store = None
    with pytest.raises(redcount.ConnectionError) as info:
        store = _open(url_of(tls[server]), ssl_ca_certs=certs / ca, **files)
        store.ping()
    if store is not None:
        store.close()
    for cause in causes:
        assert cause in str(info.value)


def test_cert_reqs_none_accepts_an_untrusted_certificate(tls: TlsServers, certs: Path) -> None:
    with pytest.warns(redcount.SecurityWarning):
        store = _open(url_of(tls["wrongname"]), ssl_ca_certs=certs / "other-ca.pem", ssl_cert_reqs="none")
    try:
        assert store.ping()
    finally:
        store.close()


def test_a_hostname_mismatch_can_be_resolved_by_server_name_or_turned_off(tls: TlsServers, certs: Path) -> None:
    for kwargs in ({"ssl_server_name": "redis.invalid"}, {"ssl_check_hostname": False}):
        store = _open(url_of(tls["wrongname"], "127.0.0.1"), ssl_ca_certs=certs / "ca.pem", **kwargs)
        try:
            assert store.ping()
        finally:
            store.close()


def test_a_plain_text_port_fails_clearly(redis_server: RedisServer, certs: Path) -> None:
    # A plain redis-server never answers a TLS ClientHello: the connect deadline ends it.
    with pytest.raises(redcount.ConnectionError):
        store = _open(f"rediss://localhost:{redis_server.port}/0", ssl_ca_certs=certs / "ca.pem",
                      connect_timeout=0.5, command_timeout=0.5)
        store.ping()


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"ssl_ca_certs": "/nonexistent/ca.pem"}, "cannot read ssl_ca_certs '/nonexistent/ca.pem'"),
    ({"ssl_ca_certs": "{certs}/ca.pem", "ssl_certfile": "{certs}/client.pem", "ssl_keyfile": "{certs}/other-client.key"},
     "does not match the certificate in ssl_certfile"),
])
def test_bad_certificate_files_are_named(tls: TlsServers, certs: Path, kwargs: dict[str, str], match: str) -> None:
    files = {k: v.format(certs=certs) for k, v in kwargs.items()}
    with pytest.raises(redcount.InvalidInputError, match=match):
        store = _open(url_of(tls["server"]), **files)
        store.ping()
