"""Client identity: the socket peer by default; forwarding headers only from trusted proxies."""

from __future__ import annotations

import pytest
import redcount
from redcount.web import ClientIdentity, TrustedProxies
from redcount.web.identity import parse_forwarded_for, parse_x_forwarded_for


def test_default_is_the_peer_and_headers_change_nothing() -> None:
    who = ClientIdentity()
    assert who.header is None
    assert who.resolve("198.51.100.7") == "198.51.100.7"
    # A spoofed header from an untrusted peer: ignored entirely.
    assert who.resolve("198.51.100.7", ["1.2.3.4"]) == "198.51.100.7"


def test_count_takes_the_nth_hop_from_the_right() -> None:
    one = ClientIdentity(TrustedProxies(1))
    assert one.resolve("10.0.0.1", ["203.0.113.9"]) == "203.0.113.9"
    # The client prepended a fake address; the proxy appended the real one.
    assert one.resolve("10.0.0.1", ["6.6.6.6, 203.0.113.9"]) == "203.0.113.9"
    two = ClientIdentity(TrustedProxies(2))
    assert two.resolve("10.0.0.2", ["6.6.6.6, 203.0.113.9, 10.0.0.1"]) == "203.0.113.9"
    # Fewer hops than proxies: the request did not come through them; use the peer.
    assert two.resolve("10.0.0.2", ["203.0.113.9"]) == "10.0.0.2"
    # Several header fields are one list.
    assert two.resolve("10.0.0.2", ["6.6.6.6", "203.0.113.9, 10.0.0.1"]) == "203.0.113.9"


def test_cidrs_trust_only_peers_inside_them() -> None:
    who = ClientIdentity(TrustedProxies(cidrs=["10.0.0.0/8", "fd00::/8"]))
    assert who.resolve("10.1.2.3", ["203.0.113.9"]) == "203.0.113.9"
    # An untrusted peer sending the header: spoofing changes nothing.
    assert who.resolve("198.51.100.7", ["203.0.113.9"]) == "198.51.100.7"
    # Walk from the right past trusted hops; a spoofed left part is never reached.
    assert who.resolve("10.1.2.3", ["6.6.6.6, 203.0.113.9, 10.9.9.9"]) == "203.0.113.9"
    # Every hop trusted: the leftmost one.
    assert who.resolve("10.1.2.3", ["10.5.5.5, 10.9.9.9"]) == "10.5.5.5"
    # Garbage ends the walk at the last trusted hop.
    assert who.resolve("10.1.2.3", ["203.0.113.9, garbage"]) == "10.1.2.3"
    assert who.resolve("fd00::1", ["2001:db8::5"]) == "2001:db8::5"


def test_forwarded_header_rfc7239() -> None:
    assert parse_forwarded_for(['for=192.0.2.60;proto=http;by=203.0.113.43, for="[2001:db8:cafe::17]:4711"']) == [
        "192.0.2.60",
        '"[2001:db8:cafe::17]:4711"',
    ]
    who = ClientIdentity(TrustedProxies(cidrs=["10.0.0.0/8"], header="forwarded"))
    assert who.header == "forwarded"
    assert who.resolve("10.0.0.1", ['for="[2001:db8:cafe::17]:4711"']) == "2001:db8:cafe::17"
    assert who.resolve("10.0.0.1", ["for=192.0.2.60:8080;proto=https"]) == "192.0.2.60"
    # An element without for= is an unknown hop: with a count of 1 it yields the peer.
    assert ClientIdentity(TrustedProxies(1, header="forwarded")).resolve("10.0.0.1", ["proto=https"]) == "10.0.0.1"


def test_x_forwarded_for_forms() -> None:
    assert parse_x_forwarded_for(["a, b", " c "]) == ["a", "b", "c"]
    who = ClientIdentity(TrustedProxies(1))
    assert who.resolve("10.0.0.1", ["203.0.113.9:5555"]) == "203.0.113.9"
    assert who.resolve("10.0.0.1", ["[2001:db8::1]:443"]) == "2001:db8::1"
    assert who.resolve("10.0.0.1", ["::ffff:203.0.113.9"]) == "203.0.113.9"
    assert who.resolve("10.0.0.1", ["not-an-ip"]) == "10.0.0.1"


def test_ipv6_grouping() -> None:
    who = ClientIdentity(ipv6_prefix=64)
    a = who.resolve("2001:db8:1:2:aaaa::1")
    b = who.resolve("2001:db8:1:2:bbbb::2")
    c = who.resolve("2001:db8:1:3::1")
    assert a == b == "2001:db8:1:2::/64"
    assert c != a
    assert who.resolve("203.0.113.9") == "203.0.113.9"  # IPv4 untouched
    assert ClientIdentity().resolve("2001:db8:1:2:aaaa::1") == "2001:db8:1:2:aaaa::1"


def test_non_ip_peers() -> None:
    who = ClientIdentity()
    assert who.resolve(None) == "unknown"
    assert who.resolve("testclient") == "testclient"


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"cidrs": ["10.0.0.0/33"]}, "malformed trusted proxy CIDR '10.0.0.0/33'"),
        ({"cidrs": ["10.0.0.1/8"]}, "malformed trusted proxy CIDR '10.0.0.1/8'"),
        ({"cidrs": ["nonsense"]}, "malformed trusted proxy CIDR 'nonsense'"),
        ({"cidrs": []}, "cidrs is empty"),
        ({"count": 0}, "count must be an int >= 1"),
        ({"count": 1, "cidrs": ["10.0.0.0/8"]}, "either count=N or cidrs"),
        ({}, "either count=N or cidrs"),
        ({"count": 1, "header": "x-real-ip"}, "header must be"),
    ],
)
def test_bad_trusted_proxy_config_is_refused_at_start(kwargs: dict[str, object], needle: str) -> None:
    with pytest.raises(redcount.InvalidInputError, match=needle.replace("(", r"\(").replace("[", r"\[")):
        TrustedProxies(**kwargs)  # type: ignore[arg-type]


def test_coerce_and_bad_prefix() -> None:
    assert TrustedProxies.coerce(None) is None
    assert TrustedProxies.coerce(0) is None
    c = TrustedProxies.coerce(2)
    assert c is not None and c.count == 2
    c = TrustedProxies.coerce("10.0.0.0/8, 192.168.0.0/16")
    assert c is not None and len(c.networks) == 2
    c = TrustedProxies.coerce("1")
    assert c is not None and c.count == 1
    with pytest.raises(redcount.InvalidInputError, match="malformed"):
        TrustedProxies.coerce(["10.0.0.0/8", "bad"])
    with pytest.raises(redcount.InvalidInputError, match="ipv6_prefix"):
        ClientIdentity(ipv6_prefix=0)
    with pytest.raises(redcount.InvalidInputError, match="ipv6_prefix"):
        ClientIdentity(ipv6_prefix=129)
