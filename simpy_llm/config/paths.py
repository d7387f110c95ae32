"""Relative file paths in a scenario are relative to the scenario file.

:func:`load_scenario` sets the base directory while it structures a file;
config classes with a path field convert it with :func:`resolve_path`, so the
stored path works whatever the current directory is later. Built in Python
(no file), paths are relative to the current directory.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar
from pathlib import Path

__all__ = ["base_dir", "resolve_path"]

_BASE_DIR: ContextVar[Path | None] = ContextVar("scenario_base_dir", default=None)


def resolve_path(path: str) -> str:
    """*path* made absolute against the scenario's directory (or left as given outside loading).

    >>> resolve_path("/data/x.csv")
    '/data/x.csv'
    """
    if not isinstance(path, str):
        return path  # the type check reports it
    base = _BASE_DIR.get()
    p = Path(path)
    if p.is_absolute() or base is None:
        return path
    return str(base / p)


@contextlib.contextmanager
def base_dir(directory: str | Path) -> Iterator[None]:
    """Resolve relative paths against *directory* inside the block."""
    token = _BASE_DIR.set(Path(directory))
    try:
        yield
    finally:
        _BASE_DIR.reset(token)
