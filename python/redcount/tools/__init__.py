"""The ``redcount`` command's tools: ``demo``, ``bench``, ``accuracy`` and ``abuse``.

They live apart from the public API (``redcount`` itself) and are run as ``redcount <tool>``
or ``python -m redcount <tool>``; see :mod:`redcount.tools.cli`. Their functions are not
part of the stable API.
"""
