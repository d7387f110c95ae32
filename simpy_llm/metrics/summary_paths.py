"""Paths into a run's :class:`~simpy_llm.metrics.summary.Summary`: which name a figure.

The planner's objective and constraints name summary figures by dotted path
(``latency_s.ttft.p95``); the loader checks them with :func:`summary_metric_path`.
"""

from __future__ import annotations

import types
import typing
from typing import Any

from simpy_llm.metrics.summary import Summary

__all__ = ["summary_metric_path"]


def summary_metric_path(path: str) -> str:
    """Why *path* is not a numeric leaf of :class:`~simpy_llm.metrics.summary.Summary`
    ("" when it is). Open-ended levels (per class, per replica) take any key.

    >>> summary_metric_path("latency_s.ttft.p95"), summary_metric_path("goodput.by_class.chat.fraction")
    ('', '')
    >>> summary_metric_path("latency_s.ttft.p42")
    "unknown summary metric 'latency_s.ttft.p42': 'p42' is not one of count, mean, p50, p90, p95, p99"
    """
    tp: Any = Summary
    parts = path.split(".")
    for i, part in enumerate(parts):
        tp = _without_none(tp)
        if typing.is_typeddict(tp):
            hints = typing.get_type_hints(tp)
            if part not in hints:
                return f"unknown summary metric {path!r}: {part!r} is not one of {', '.join(sorted(hints))}"
            tp = hints[part]
            if typing.get_origin(tp) is typing.NotRequired:
                tp = typing.get_args(tp)[0]
        elif typing.get_origin(tp) is dict:
            tp = typing.get_args(tp)[1]
        elif typing.get_origin(tp) is list:
            if not part.isdigit():
                return f"unknown summary metric {path!r}: {'.'.join(parts[:i])} is a list; index it by number"
            tp = typing.get_args(tp)[0]
        else:
            return f"unknown summary metric {path!r}: {'.'.join(parts[:i])} is a number"
    tp = _without_none(tp)
    if tp not in (int, float):
        return f"summary metric {path!r} is not a number; name one of its figures"
    return ""


def _without_none(tp: Any) -> Any:
    args = [a for a in typing.get_args(tp) if a is not type(None)]
    if typing.get_origin(tp) in (typing.Union, types.UnionType) and len(args) == 1:
        return args[0]
    return tp
