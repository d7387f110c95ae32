"""``calibrate probe`` pins the real llama.cpp server's slots: the server's own ``/slots`` says so.

While a short probe runs (3 of the shared server's 4 slots, a small budget), the test polls the
server's ``/slots``, which lists, for each slot busy with a request, its task id, prompt tokens and
``n_predict``. The decode phase's requests are the tasks with its prompt length and output tokens;
the phases run one after the other, so ordered by when they were first seen the first task is
``decode.1``'s, the next two ``decode.2``'s, and so on. Each ``decode.N`` must have held exactly
slots ``0 .. N-1``, and every isolated prompt and the mixed phase's decoder slot 0: what the
server reports, whatever the load (no timing is asserted). Left to itself, the server of this
test was seen to put the decode phases on those slots too, but the isolated prompts on all four.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from simpy_llm.calibrate.probe import ISOLATED_OUTPUT_TOKENS, run_probe_async
from simpy_llm.observe.llamacpp import LlamaCppServer
from simpy_llm.workload.traces import read_trace_v2

pytestmark = pytest.mark.real_server

PARALLEL = 3
"""Slots the probe measures: decode sizes 1, 2 and 3."""

BUDGET_S = 30.0
"""The probe's budget: the smallest designs, every decode size included (a size above 1 is cut only
when the budget is spent before it, and the decode phase comes second)."""

POLL_S = 0.01
"""Pause between two reads of ``/slots``, s (a decode request lasts tens of steps)."""


async def _poll_slots(url: str, stop: asyncio.Event, seen: list[dict[str, Any]]) -> None:
    """Read ``/slots`` until *stop*, appending each busy slot's (poll, slot, task, prompt tokens,
    n_predict) to *seen*."""
    async with aiohttp.ClientSession() as session:
        poll = 0
        while not stop.is_set():
            async with session.get(url + "/slots") as resp:
                slots = await resp.json(content_type=None)
            for s in slots:
                if s.get("is_processing"):
                    seen.append({"poll": poll, "slot": s["id"], "task": s["id_task"], "prompt": s["n_prompt_tokens"],
                                 "n_predict": s["params"]["n_predict"]})
            poll += 1
            await asyncio.sleep(POLL_S)


def test_the_probes_decode_phases_run_on_the_slots_they_were_pinned_to(llamacpp_server: LlamaCppServer, tmp_path: Path):
    """Every ``decode.N`` of a probe of the real server ran on slots 0..N-1, one request each, and
    every isolated prompt and the mixed phase's decoder on slot 0, as the server's ``/slots``
    reported them while they ran."""
    seen: list[dict[str, Any]] = []

    async def go() -> Any:
        stop = asyncio.Event()
        poller = asyncio.create_task(_poll_slots(llamacpp_server.url, stop, seen))
        try:
            return await run_probe_async(
                llamacpp_server.url, tmp_path / "probe", server_type="llamacpp",
                server_config={"server": llamacpp_server.config.server_block()}, max_seconds=BUDGET_S, parallel=PARALLEL,
            )
        finally:
            stop.set()
            await poller

    result = asyncio.run(go())
    design = result.statistics["design"]
    trace = read_trace_v2(tmp_path / "probe" / "trace")
    assert trace.header["probe"]["pinned_slots"]["decode.N"] == "0..N-1"
    sizes = sorted(int(c.split(".")[1]) for c in set(trace.frame["client_id"]) if c.startswith("decode."))
    assert sizes[:2] == [1, 2]

    first_seen: dict[int, int] = {}
    slot_of: dict[int, set[int]] = {}
    for s in seen:
        if s["n_predict"] == design["decode_output_tokens"] and s["prompt"] == design["decode_prompt_tokens"]:
            first_seen.setdefault(s["task"], s["poll"])
            slot_of.setdefault(s["task"], set()).add(s["slot"])
    tasks = sorted(first_seen, key=lambda t: (first_seen[t], t))
    assert len(tasks) == sum(sizes), "every decode request was seen on a slot"
    assert all(len(slot_of[t]) == 1 for t in tasks)
    start = 0
    for n in sizes:
        group = tasks[start:start + n]
        assert sorted(next(iter(slot_of[t])) for t in group) == list(range(n)), f"decode.{n}"
        start += n

    isolated = {s["slot"] for s in seen if s["n_predict"] == ISOLATED_OUTPUT_TOKENS}
    assert isolated == {0}
    if design["mixed_joiner_lengths"] and "mixed.decoder" in set(trace.frame["client_id"]):
        mixed = {s["slot"] for s in seen if s["n_predict"] == design["mixed_decoder_tokens"]
                 and s["prompt"] != design["decode_prompt_tokens"]}
        assert mixed == {0}
