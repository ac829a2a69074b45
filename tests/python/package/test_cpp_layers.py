"""The C++ core's include graph points down its layers: a file under ``cpp/src/<layer>/`` or
``cpp/include/redcount/<layer>/`` includes ``redcount/<other>/...`` headers of lower layers
(or its own) only. Read from the ``#include`` lines, nothing is compiled.

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

INCLUDE = re.compile(r'^\s*#\s*include\s+"redcount/([a-z_]+)/[^"]+"', re.MULTILINE)


def layer_of(path: Path) -> str | None:
    """The layer a source or header belongs to (None: outside the layered tree, such as
    cpp/src/open_store.cpp, which opens either store and so sits above them all)."""
    rel = path.relative_to(ROOT).parts
    if rel[:2] == ("cpp", "src") and len(rel) > 3:
        return rel[2]
    if rel[:3] == ("cpp", "include", "redcount") and len(rel) > 4:
        return rel[3]
    return None


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
        for included in INCLUDE.findall(path.read_text()):
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


if __name__ == "__main__":
    for f, own, inc in crossings():
        print(f"{f} ({own}) -> {inc}")
    sys.exit(0)
