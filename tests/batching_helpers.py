"""Driving one request-level batch server directly, with request sizes chosen by the test."""

from __future__ import annotations

from collections.abc import Sequence

import simpy

from simpy_llm.entities import Request
from simpy_llm.metrics.recorder import Recorder
from simpy_llm.serving.batching import BatchServer
from simpy_llm.wire import Wire


class TableService:
    """A service model whose sizes (service times, s) are given per request id; a batch
    takes its longest request's time."""

    needs_latency_model = False

    def __init__(self, sizes: Sequence[float]) -> None:
        self.sizes = list(sizes)

    def size(self, request: Request) -> float:
        return self.sizes[request.id]

    def predicted_size(self, request: Request, size: float, predictor) -> float:
        return size * predictor.factor(request)

    def batch_time_s(self, requests, sizes) -> float:
        return max(sizes)


def serve(
    config,
    arrivals_s: Sequence[float],
    sizes: Sequence[float],
    *,
    prompt_tokens: Sequence[int] | None = None,
    output_tokens: Sequence[int] | None = None,
    until_s: float | None = None,
    **server_kwargs,
) -> tuple[list[Request], Recorder, BatchServer]:
    """Send one request per arrival time (request *i* of size ``sizes[i]``) to a fresh batch
    server built from *config*; run until nothing is left to happen (or *until_s*)."""
    env = simpy.Environment()
    recorder = Recorder(num_replicas=1)
    inbox = Wire(env)
    server = BatchServer(env, 0, inbox, config, TableService(sizes), recorder, **server_kwargs)
    n = len(arrivals_s)
    prompts = prompt_tokens if prompt_tokens is not None else [10] * n
    outputs = output_tokens if output_tokens is not None else [10] * n
    requests: list[Request] = []

    def feed():
        for i, t in enumerate(arrivals_s):
            if t > env.now:
                yield env.timeout(t - env.now)
            req = Request(id=i, client_id="c", prompt_tokens=prompts[i], output_tokens=outputs[i], arrival_s=env.now)
            requests.append(req)
            recorder.on_arrival(req, env.now)
            inbox.put(req)

    env.process(feed())
    env.run(until=until_s)
    return requests, recorder, server
