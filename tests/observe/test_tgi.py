"""Hugging Face text-generation-inference (TGI) as a server type: the header's ``server`` block
from its ``/info``, its chat stream (every chunk with the assistant role, a separate usage chunk),
and its Prometheus names in the calibrator's time-series comparison. The server is a fake that
answers as TGI's router does."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiohttp import web

from simpy_llm.calibrate.timeseries import scraped_series
from simpy_llm.config import ScenarioError
from simpy_llm.observe.run import observe
from simpy_llm.observe.scrape import read_metrics
from simpy_llm.observe.server_info import load_server_config, tgi_settings
from simpy_llm.workload.traces import read_trace_v2
from tests.observe.fake_server import FakeServer, serve_instance
from tests.observe.fake_thread import in_thread

INFO: dict[str, Any] = {
    "model_id": "org/tiny-tgi",
    "model_sha": None,
    "model_pipeline_tag": "text-generation",
    "max_concurrent_requests": 128,
    "max_best_of": 2,
    "max_stop_sequences": 4,
    "max_input_tokens": 1024,
    "max_total_tokens": 2048,
    "validation_workers": 2,
    "max_client_batch_size": 4,
    "router": "text-generation-router",
    "version": "3.0.1",
    "sha": None,
    "docker_label": None,
}
"""A TGI 3.x ``/info`` body (the batch settings moved out of it in 3.0)."""
PROMPT_TOKENS = 17


class FakeTGI(FakeServer):
    """Answers as TGI's router: ``/info``, ``/health``, ``/metrics`` with TGI's gauges, and chat
    streams whose every chunk carries ``role: assistant`` and content (no role-only first chunk),
    the last one ``finish_reason``, then with ``stream_options.include_usage`` a chunk of
    ``usage`` and no choices."""

    def __init__(self, info: dict[str, Any] = INFO) -> None:
        super().__init__()
        self.info = info
        self.scrapes = 0

    def app(self) -> web.Application:
        app = super().app()
        app.router.add_get("/info", self.get_info)
        app.router.add_get("/health", self.get_health)
        app.router.add_get("/metrics", self.get_metrics)
        return app

    async def get_info(self, request: web.Request) -> web.Response:
        return web.json_response(self.info)

    async def get_health(self, request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def get_metrics(self, request: web.Request) -> web.Response:
        self.scrapes += 1
        text = (
            "# HELP tgi_queue_size Current queue size\n# TYPE tgi_queue_size gauge\n"
            f"tgi_queue_size {self.scrapes % 3}\n"
            "# HELP tgi_batch_current_size Current batch size\n# TYPE tgi_batch_current_size gauge\n"
            "tgi_batch_current_size 2\n"
            "# HELP tgi_batch_current_max_tokens Maximum tokens for the current batch\n"
            "# TYPE tgi_batch_current_max_tokens gauge\ntgi_batch_current_max_tokens 300\n"
        )
        return web.Response(text=text, content_type="text/plain")

    async def chat(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        n = int(body["max_tokens"])
        base = {"id": "", "object": "chat.completion.chunk", "created": 0, "model": self.info["model_id"],
                "system_fingerprint": "3.0.1-native"}
        if not body.get("stream"):
            return web.json_response({**base, "object": "chat.completion", "choices": [
                {"index": 0, "message": {"role": "assistant", "content": "w " * n}, "finish_reason": "length"}],
                "usage": {"prompt_tokens": PROMPT_TOKENS, "completion_tokens": n, "total_tokens": PROMPT_TOKENS + n}})
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for i in range(n):
            choice = {"index": 0, "delta": {"role": "assistant", "content": "w "}, "logprobs": None,
                      "finish_reason": "length" if i == n - 1 else None}
            await resp.write(f"data: {json.dumps({**base, 'choices': [choice], 'usage': None})}\n\n".encode())
        if body.get("stream_options", {}).get("include_usage"):
            usage = {"prompt_tokens": PROMPT_TOKENS, "completion_tokens": n, "total_tokens": PROMPT_TOKENS + n}
            await resp.write(f"data: {json.dumps({**base, 'choices': [], 'usage': usage})}\n\n".encode())
        await resp.write(b"data: [DONE]\n\n")
        return resp


def _workload(tmp_path: Path, n: int = 5) -> Path:
    constant = {"type": "constant", "params": {"value": 6}}
    data = {"version": "1", "seed": 2, "aggregate_rate": 50.0, "num_requests": n, "clients": [
        {"id": "c", "arrival": {"process": "poisson"}, "input_distribution": constant, "output_distribution": constant}]}
    path = tmp_path / "workload.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.fixture(scope="module")
def tgi_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One observe run against the fake TGI with --server-type tgi, scraping its metrics."""
    tmp = tmp_path_factory.mktemp("tgi")
    fake = FakeTGI()
    with in_thread(lambda: serve_instance(fake)):
        observe(_workload(tmp), fake.url, tmp / "run", server_type="tgi", scrape_metrics=fake.url + "/metrics",
                scrape_interval_s=0.02, timeout_s=10.0)
    return tmp / "run"


def test_the_tgi_block_is_discovered_from_info(tgi_run: Path) -> None:
    """The header's server block holds /info's model id, concurrency and token limits and version
    (listed as discovered), and null for the batch settings TGI 3 no longer reports."""
    server = read_trace_v2(tgi_run / "trace").header["server"]
    assert (server["type"], server["model"], server["max_concurrent_requests"], server["max_input_tokens"],
            server["max_total_tokens"], server["version"]) == ("tgi", "org/tiny-tgi", 128, 1024, 2048, "3.0.1")
    assert server["discovered"] == ["model", "max_concurrent_requests", "max_input_tokens", "max_total_tokens", "version"]
    assert server["max_batch_total_tokens"] is None and server["waiting_served_ratio"] is None


def test_the_tgi_stream_is_read_with_its_usage_chunk(tgi_run: Path) -> None:
    """TGI's chat stream (content from the first chunk on, usage in a chunk of its own): the
    server's counts are the row's, its first chunk is its first token, and every event counts."""
    rows = read_trace_v2(tgi_run / "trace").frame
    assert set(rows.status) == {"ok"} and set(rows.prompt_tokens_source) == {"usage"}
    assert set(rows.input_tokens) == {PROMPT_TOKENS} and set(rows.output_tokens) == {6}
    assert (rows.first_chunk_time_us == rows.first_token_time_us).all()
    assert set(rows.num_chunks) == {7}  # six tokens and the usage chunk


def test_tgi_gauges_are_the_compared_queue_and_batch(tgi_run: Path) -> None:
    """The calibrator reads tgi_queue_size as the queue depth and tgi_batch_current_size as the
    running batch; TGI has no KV-cache fraction, so that series is absent."""
    series = scraped_series(read_metrics(tgi_run / "metrics.csv"))
    assert sorted(series) == ["queue_depth", "running_batch"]
    assert (series["queue_depth"].metric, series["running_batch"].metric) == ("tgi_queue_size", "tgi_batch_current_size")
    assert set(series["running_batch"].value.tolist()) == {2.0}


def test_info_before_tgi_2_gives_its_older_names() -> None:
    """A TGI 1.x /info (max_input_length, and the batch settings) fills the same keys."""
    old = {"model_id": "m", "max_concurrent_requests": 64, "max_input_length": 1000, "max_total_tokens": 1512,
           "waiting_served_ratio": 1.2, "max_batch_total_tokens": 32000, "max_waiting_tokens": 20,
           "max_batch_size": None, "version": "1.4.0"}
    assert tgi_settings(old) == {"model": "m", "max_concurrent_requests": 64, "max_input_tokens": 1000,
                                 "max_total_tokens": 1512, "max_batch_total_tokens": 32000, "max_waiting_tokens": 20,
                                 "waiting_served_ratio": 1.2, "version": "1.4.0"}


def test_bad_tgi_settings_in_a_server_config_are_named() -> None:
    """A server config's TGI keys are checked: counts whole numbers >= 1, the ratio a number > 0,
    each problem named by its key path."""
    with pytest.raises(ScenarioError) as info:
        load_server_config({"server": {"type": "tgi", "max_concurrent_requests": 0, "waiting_served_ratio": -1}})
    text = str(info.value)
    assert "server.max_concurrent_requests: must be a whole number >= 1, got 0" in text
    assert "server.waiting_served_ratio: must be a number > 0, got -1" in text
