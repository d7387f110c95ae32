"""Stop criteria of a benchmark run, and the observer's hooks a benchmark uses."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from simpy_llm.observe.bench.run import ERROR_WINDOW, _EndedWindow
from simpy_llm.observe.client import ObservedRequest
from simpy_llm.observe.run import observe


def _gen(records: dict[int, ObservedRequest]) -> Any:
    return SimpleNamespace(records=records)


def test_the_error_window_follows_the_order_of_ends_not_of_sends() -> None:
    """The window holds the last 20 requests to end: five failures that ended last count, even
    though they were sent first."""
    n = ERROR_WINDOW + 5
    records = {i: ObservedRequest(request_id=i, status="error" if i < 5 else "ok", done_s=float(n - i)) for i in range(n)}
    assert _EndedWindow(_gen(records)).error_share() == 5 / ERROR_WINDOW


def test_the_error_window_takes_requests_as_they_end() -> None:
    """A request still in flight at one look is counted at a later look, once it has ended;
    cancelled requests never count."""
    records = {0: ObservedRequest(request_id=0, status="pending"), 1: ObservedRequest(request_id=1, status="ok", done_s=1.0)}
    window = _EndedWindow(_gen(records))
    assert window.error_share() == 0.0
    records[0].status, records[0].done_s = "timeout", 2.0
    records[2] = ObservedRequest(request_id=2, status="cancelled", done_s=3.0)
    assert window.error_share() == 0.5


def test_observe_refuses_header_keys_it_writes_itself(tmp_path: Path) -> None:
    """Extra header keys may not replace the observer's own (``server``, ``seed``, ...): refused
    before anything is sent (nothing listens at the URL)."""
    spec = tmp_path / "wl.yaml"
    spec.write_text("aggregate_rate: 1.0\nnum_requests: 1\nclients: [{id: a, rate_fraction: 1.0}]\n")
    with pytest.raises(ValueError, match="header keys seed, server are written by the observer itself"):
        observe(spec, "http://127.0.0.1:9", tmp_path / "out", header={"server": {}, "seed": 1, "mine": 2})
