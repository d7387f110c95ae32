"""Clients' networks: between the workload and the router.

A client with a ``network`` (:class:`~simpy_llm.config.schema.NetworkConfig`) sends
each prompt over its own uplink, a :class:`~simpy_llm.network.link.Link` with the
client's round trip and bandwidth: the request reaches the router half a round trip
plus its bytes' transmission after the client sent it (``prompt_tokens x
bytes_per_token`` bytes, the client's uploads in flight sharing its bandwidth
equally). Each output token reaches the client ``download_s`` after the server emits
it: half a round trip plus one token's bytes over the bandwidth. The download is a
fixed delay: a stream of tokens needs far less than a client's bandwidth (at 4 bytes a
token, 1 Mbit/s carries 31,000 tokens a second), so the downlink never queues. Seed
000 §10 adds the whole response's bytes to the E2E instead; streamed tokens arrive as
they are made, so only the last one's bytes count here.

The records keep the server's view (``arrival_s`` is when the request reached the
router) and carry ``upload_s`` and ``download_s``; the client's TTFT is the server's
plus both, and so is its E2E (``docs/network.md``).

Requests of a client without a network (and replayed trace requests whose
``client_id`` names no client with one) pass straight through, in the same instant.

A network may have faults (``LinkFaults``: jitter, loss with retransmission, outages). A
request its uplink drops never reaches the server: it is recorded as dropped, with the
reason ``network_loss`` or ``network_outage`` and ``upload_s`` NaN.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING

from simpy_llm.network.link import Link
from simpy_llm.wire import Wire

if TYPE_CHECKING:
    import numpy as np
    import simpy

    from simpy_llm.config.schema import NetworkConfig
    from simpy_llm.entities import Request
    from simpy_llm.metrics.recorder import Recorder
    from simpy_llm.network.link import Message

__all__ = ["ClientNetwork"]


class ClientNetwork:
    """The uplinks of the clients that have a network, between *sent* and *arrivals*.

    Parameters
    ----------
    env
        The SimPy environment.
    sent
        Wire the workload generator and the session registry put requests into when
        their clients send them (this component becomes its handler).
    arrivals
        Wire the router reads: each request is put there when it reaches the server.
    recorder
        Told of each request's arrival at the server.
    networks
        Network of each client that has one, by client id.
    streams
        ``streams(name)`` gives the random stream of the link *name* (needed when a network
        has jitter or loss).
    dropped
        Wire receiving the requests their uplink dropped (loss beyond the retransmissions
        allowed, an outage in drop mode), recorded as drops (e.g. the completions Wire, so
        sessions see them); None: they are only recorded.

    Examples
    --------
    >>> import simpy
    >>> from simpy_llm.config.schema import NetworkConfig
    >>> from simpy_llm.entities import Request
    >>> from simpy_llm.metrics.recorder import Recorder
    >>> env = simpy.Environment()
    >>> sent, arrivals = Wire(env), Wire(env)
    >>> reached = []
    >>> arrivals.connect(lambda r: reached.append((env.now, r.upload_s)))
    >>> net = ClientNetwork(env, sent, arrivals, Recorder(), {"far": NetworkConfig(rtt_ms=80.0)})
    >>> _ = sent.put(Request(id=0, client_id="far", prompt_tokens=100, output_tokens=5, arrival_s=0.0))
    >>> _ = sent.put(Request(id=1, client_id="near", prompt_tokens=100, output_tokens=5, arrival_s=0.0))
    >>> env.run()
    >>> reached
    [(0, 0.0), (0.04, 0.04)]
    """

    def __init__(
        self,
        env: simpy.Environment,
        sent: Wire,
        arrivals: Wire,
        recorder: Recorder,
        networks: dict[str, NetworkConfig],
        streams: Callable[[str], np.random.Generator] | None = None,
        dropped: Wire | None = None,
    ) -> None:
        self.env = env
        self.arrivals = arrivals
        self.recorder = recorder
        self.networks = dict(networks)
        self.dropped = dropped
        delivered, lost = Wire(env), Wire(env)
        self.uplinks: dict[str, Link] = {}
        """Each networked client's uplink, by client id."""
        for cid, net in sorted(self.networks.items()):
            name = f"client/{cid}/up"
            rng = streams(name) if net.random and streams is not None else None
            self.uplinks[cid] = Link(
                env, delivered, name=name, rtt_s=net.rtt_ms / 1e3, bandwidth_bytes_per_s=net.bandwidth_bytes_per_s,
                rng=rng, dropped=lost, **net.link_faults(),
            )
        self.uploading: dict[int, Request] = {}
        """Requests sent and not yet at the server, by id."""
        sent.connect(self._send)
        delivered.connect(self._deliver)
        lost.connect(self._lost)

    def _send(self, req: Request) -> None:
        link = self.uplinks.get(req.client_id)
        if link is None:
            self.recorder.on_arrival(req, self.env.now)
            self.arrivals.put(req)
            return
        self.uploading[req.id] = req
        link.put(req, req.prompt_tokens * self.networks[req.client_id].bytes_per_token)

    def _deliver(self, message: Message) -> None:
        req: Request = message.payload
        now = self.env.now
        del self.uploading[req.id]
        req.upload_s = now - req.arrival_s
        req.arrival_s = now
        req.download_s = self.networks[req.client_id].download_s
        self.recorder.on_arrival(req, now)
        self.arrivals.put(req)

    def _lost(self, message: Message) -> None:
        """The uplink dropped *message*: its request never reaches the server; it is recorded
        as dropped (``network_loss`` or ``network_outage``) where it was sent."""
        req: Request = message.payload
        now = self.env.now
        del self.uploading[req.id]
        req.upload_s = math.nan
        req.dropped_reason = f"network_{message.dropped_reason}"
        self.recorder.on_arrival(req, now)
        self.recorder.on_drop(req)
        self.recorder.on_departure(now)
        if self.dropped is not None:
            self.dropped.put(req)
