"""Hot-key sampling: which storage keys a process's counters and limiters touch most.

```python
hk = redcount.HotKeys(capacity=1000)
store = redcount.connect("redis://localhost:6379/0", hot_keys=hk)
...                                   # counters and limiters on `store`, unchanged
for k in hk.top(10):
    print(k.key, k.count, k.error)    # the true count is in [count - error, count]
```

A Space-Saving top-K (Metwally, Agrawal and El Abbadi, 2005) in the C++ core: at most
``capacity`` keys are kept, whatever the traffic. With ``N = total``, every count is an upper
bound, ``error <= N / capacity``, and every key whose true count exceeds ``N / capacity`` is in
the table; while fewer than ``capacity`` distinct keys were seen, counts are exact
(``error == 0``).
"""

from __future__ import annotations

from . import _core
from ._core import HotKey
from ._wrap import bind_fast_paths

__all__ = ["HotKey", "HotKeys"]


class HotKeys:
    """A bounded top-K of keys by count (Space-Saving).

    ``capacity``: keys kept (1..1,000,000; default 1000); memory stays bounded by it.
    Pass it to [`redcount.connect`][redcount.store.connect] (``hot_keys=``) to observe every request's storage
    key, or call [`observe`][redcount.hot_keys.HotKeys.observe] yourself. Thread-safe; a forked child starts empty.
    """

    _core: _core.HotKeys

    def __init__(self, capacity: int = 1000) -> None:
        self._core = _core.HotKeys(capacity)
        bind_fast_paths(self, HotKeys, self._core, ("observe", "top"))

    def observe(self, key: str | bytes, n: int = 1) -> None:
        """Count ``n`` (1..2**40) occurrences of ``key`` (non-empty). Bad input raises
        [`InvalidInputError`][redcount.errors.InvalidInputError] and counts nothing."""
        self._core.observe(key, n)

    def top(self, n: int = 10) -> list[HotKey]:
        """Up to ``n`` keys by estimated count, descending (ties by key)."""
        return self._core.top(n)

    def reset(self) -> None:
        """Forget every key and the total."""
        self._core.reset()

    @property
    def total(self) -> int:
        """The weight of every observation since creation or [`reset`][redcount.hot_keys.HotKeys.reset]."""
        return self._core.total

    @property
    def capacity(self) -> int:
        return self._core.capacity

    def __len__(self) -> int:
        return len(self._core)

    def __repr__(self) -> str:
        return f"HotKeys(capacity={self.capacity}, total={self.total}, keys={len(self)})"
