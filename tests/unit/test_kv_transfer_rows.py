"""The recorder's KV transfers (``Recorder.on_kv_transfer``) and their results
(:class:`~simpy_llm.serving.disaggregation_results.KvTransferResults`): flat doubles that the
garbage collector never walks, read back exactly and in request-id order."""

from __future__ import annotations

import gc

from hypothesis import given
from hypothesis import strategies as st

from simpy_llm.metrics.recorder import Recorder
from simpy_llm.serving.disaggregation_results import KvTransferResults

TRANSFER = st.tuples(st.integers(0, 2**40), st.integers(0, 63), st.integers(0, 63),
                     st.floats(0, 1e12, allow_nan=False), st.floats(0, 1e6, allow_nan=False),
                     st.floats(0, 1e6, allow_nan=False))


def test_transfers_leave_no_object_for_the_collector() -> None:
    """Ten thousand transfers are held as one buffer of doubles: the objects the garbage collector
    tracks do not grow with them (a tuple a transfer made every collection walk them all)."""
    rec = Recorder()
    rec.on_kv_transfer(0, 0, 1, 4096.0, 0.0, 0.01)
    before = len(gc.get_objects())
    for i in range(1, 10_000):
        rec.on_kv_transfer(i, 0, 1, 4096.0, i * 0.5, i * 0.5 + 0.01)
    assert len(gc.get_objects()) - before < 100
    assert len(rec.kv_transfers) == 60_000


@given(st.lists(TRANSFER, max_size=40))
def test_transfers_read_back_exactly_in_request_order(transfers: list[tuple]) -> None:
    """Whatever order they were recorded in, the frame holds every transfer once, exactly, sorted as
    the tuples sort (request id first), and ``starts`` gives each request's start."""
    rec = Recorder()
    for t in transfers:
        rec.on_kv_transfer(*t)
    results = KvTransferResults(rec.kv_transfers, None)
    frame = results.to_dataframe()
    rows = list(frame[list(KvTransferResults.COLUMNS)].itertuples(index=False, name=None))
    assert rows == sorted(transfers)
    assert list(frame.dtypes[:3]) == ["int64"] * 3
    assert results.starts() == {t[0]: t[4] for t in transfers}
    assert bool(results.summary()) == bool(transfers)


def test_results_taken_mid_run_let_the_recorder_grow() -> None:
    """Results read from the recorder hold their own copy: the recorder's buffer still grows when
    the run goes on after them."""
    rec = Recorder()
    rec.on_kv_transfer(1, 0, 1, 10.0, 0.0, 1.0)
    taken = KvTransferResults(rec.kv_transfers, None)
    for i in range(2, 2000):
        rec.on_kv_transfer(i, 0, 1, 10.0, 0.0, 1.0)
    assert len(taken.to_dataframe()) == 1 and len(rec.kv_transfers) == 6 * 1999
