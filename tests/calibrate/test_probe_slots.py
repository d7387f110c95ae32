"""The probe pins a llama.cpp server's slots (``id_slot``) and no other server's.

The probe runs against a fake OpenAI-compatible server that answers at once (a few
milliseconds per token) and keeps every request body it receives: each body's ``id_slot`` is
checked against the request's phase as the trace names it (``client_id``), by the request id
the body's ``user`` carries. That the real server runs a pinned request on that slot is
``tests/real/test_probe_slots_live.py``.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from simpy_llm.calibrate.probe import PINNED_SLOTS, run_probe_async
from simpy_llm.calibrate.probe_estimate import ProbeError
from simpy_llm.workload.traces import read_trace_v2

SLOTS = 3
"""The fake server's slots as the probe is told them."""

LLAMACPP_BLOCK: dict[str, Any] = {
    "server": {"type": "llamacpp", "model": "m", "n_parallel": SLOTS, "ctx_per_slot": 1024, "n_ctx": SLOTS * 1024,
               "cache_prompt": True, "kv_unified": False, "n_batch": 2048, "n_ubatch": 512, "cache_ram_mib": 8192}
}
"""A llama.cpp server block as the project's launcher writes it: every phase (restore too) runs."""


def _fake_app(bodies: list[dict[str, Any]]) -> web.Application:
    """A server that keeps each completion body in *bodies* and streams ``max_tokens`` tokens,
    3 ms plus 50 µs per prompt token to the first and 2 ms apart, counting a prompt's tokens as its
    words plus a start token (``/tokenize`` too)."""

    async def models(_request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "m", "object": "model"}]})

    async def tokenize(request: web.Request) -> web.Response:
        body = await request.json()
        return web.json_response({"tokens": [0] * (len(body["content"].split()) + 1)})

    async def template(request: web.Request) -> web.Response:
        body = await request.json()
        return web.json_response({"prompt": body["messages"][0]["content"]})

    async def complete(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        bodies.append(body)
        chat = "messages" in body
        text = body["messages"][0]["content"] if chat else body["prompt"]
        usage = {"prompt_tokens": len(text.split()) + 1, "completion_tokens": body["max_tokens"],
                 "total_tokens": len(text.split()) + 1 + body["max_tokens"], "prompt_tokens_details": {"cached_tokens": 0}}
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await asyncio.sleep(0.003 + 50e-6 * usage["prompt_tokens"])
        for i in range(body["max_tokens"]):
            last = i == body["max_tokens"] - 1
            choice: dict[str, Any] = {"index": 0, "finish_reason": "length" if last else None}
            choice.update({"delta": {"content": "a "}} if chat else {"text": "a "})
            chunk: dict[str, Any] = {"object": "chat.completion.chunk" if chat else "text_completion", "choices": [choice]}
            if last:
                chunk["usage"] = usage
            await resp.write(f"data: {json.dumps(chunk)}\n\n".encode())
            if not last:
                await asyncio.sleep(0.002)
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    app = web.Application()
    app.router.add_get("/v1/models", models)
    app.router.add_post("/tokenize", tokenize)
    app.router.add_post("/apply-template", template)
    app.router.add_post("/v1/completions", complete)
    app.router.add_post("/v1/chat/completions", complete)
    return app


def _probe(tmp_path: Path, **kwargs: Any) -> tuple[list[dict[str, Any]], dict[str, Any], dict[int, str]]:
    """Probe the fake server: the bodies it received, the trace header and each request's phase.
    What the fake's times estimate is not the subject: a trace they give no profile from (a
    :class:`ProbeError` once every request is written) serves as well."""
    bodies: list[dict[str, Any]] = []

    async def go() -> None:
        async with TestServer(_fake_app(bodies), host="127.0.0.1") as server:
            try:
                await run_probe_async(str(server.make_url("")).rstrip("/"), tmp_path / "probe", max_seconds=20.0, seed=1,
                                      **kwargs)
            except ProbeError as exc:
                assert "the probe's requests are in" in str(exc)

    asyncio.run(go())
    trace = read_trace_v2(tmp_path / "probe" / "trace")
    phases = {int(r.request_id): str(r.client_id) for r in trace.frame.itertuples(index=False)}
    return bodies, trace.header, phases


def _by_phase(bodies: list[dict[str, Any]], phases: dict[int, str]) -> dict[str, list[int | None]]:
    """Each phase's ``id_slot`` values (``None``: not sent), in the order the requests were sent."""
    out: dict[str, list[int | None]] = {}
    for body in bodies:
        rid = int(body["user"].rsplit("/", 1)[1])
        out.setdefault(phases[rid], []).append(body.get("id_slot"))
    return out


@pytest.mark.parametrize("api", ["completions", "chat"])
def test_a_llamacpp_probe_pins_each_phase_to_its_slots(tmp_path, api):
    """Against a llama.cpp server every ``decode.N`` sends its N requests to slots 0..N-1, one each;
    warm-up, isolated, the mixed decoder and the extension phase go to slot 0, the mixed joiners to
    the last slot; the restore phase's prompt and extension go to slot 0 and its fills to slots
    0..N-1, one each; the header records the plan."""
    bodies, header, phases = _probe(tmp_path, api=api, server_type="llamacpp", server_config=LLAMACPP_BLOCK)
    slots = _by_phase(bodies, phases)
    decode = {name: ids for name, ids in slots.items() if name.startswith("decode.")}
    assert sorted(decode) == [f"decode.{n}" for n in range(1, SLOTS + 1)]
    for name, ids in decode.items():
        assert sorted(ids) == list(range(int(name.split(".")[1])))  # type: ignore[type-var]
    for name in ("warm_up", "isolated", "mixed.decoder", "extension.base", "extension"):
        assert slots[name] and set(slots[name]) == {0}, name
    assert slots["mixed.joiner"] and set(slots["mixed.joiner"]) == {SLOTS - 1}
    assert {name: sorted(ids) for name, ids in slots.items() if name.startswith("restore")} == {  # type: ignore[type-var]
        "restore.base": [0], "restore.fill": list(range(SLOTS)), "restore": [0]}
    assert header["probe"]["pinned_slots"] == PINNED_SLOTS


def test_the_pinned_slots_follow_the_parallel_given(tmp_path):
    """``parallel=2`` on a server of three slots: decode sizes 1 and 2 on slots {0} and {0, 1}, and the
    mixed joiners on slot 1, the last of the two measured."""
    bodies, _, phases = _probe(tmp_path, server_type="llamacpp", server_config=LLAMACPP_BLOCK, parallel=2)
    slots = _by_phase(bodies, phases)
    assert {name: sorted(ids) for name, ids in slots.items() if name.startswith("decode.")} == {  # type: ignore[type-var]
        "decode.1": [0], "decode.2": [0, 1]}
    assert set(slots["mixed.joiner"]) == {1}


def test_other_servers_get_no_slot(tmp_path):
    """Against a vLLM server no request names a slot (nor asks for llama.cpp's prompt cache), and the
    header says nothing was pinned."""
    bodies, header, _ = _probe(tmp_path, server_type="vllm", server_config={"server": {"type": "vllm", "max_num_seqs": SLOTS}})
    assert len(bodies) > 10
    assert not any("id_slot" in b or "cache_prompt" in b for b in bodies)
    assert header["probe"]["pinned_slots"] is None


def test_a_llamacpp_probe_refuses_more_slots_than_the_server_has(tmp_path):
    """``parallel=4`` against a llama.cpp server block of three slots is refused before any request,
    naming both counts: a request pinned to slot 3 would have no slot to run on."""
    bodies: list[dict[str, Any]] = []

    async def go() -> None:
        async with TestServer(_fake_app(bodies), host="127.0.0.1") as server:
            await run_probe_async(str(server.make_url("")).rstrip("/"), tmp_path / "probe", server_type="llamacpp",
                                  server_config=LLAMACPP_BLOCK, parallel=4, seed=1)

    with pytest.raises(ProbeError, match=r"parallel 4 exceeds the llama.cpp server's 3 slots"):
        asyncio.run(go())
    assert bodies == []
