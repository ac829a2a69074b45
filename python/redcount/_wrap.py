"""How the public classes wrap their ``_core`` object (they hold it; they do not subclass it).

A sync and an async class can then share one core object. A plain Python method in front
of each C++ call would put a Python frame on every call, which is most of the cost of a
call on the memory store. So each public class keeps documented, typed methods (what
``help()``, the docs and mypy see) and, per instance, `bind_fast_paths` stores the
core's bound methods in the instance ``__dict__``: an instance attribute shadows a method of
the class, so ``limiter.hit(...)`` goes straight to C++. A subclass that overrides one of
those methods keeps its override (it is not shadowed).
"""

from __future__ import annotations

from collections.abc import Iterable


def bind_fast_paths(obj: object, base: type, core: object, names: Iterable[str]) -> None:
    """Store ``core.<name>`` in ``obj.__dict__`` for each ``name`` that ``type(obj)`` does
    not override (``base`` is the class whose documented method forwards to the core)."""
    cls = type(obj)
    d = vars(obj)
    for name in names:
        if cls is base or getattr(cls, name) is getattr(base, name):
            d[name] = getattr(core, name)
