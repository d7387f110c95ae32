"""Command-line values the observer's commands share (``simpy-llm observe``, ``simpy-llm bench
run``): argparse ``type=`` functions that say what they take when a value is refused."""

from __future__ import annotations

import argparse

__all__ = ["byte_count", "connection_cap"]


def byte_count(text: str) -> int:
    """``--prepare-bytes``: a whole number >= 0 of bytes, with an optional K, M or G (powers of 1024).

    >>> byte_count("600M"), byte_count("4096"), byte_count("1g")
    (629145600, 4096, 1073741824)
    """
    units = {"k": 2**10, "m": 2**20, "g": 2**30}
    body = text.strip().lower()
    scale = units.get(body[-1:], 1)
    if scale != 1:
        body = body[:-1]
    if not body.isdigit():
        raise argparse.ArgumentTypeError(f"must be a whole number of bytes >= 0, optionally with K, M or G, got {text!r}")
    return int(body) * scale


def connection_cap(text: str) -> int | None:
    """``--max-connections``: a whole number >= 1, or ``none`` for no cap.

    >>> connection_cap("64"), connection_cap("none")
    (64, None)
    """
    if text.strip().lower() == "none":
        return None
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number >= 1 or none, got {text!r}")
    return value
