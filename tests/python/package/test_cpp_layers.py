"""The C++ core's include graph points down its layers: a file under ``cpp/src/<layer>/`` or
``cpp/include/redcount/<layer>/`` includes ``redcount/<other>/...`` headers of lower layers
(or its own) only. Read from the ``#include`` lines, nothing is compiled.

The Redis layer is split the same way inside: ``redis/io`` (one server: engine, connections,
RESP, transports, the resolver, the Target interface) under ``redis/topology`` (cluster and
ring router, Sentinel follower, command keys) under the store facade in ``redis/`` itself.

Run as a script to print every include that crosses a layer::

    python tests/python/package/test_cpp_layers.py
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]

# Lower number = lower layer. Layers of one rank (redis and memory, counters and limiters)
# are siblings: neither includes the other.
RANK = {
    "common": 0,
    "store": 1,
    "redis": 2,
    "memory": 2,
    "counters": 3,
    "limiters": 3,
    "sharded": 4,
    "crdt": 5,
}

INCLUDE = re.compile(r'^\s*#\s*include\s+"redcount/([a-z_]+)/(?:([a-z_]+)/)?[^"/]+"', re.MULTILINE)

# Inside the Redis layer, lower number = lower part; "" is the store facade at its top.
REDIS_RANK = {"io": 0, "topology": 1, "": 2}


def layer_of(path: Path) -> str | None:
    """The layer a source or header belongs to (None: outside the layered tree, such as
    cpp/src/open_store.cpp, which opens either store and so sits above them all)."""
    rel = path.relative_to(ROOT).parts
    if rel[:2] == ("cpp", "src") and len(rel) > 3:
        return rel[2]
    if rel[:3] == ("cpp", "include", "redcount") and len(rel) > 4:
        return rel[3]
    return None


def redis_part_of(path: Path) -> str:
    """The part of the Redis layer a file under it belongs to ("" for the facade)."""
    rel = path.relative_to(ROOT).parts
    inner = rel[3:] if rel[:2] == ("cpp", "src") else rel[4:]
    return inner[0] if len(inner) > 1 else ""


def crossings() -> list[tuple[str, str, str]]:
    """(file, its layer, the included layer) for every include of a header of a higher
    layer or of a sibling layer."""
    bad: list[tuple[str, str, str]] = []
    files = [*ROOT.glob("cpp/src/**/*.[ch]*"), *ROOT.glob("cpp/include/redcount/**/*.h")]
    for path in sorted(files):
        own = layer_of(path)
        if own is None:
            continue
        assert own in RANK, f"{path.relative_to(ROOT)}: layer '{own}' is not in the layer order"
        for included, part in INCLUDE.findall(path.read_text()):
            if included == own == "redis":
                mine = redis_part_of(path)
                assert mine in REDIS_RANK, f"{path.relative_to(ROOT)}: redis/{mine} is not a part of the layer"
                assert part in REDIS_RANK, f"{path.relative_to(ROOT)} includes redis/{part}/: not a part"
                if REDIS_RANK[part] > REDIS_RANK[mine]:
                    bad.append((str(path.relative_to(ROOT)), f"redis/{mine}", f"redis/{part}"))
                continue
            if included == own:
                continue
            assert included in RANK, f"{path.relative_to(ROOT)} includes redcount/{included}/: not a layer"
            if RANK[included] >= RANK[own]:
                bad.append((str(path.relative_to(ROOT)), own, included))
    return bad


def test_includes_point_down_the_layers() -> None:
    bad = crossings()
    assert not bad, "\n".join(f"{f} ({own}) includes a {inc} header" for f, own, inc in bad)


def test_the_check_sees_the_tree() -> None:
    # Guards against a check that passes because it read nothing.
    assert layer_of(ROOT / "cpp/src/store/hot_keys.cpp") == "store"
    assert layer_of(ROOT / "cpp/include/redcount/common/errors.h") == "common"
    assert len(list(ROOT.glob("cpp/src/*/*.cpp"))) > 40
    assert redis_part_of(ROOT / "cpp/src/redis/io/engine.cpp") == "io"
    assert redis_part_of(ROOT / "cpp/include/redcount/redis/topology/cluster.h") == "topology"
    assert redis_part_of(ROOT / "cpp/src/redis/redis_store.cpp") == ""
    assert (ROOT / "cpp/src/redis/io/engine.cpp").exists()
    assert (ROOT / "cpp/include/redcount/redis/topology/cluster.h").exists()


if __name__ == "__main__":
    for f, own, inc in crossings():
        print(f"{f} ({own}) -> {inc}")
    sys.exit(0)
