"""The garbage collector during a load-generation run: young collections only
(:mod:`simpy_llm.observe.collector`)."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Iterator
from typing import Any

import pytest

from simpy_llm.observe.client import OpenAIClient
from simpy_llm.observe.collector import NO_FULL_COLLECTIONS, young_collections_only
from simpy_llm.observe.loadgen import LoadGenerator
from tests.observe.fake_server import serve


@pytest.fixture
def full_collections() -> Iterator[list[int]]:
    """The generations of the collections that run meanwhile (full: 2)."""
    seen: list[int] = []

    def note(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            seen.append(info["generation"])

    gc.collect()
    gc.callbacks.append(note)
    try:
        yield seen
    finally:
        gc.callbacks.remove(note)


def _keep_many() -> list[list[int]]:
    """Objects that survive the young collections, as a run's records do: twice what makes a full
    collection due (a quarter of the oldest generation), and more."""
    return [[i] for i in range(len(gc.get_objects(generation=2)) // 2 + 100_000)]


def test_objects_that_survive_set_off_a_full_collection_outside_the_block(full_collections: list[int]) -> None:
    """The reference case: keeping that many objects outside the block makes a full collection run."""
    kept = _keep_many()
    assert 2 in full_collections
    del kept


def test_no_full_collection_runs_in_the_block_and_the_collector_is_as_before_after(full_collections: list[int]) -> None:
    """Inside the block the same objects set off young collections only; afterwards the
    thresholds and the freeze count are what they were."""
    before = gc.get_threshold()
    with young_collections_only() as held:
        kept = _keep_many()
    assert held and 2 not in full_collections and 0 in full_collections
    assert gc.get_threshold() == before and gc.get_freeze_count() == 0
    del kept


def test_a_program_that_froze_objects_itself_keeps_its_collector() -> None:
    """With objects frozen by the program, the block changes nothing (and says so)."""
    gc.freeze()
    try:
        count, before = gc.get_freeze_count(), gc.get_threshold()
        with young_collections_only() as held:
            assert gc.get_threshold() == before
        # Neither unfrozen (0) nor frozen again (more): frozen objects that other threads of the
        # test process release meanwhile may only lower the count.
        assert not held and 0 < gc.get_freeze_count() <= count
    finally:
        gc.unfreeze()


def test_a_load_generator_runs_young_collections_only_while_it_sends() -> None:
    """While a run sends (seen from its trace writer as rows come), the oldest generation's
    threshold holds off full collections; after the run it is back."""
    thresholds: list[int] = []

    class Writer:
        columns = ("request_id",)

        def write_row(self, row: dict[str, Any]) -> None:
            thresholds.append(gc.get_threshold()[2])

    async def go() -> None:
        async with serve() as fake, OpenAIClient(fake.url, timeout_s=5.0) as client:
            reqs = [{"arrival_time_s": i * 0.002, "input_tokens": 8, "output_tokens": 4} for i in range(5)]
            await LoadGenerator(client, reqs, Writer(), lag_threshold_s=1e9).run()

    before = gc.get_threshold()
    asyncio.run(go())
    assert thresholds == [NO_FULL_COLLECTIONS] * 5 and gc.get_threshold() == before
