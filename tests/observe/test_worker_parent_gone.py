"""A load worker whose parent is gone stops sending instead of piling up records."""

from __future__ import annotations

import multiprocessing

from simpy_llm.observe.client import ObservedRequest, OpenAIClient
from simpy_llm.observe.loadgen import LoadRequest
from simpy_llm.observe.workers import _ForwardingGenerator, _pack, _Sender


def test_a_worker_whose_parent_is_gone_stops_and_keeps_no_records() -> None:
    """Records flushed into a pipe whose other end (the parent's) is closed mark the sender broken
    (its callback called once); the next flush stops the worker's run and leaves no batch behind
    to be sent again (and again, growing) at the next flush."""
    parent, child = multiprocessing.Pipe()
    parent.close()
    calls: list[str] = []
    sender = _Sender(child, on_broken=lambda: calls.append("broken"))
    gen = _ForwardingGenerator(sender, OpenAIClient("http://127.0.0.1:1"), [LoadRequest(0, 0.0, 8, 2)], None)
    gen._out.append(_pack(ObservedRequest(request_id=0, status="ok")))
    gen.flush()
    sender.send(("done",))
    sender.close()  # every message written (or dropped) by now
    assert sender.broken and calls == ["broken"]
    gen._out.append(_pack(ObservedRequest(request_id=1, status="ok")))
    gen.flush()
    assert gen._out == [] and gen._stop.is_set()
    child.close()


def test_a_worker_sends_its_messages_in_order_as_tuples_the_parent_makes_records_of() -> None:
    """What the sender thread writes arrives in the order given, and a record packed as a tuple
    is made again field for field."""
    parent, child = multiprocessing.Pipe()
    sender = _Sender(child)
    rec = ObservedRequest(request_id=7, status="ok", sent_s=1.5, chunk_times_s=[1.6, 1.7], attempt_statuses=[200])
    for i in range(50):
        sender.send(("ended", i, [_pack(rec)] * 300))  # each larger than a pipe holds
    sender.send(("done",))
    got = [parent.recv() for _ in range(51)]
    sender.close()
    assert [m[1] for m in got[:50]] == list(range(50)) and got[50] == ("done",)
    assert ObservedRequest(*got[0][2][0]) == rec
    parent.close()
    child.close()
