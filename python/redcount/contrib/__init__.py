"""Adapters that let other libraries run on redcount.

- [`redcount.contrib.limits`][redcount.contrib.limits]: storages for the ``limits`` library (and so for
  Flask-Limiter and slowapi) under the ``redcount+redis://``, ``redcount+rediss://``,
  ``redcount+unix://`` and ``redcount+memory://`` schemes, and their ``async+`` twins:

  ```python
  import redcount.contrib.limits  # registers the schemes with limits
  limiter = Limiter(get_remote_address, app=app, storage_uri="redcount+redis://cache:6379/0")
  ```

Nothing here is imported by ``import redcount``: each adapter needs its library installed.
"""
