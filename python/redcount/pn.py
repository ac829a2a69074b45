"""Multi-region PN-counters.

```python
eu = redcount.PNCounter(eu_store, "stock:sku:42", "eu-west")
eu.incr(5)
eu.decr(2)
eu.merge(us_store)   # or eu.merge(us_counter): the maximum of every (region, P/N) total
eu.value()           # sum(P) - sum(N) over every region known on eu_store
```
"""

from __future__ import annotations

from typing import Union

from . import _core
from ._core import Store
from ._wrap import bind_fast_paths
from .errors import InvalidInputError

__all__ = ["PNCounter"]

_FAST_PN = ("incr", "decr", "value", "components")


class PNCounter:
    """A counter that several regions, each with its own store, update independently and
    reconcile by merging (a PN-counter CRDT).

    Each store keeps two hashes, P and N, with one field per region: that region's running
    total of increments (P) and of decrements (N). [`incr`][redcount.pn.PNCounter.incr] and [`decr`][redcount.pn.PNCounter.decr] add to the
    own region's field only (one ``HINCRBY``), so every field only grows. [`merge`][redcount.pn.PNCounter.merge]
    reads another store's fields and, in one atomic script on this store, keeps the larger
    of the two totals for every (region, P or N). [`value`][redcount.pn.PNCounter.value] is ``sum(P) - sum(N)``.

    Guarantee: merging is idempotent, commutative and associative, so once every region has
    (directly or through others) merged every other region's latest state, all regions hold
    the same fields and report the same exact value, whatever the order or repetition of
    the merges. Memory is O(regions), not O(updates).

    Not given: causal order, or read-your-writes across regions: an update is visible in
    another region only after a merge carries it there. The value may go below zero.

    Keys: ``<prefix>:pn:{<name>}:p`` and ``<prefix>:pn:{<name>}:n`` (one hash tag).
    Thread-safe.
    """

    _core: _core.PNCounter

    def __init__(self, store: Store, name: str, region: str, *, prefix: str = "redcount") -> None:
        core = _core.PNCounter(store, name, region, prefix)
        self._core = core
        bind_fast_paths(self, PNCounter, core, _FAST_PN)

    def incr(self, amount: int = 1) -> int:
        """Add ``amount`` (an int from 1 to 2**53 - 1) to this region's P; returns that P."""
        return self._core.incr(amount)

    def decr(self, amount: int = 1) -> int:
        """Add ``amount`` (an int from 1 to 2**53 - 1) to this region's N; returns that N."""
        return self._core.decr(amount)

    def value(self) -> int:
        """``sum(P) - sum(N)`` over the regions known on this store (one round trip)."""
        return self._core.value()

    def components(self) -> dict[str, tuple[int, int]]:
        """``{region: (p, n)}`` as this store holds it."""
        return self._core.components()

    def merge(self, other: Union[Store, PNCounter]) -> int:
        """Fold in the state of this counter on ``other`` (a store, or a PNCounter of the same
        name): read there, then one atomic per-field maximum here. Returns how many fields
        were raised (0 when this store already knew everything ``other`` holds)."""
        if isinstance(other, PNCounter):
            if other.name != self.name:
                raise InvalidInputError(f"cannot merge PN-counter {other.name!r} into {self.name!r}")
            return self._core.merge_components(other.components())
        return self._core.merge(other)

    def merge_components(self, components: dict[str, tuple[int, int]]) -> int:
        """Fold in ``{region: (p, n)}`` (e.g. from another region's [`components`][redcount.pn.PNCounter.components])."""
        return self._core.merge_components(components)

    def storage_keys(self) -> tuple[str, str]:
        """The P and N hashes' keys."""
        return (self._core.p_key, self._core.n_key)

    @property
    def name(self) -> str:
        return self._core.name

    @property
    def region(self) -> str:
        return self._core.region

    @property
    def prefix(self) -> str:
        return self._core.prefix

    @property
    def store(self) -> Store:
        return self._core.store

    def __repr__(self) -> str:
        return f"PNCounter(name={self.name!r}, region={self.region!r}, store={self.store.url!r})"
