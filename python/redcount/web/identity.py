"""Who the client is: the socket peer, or the address trusted proxies say they forwarded for.

The default key of every web integration is the socket peer address. ``X-Forwarded-For`` and
``Forwarded`` are read only when [`TrustedProxies`][redcount.web.identity.TrustedProxies] is configured, because any client
can send them: a limiter that believes them by default is bypassed by a client that sends a
new address with every request.

```python
from redcount.web import ClientIdentity, TrustedProxies

who = ClientIdentity(TrustedProxies(cidrs=["10.0.0.0/8"]), ipv6_prefix=64)
who.resolve("10.1.2.3", ["203.0.113.9, 10.1.2.4"])   # -> "203.0.113.9"
who.resolve("198.51.100.7", ["203.0.113.9"])          # untrusted peer -> "198.51.100.7"
```
"""

from __future__ import annotations

import functools
import ipaddress
from collections.abc import Iterable, Sequence
from typing import Literal, Union

from ..errors import InvalidInputError

__all__ = ["ClientIdentity", "TrustedProxies", "parse_forwarded_for", "parse_x_forwarded_for"]

IPAddress = Union[ipaddress.IPv4Address, ipaddress.IPv6Address]
IPNetwork = Union[ipaddress.IPv4Network, ipaddress.IPv6Network]
Header = Literal["x-forwarded-for", "forwarded"]

# A proxy chain longer than this is not a proxy chain; it only costs us parsing time.
_MAX_HOPS = 32


@functools.lru_cache(maxsize=4096)  # the same peers and proxies come back request after request
def _parse_ip(text: str) -> IPAddress | None:
    """An address from one hop as proxies write it: ``1.2.3.4``, ``1.2.3.4:80``, ``::1``,
    ``[::1]``, ``[::1]:80``, quoted or not. IPv4-mapped IPv6 becomes IPv4. None when the
    text is not an address (``unknown``, an obfuscated ``_node`` name, garbage)."""
    s = text.strip().strip('"').strip()
    if s.startswith("["):
        end = s.find("]")
        if end < 0:
            return None
        s = s[1:end]
    elif s.count(":") == 1:  # IPv4 with a port; bare IPv6 has at least two colons
        s = s.split(":", 1)[0]
    try:
        ip = ipaddress.ip_address(s)
    except ValueError:
        return None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


def parse_x_forwarded_for(values: Iterable[str]) -> list[str]:
    """The hops of every ``X-Forwarded-For`` field, left (client) to right (nearest proxy);
    several fields count as one comma-separated list (RFC 9110 field combination)."""
    hops: list[str] = []
    for value in values:
        hops.extend(part.strip() for part in value.split(","))
    return hops


def parse_forwarded_for(values: Iterable[str]) -> list[str]:
    """The ``for=`` parameters of every ``Forwarded`` (RFC 7239) element, in order. An element
    without ``for=`` counts as an unknown hop, so counting hops from the right stays right."""
    hops: list[str] = []
    for value in values:
        for element in value.split(","):
            found = "unknown"
            for pair in element.split(";"):
                name, sep, val = pair.partition("=")
                if sep and name.strip().lower() == "for":
                    found = val.strip()
            hops.append(found)
    return hops


class TrustedProxies:
    """The proxies allowed to say who the client is, by count or by address.

    - ``count=N``: every request passes through exactly N proxies that each append the
      address they saw; the client is the N-th hop from the right. A request with fewer hops
      did not come through the proxies as promised, and its peer address is used.
    - ``cidrs=[...]``: the header is read only when the socket peer is inside one of these
      networks; hops are then walked from the right, skipping trusted ones, and the first
      untrusted address is the client. A hop that is not an address ends the walk at the
      last trusted hop.

    ``header`` is ``"x-forwarded-for"`` (default) or ``"forwarded"`` (RFC 7239). Bad input
    (a malformed CIDR, a count < 1, both or neither of count and cidrs) raises
    [`InvalidInputError`][redcount.errors.InvalidInputError] here, at start-up. Immutable, so thread-safe.
    """

    def __init__(
        self, count: int | None = None, *, cidrs: Iterable[str] | None = None, header: Header = "x-forwarded-for"
    ) -> None:
        if (count is None) == (cidrs is None):
            raise InvalidInputError("TrustedProxies needs either count=N or cidrs=[...], not both or neither")
        if count is not None and (not isinstance(count, int) or isinstance(count, bool) or count < 1):
            raise InvalidInputError(f"TrustedProxies count must be an int >= 1, got {count!r}")
        if count is not None and count > _MAX_HOPS:
            raise InvalidInputError(f"TrustedProxies count must be <= {_MAX_HOPS}, got {count}")
        networks: list[IPNetwork] = []
        if cidrs is not None:
            if isinstance(cidrs, str):
                cidrs = [c for c in cidrs.split(",") if c.strip()]
            for c in cidrs:
                if not isinstance(c, str):
                    raise InvalidInputError(f"trusted proxy CIDR must be a str, got {type(c).__name__}")
                try:
                    networks.append(ipaddress.ip_network(c.strip(), strict=True))
                except ValueError as e:
                    raise InvalidInputError(f"malformed trusted proxy CIDR {c!r}: {e}") from None
            if not networks:
                raise InvalidInputError("TrustedProxies cidrs is empty; pass None to trust no proxy")
        if header not in ("x-forwarded-for", "forwarded"):
            raise InvalidInputError(f"TrustedProxies header must be 'x-forwarded-for' or 'forwarded', got {header!r}")
        self.count = count
        self.networks: tuple[IPNetwork, ...] = tuple(networks)
        self.header: Header = header

    @classmethod
    def coerce(cls, value: TrustedProxies | int | str | Sequence[str] | None) -> TrustedProxies | None:
        """The forms a config value takes: None or 0 (trust nobody), an int (a count), a
        comma-separated string or a list of CIDRs, or a [`TrustedProxies`][redcount.web.identity.TrustedProxies]."""
        if value is None or value == 0 or value == "" or isinstance(value, TrustedProxies):
            return value or None  # type: ignore[return-value]
        if isinstance(value, bool):
            raise InvalidInputError(f"trusted proxies must be a count or CIDRs, got {value!r}")
        if isinstance(value, int):
            return cls(value)
        if isinstance(value, str) and value.strip().isdigit():
            return cls(int(value))
        return cls(cidrs=value)

    def _trusted(self, ip: IPAddress) -> bool:
        return any(ip.version == net.version and ip in net for net in self.networks)

    def client(self, peer: IPAddress, hops: list[str]) -> IPAddress:
        """The client's address, given the socket peer and the header's hops."""
        if self.count is not None:
            if len(hops) < self.count or len(hops) > _MAX_HOPS:
                return peer
            found = _parse_ip(hops[-self.count])
            return found if found is not None else peer
        if not self._trusted(peer):
            return peer
        last = peer
        for hop in reversed(hops[-_MAX_HOPS:]):
            ip = _parse_ip(hop)
            if ip is None:
                return last
            if not self._trusted(ip):
                return ip
            last = ip
        return last

    def __repr__(self) -> str:
        what = f"count={self.count}" if self.count is not None else f"cidrs={[str(n) for n in self.networks]}"
        return f"TrustedProxies({what}, header={self.header!r})"


_PEER_CACHE = 4096  # peers whose canonical text is kept; the cache is cleared when full


class ClientIdentity:
    """Turns a socket peer and the request's forwarding headers into a client key.

    ``trusted``: None (default: the peer address, headers ignored) or [`TrustedProxies`][redcount.web.identity.TrustedProxies].
    ``ipv6_prefix``: IPv6 clients are grouped by this prefix length (64 puts a whole /64,
    what one subscriber usually gets, under one key; 128, the default, keys each address).
    Its settings are immutable and its cache of canonical peer texts is a dict that is only
    read, set or cleared whole (atomic under the GIL), so thread-safe.
    """

    def __init__(self, trusted: TrustedProxies | None = None, *, ipv6_prefix: int = 128) -> None:
        if not isinstance(ipv6_prefix, int) or isinstance(ipv6_prefix, bool) or not 1 <= ipv6_prefix <= 128:
            raise InvalidInputError(f"ipv6_prefix must be an int from 1 to 128, got {ipv6_prefix!r}")
        self.trusted = trusted
        self.ipv6_prefix = ipv6_prefix
        self._peers: dict[str, str] = {}

    @property
    def header(self) -> str | None:
        """The forwarding header to read (lower case), or None when no proxy is trusted."""
        return self.trusted.header if self.trusted is not None else None

    def resolve(self, peer: str | None, header_values: Sequence[str] = ()) -> str:
        """The client key for a request from ``peer`` carrying these values of [`header`][redcount.web.identity.ClientIdentity.header].
        A peer that is not an IP address (a Unix socket, a test client) is returned as is,
        or as ``"unknown"`` when absent."""
        if not peer:
            return "unknown"
        if self.trusted is None or not header_values:
            # The peer alone decides: its canonical text is cached (a web server sees the same
            # few peers, proxies or clients, over and over; parsing is most of the cost).
            known = self._peers.get(peer)
            if known is None:
                known = self._resolve(peer, ())
                if len(self._peers) >= _PEER_CACHE:
                    self._peers.clear()
                self._peers[peer] = known
            return known
        return self._resolve(peer, header_values)

    def _resolve(self, peer: str, header_values: Sequence[str]) -> str:
        ip = _parse_ip(peer)
        if ip is None:
            return peer
        if self.trusted is not None and header_values:
            parse = parse_x_forwarded_for if self.trusted.header == "x-forwarded-for" else parse_forwarded_for
            ip = self.trusted.client(ip, parse(header_values))
        if isinstance(ip, ipaddress.IPv6Address) and self.ipv6_prefix < 128:
            return str(ipaddress.IPv6Network((ip, self.ipv6_prefix), strict=False))
        return str(ip)
