"""The ``redcount`` command's tools: ``demo``, ``bench``, ``accuracy`` and ``abuse``.

They live apart from the public API (``redcount`` itself) and are run as ``redcount <tool>``
or ``python -m redcount <tool>``; see `redcount.tools.cli`. ``bench`` is a package
(`redcount.tools.bench`); the private redis-servers the tools start (and the test
suite's fixtures) come from `redcount.tools.servers`. Their functions are not part of
the stable API.
"""
