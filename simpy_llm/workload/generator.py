"""The workload generator process: clients' arrivals merged into one Store.

Each client draws its inter-arrival gaps and its prompt and output lengths in
vectors (chunks of :data:`CHUNK`) from its own named random streams
(``workload/<client>/arrival``, ``.../input``, ``.../output``), so a client's
requests do not depend on the other clients. The generator merges the
clients' arrival times, numbers requests in arrival order, and puts each into
its output Store at its arrival time.
"""

from __future__ import annotations

import heapq
from collections.abc import Generator, Iterator
from typing import TYPE_CHECKING

import numpy as np
import simpy

from simpy_llm.entities import Request
from simpy_llm.workload.distributions import to_tokens

if TYPE_CHECKING:
    from simpy_llm.wire import Wire
    from simpy.events import Event

    from simpy_llm.config.schema import ClientConfig, WorkloadConfig
    from simpy_llm.metrics.recorder import Recorder
    from simpy_llm.rng import RandomStreams

__all__ = ["CHUNK", "WorkloadGenerator", "client_arrivals"]

CHUNK = 4096
"""Requests drawn per vector draw and client."""


def client_arrivals(
    client: ClientConfig, rate: float, streams: RandomStreams
) -> Iterator[tuple[float, int, int]]:
    """Endless ``(arrival_s, prompt_tokens, output_tokens)`` for one client at *rate* requests/s.

    Examples
    --------
    >>> from simpy_llm.config.schema import ClientConfig
    >>> from simpy_llm.workload.arrivals import PoissonArrivals
    >>> from simpy_llm.workload.distributions import Constant
    >>> from simpy_llm.rng import RandomStreams
    >>> c = ClientConfig(id="a", rate_fraction=1.0, arrival=PoissonArrivals(),
    ...                  input_distribution=Constant(value=10), output_distribution=Constant(value=5))
    >>> it = client_arrivals(c, 2.0, RandomStreams(0))
    >>> t, p, o = next(it)
    >>> (p, o), t > 0
    ((10, 5), True)
    """
    arrival_rng = streams.stream(f"workload/{client.id}/arrival")
    input_rng = streams.stream(f"workload/{client.id}/input")
    output_rng = streams.stream(f"workload/{client.id}/output")
    for times in client.arrival.times(arrival_rng, rate, CHUNK):
        n = len(times)
        prompts = to_tokens(client.input_distribution.sample(input_rng, n))
        outputs = to_tokens(client.output_distribution.sample(output_rng, n))
        yield from zip(times.tolist(), prompts.tolist(), outputs.tolist())


class WorkloadGenerator:
    """Puts the workload's requests into *outbox* at their arrival times.

    Parameters
    ----------
    env
        The SimPy environment.
    config
        The workload.
    streams
        Random streams.
    outbox
        Store receiving each request as it arrives.
    recorder
        Told of each arrival.
    """

    def __init__(
        self,
        env: simpy.Environment,
        config: WorkloadConfig,
        streams: RandomStreams,
        outbox: Wire | simpy.Store,
        recorder: Recorder,
    ) -> None:
        self.env = env
        self.config = config
        self.streams = streams
        self.outbox = outbox
        self.recorder = recorder
        self.generated = 0
        self.done = False
        """True once the last request has been generated."""
        self.process = env.process(self._run())

    def _run(self) -> Generator[Event, None, None]:
        """Emit requests in arrival order.

        Yields
        ------
        Timeout
            Until the next arrival.
        """
        cfg = self.config
        env = self.env
        total = sum(c.rate_fraction for c in cfg.clients)
        sources = []
        heap: list[tuple[float, int, int, int]] = []
        for i, client in enumerate(cfg.clients):
            if client.rate_fraction <= 0:
                continue
            it = client_arrivals(client, cfg.aggregate_rate * client.rate_fraction / total, self.streams)
            sources.append((client, it))
            t, p, o = next(it)
            heap.append((t, len(sources) - 1, p, o))
        heapq.heapify(heap)
        limit = cfg.num_requests if cfg.num_requests is not None else -1
        horizon = cfg.horizon_s if cfg.horizon_s is not None else float("inf")
        put = self.outbox.put
        on_arrival = self.recorder.on_arrival
        n = 0
        while n != limit:
            t, ci, prompt, output = heap[0]
            if t > horizon:
                break
            client, it = sources[ci]
            nt, np_, no = next(it)
            heapq.heapreplace(heap, (nt, ci, np_, no))
            yield env.timeout(t - env.now)
            req = Request(
                id=n,
                client_id=client.id,
                tenant_id=client.tenant_id or client.id,
                slo_class=client.slo_class,
                prompt_tokens=prompt,
                output_tokens=output,
                arrival_s=env.now,
            )
            n += 1
            self.generated = n
            on_arrival(req, env.now)
            put(req)
        self.done = True
