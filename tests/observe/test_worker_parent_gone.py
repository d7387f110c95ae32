"""A load worker whose parent is gone stops sending instead of piling up records."""

from __future__ import annotations

import multiprocessing

from simpy_llm.observe.client import ObservedRequest, OpenAIClient
from simpy_llm.observe.loadgen import LoadRequest
from simpy_llm.observe.workers import _ForwardingGenerator


def test_a_worker_whose_parent_is_gone_stops_and_keeps_no_records() -> None:
    """Flushing records into a pipe whose other end (the parent's) is closed stops the worker's
    run and leaves no batch behind to be sent again (and again, growing) at the next flush."""
    parent, child = multiprocessing.Pipe()
    parent.close()
    gen = _ForwardingGenerator(child, OpenAIClient("http://127.0.0.1:1"), [LoadRequest(0, 0.0, 8, 2)], None)
    gen._out.append(ObservedRequest(request_id=0, status="ok"))
    gen.flush()
    assert gen._out == [] and gen._stop.is_set()
    child.close()
