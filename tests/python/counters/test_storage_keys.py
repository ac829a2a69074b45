"""The storage keys of counters: every key of one business key (each window's, the request-id
key, the sliding counter's) in one Redis Cluster slot, and escaping that keeps distinct
business keys distinct."""

from __future__ import annotations

import binascii

import pytest
import redcount


def _slot(key: str) -> int:
    """Redis Cluster's hash slot of `key` (CRC16/XMODEM of its hash tag, if it has one)."""
    start = key.find("{")
    if start >= 0:
        end = key.find("}", start + 1)
        if end > start + 1:
            key = key[start + 1 : end]
    return binascii.crc_hqx(key.encode(), 0) % 16384


# A business key starting with '}' must not make the hash tag empty: its window, next
# window, request-id and sliding keys stay in one cluster slot (else CROSSSLOT).
@pytest.mark.parametrize("key", ["}", "}abc", "}}", "\\}x", "\\", "a}b", "{x}", "plain"])
def test_every_key_of_one_business_key_shares_one_slot(key: str) -> None:
    clock = redcount.ManualClock(1_700_000_000.0)
    store = redcount.connect("memory://", clock=clock)
    counter = redcount.FixedWindowCounter(store, "c", 60)
    sliding = redcount.SlidingWindowCounter(store, "s", 60)
    keys = [counter.storage_key(key)]
    counter.incr(key, request_id="r1")
    clock.advance(60)
    keys.append(counter.storage_key(key))
    keys.append(counter.storage_key(key) + ":rid:r1")  # the request-id key's layout (docs/fixed-windows.md)
    keys.extend(sliding.storage_keys(key))
    assert len({_slot(k) for k in keys}) == 1, keys
    assert counter.incr(key, request_id="r1") == 1 and counter.incr(key, request_id="r1") == 1
    store.close()


def test_escaping_keeps_distinct_business_keys_distinct() -> None:
    store = redcount.connect("memory://")
    counter = redcount.FixedWindowCounter(store, "c", 60)
    names = ["}a", "\\}a", "\\\\}a", "a", "\\a"]
    assert len({counter.storage_key(n) for n in names}) == len(names)
    for i, n in enumerate(names):
        counter.incr(n, i + 1)
    assert [counter.get(n) for n in names] == [1, 2, 3, 4, 5]
    store.close()
