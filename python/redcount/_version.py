"""The package's version: its one place. ``redcount.__version__``, ``redcount --version``, the
distribution's metadata (pyproject.toml reads this file) and CMake's project version all come
from the line below."""

__version__ = "0.1.0"
