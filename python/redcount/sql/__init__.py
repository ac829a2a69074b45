"""Sharded counters and SQL: snapshots, the flusher that writes them, reconciliation and restore.

```python
from redcount.sql import Flusher, SnapshotStore, reconcile, restore

with Flusher(store, "sqlite:///counters.db", counters=[likes]) as flusher:
    flusher.drain()
SnapshotStore("sqlite:///counters.db").total("likes:post:987")
reconcile(store, "sqlite:///counters.db", "likes:post:987").ok
restore(store, "sqlite:///counters.db", "likes:post:987")      # after data loss
```

The same names are exported by [`redcount`][redcount]. Importing this package does not import
SQLAlchemy (``pip install 'redcount[sql]'``); a [`SnapshotStore`][redcount.sql.snapshots.SnapshotStore] does, when it first
opens its database.

- [`redcount.sql.snapshots`][redcount.sql.snapshots]: [`SnapshotStore`][redcount.sql.snapshots.SnapshotStore], the tables and their reads;
- [`redcount.sql.flusher`][redcount.sql.flusher]: [`Flusher`][redcount.sql.flusher.Flusher], delta logs applied to the snapshots exactly once;
- [`redcount.sql.reconciliation`][redcount.sql.reconciliation]: [`reconcile`][redcount.sql.reconciliation.reconcile], live values against the snapshots;
- [`redcount.sql.restoration`][redcount.sql.restoration]: [`restore`][redcount.sql.restoration.restore], shards rebuilt from SQL after data loss.
"""

from __future__ import annotations

from .flusher import Flusher, FlusherStats, Lag
from .reconciliation import Report, reconcile
from .restoration import RestoreReport, restore
from .snapshots import SnapshotStore, StreamId

__all__ = [
    "Flusher",
    "FlusherStats",
    "Lag",
    "Report",
    "RestoreReport",
    "SnapshotStore",
    "StreamId",
    "reconcile",
    "restore",
]
